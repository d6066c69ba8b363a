// Package packstore is the packfile storage engine: collections (16-byte
// IDs) of records (16-byte IDs, opaque bytes) stored as checksummed frames
// in one global append stream of shard files, found through a lossy fanout
// index per collection, and compacted by a caller-scheduled repack. It knows
// nothing about Matrix. This comment specifies the on-disk format, field
// by field, with hex examples the tests pin; the StorageEngine interface
// (engine.go) is the API.
//
// # Files
//
// A store is a directory of shard files named shard-NNNNN.mtdb, where NNNNN
// is the pack ID (0..4095) in five decimal digits. Shards are created as
// shard-NNNNN.mtdb.tmp, fsynced and renamed, then the directory is fsynced,
// so a published shard always has a complete header; Open deletes leftover
// .tmp files. A new shard takes the lowest pack ID no shard holds (one a
// retired shard freed, or the next unused), so at most 4,096 shards exist
// at a time however long the store lives; its place in the stream is its
// sequence number (header, below), not its pack ID. A shard file
// whose header is bad (empty, short, zero-filled, damaged) and that holds
// no acknowledged data (no checkpoint or delta entry names a synced frame
// in it, and a checkpoint decodes or the file has nothing past a header) is
// renamed to NAME.quarantined-UNIXNANO and listed in OpenReport.Quarantined;
// with acknowledged data at stake the bad header fails Open (ErrCorrupt).
//
// Open creates the directory 0700 and every file 0600 (Options.Perm
// widens both, say to 0640/0750): shards hold private rooms' events. It does
// not change an existing store's modes, but lists a directory or file that
// grants more than Options.Perm in OpenReport.Warnings.
//
// LOCK holds the decimal pid of the process that has the store open, and
// that process holds an exclusive flock(2) on it from the start of Open to
// Close: one process per store. A second Open (in any process) fails with
// ErrLocked naming the pid, before it reads, truncates or deletes anything.
// The kernel drops the flock when the holder dies, so a stale LOCK file
// never blocks; the pid in it is informational only.
//
// All integers are little-endian. All checksums are CRC-32C (Castagnoli,
// hash/crc32), stored as u32 little-endian.
//
// # Shard header (HeaderSize = 4096 bytes)
//
//	offset  size  field
//	     0     4  magic "MTDB" (4d 54 44 42)
//	     4     1  format version, 0x06 (0x05 and 0x04 still read)
//	     5     1  reserved, 0
//	     6     2  pack ID (u16), equal to the file name's
//	     8     8  creation time (u64, unix nanoseconds)
//	    16     4  feature flags (u32): bit0 FeatureNoCRC; unknown bits rejected
//	    20     4  sequence number (u32; 0x06): the shard's place in the
//	              append stream, one more than the shard before it;
//	              a 0x04/0x05 shard has none (zero padding) and its
//	              sequence number is its pack ID
//	    24  4068  zero padding (must be zero)
//	  4092     4  CRC-32C of bytes [0, 4092)
//
// Versions (FormatVersion):
//
//	0x04  first version (there is no 0x01-0x03 shard format);
//	      a reset marker has no payload: "forget every earlier frame".
//	0x05  positional reset marker (8-byte payload P, below) so that repack
//	      can write its copy before the marker; feature flag FeatureNoCRC
//	      (bit 0) for shards written in checksum mode "none".
//	0x06  pack IDs are reused: the sequence number at offset 20 orders the
//	      shards, and a reset marker's P names a sequence number instead
//	      of a pack ID (same bytes for a 0x05 shard, whose sequence
//	      number is its pack ID), so P never points into a later shard
//	      that took a retired shard's pack ID. Stores of 0x04/0x05 shards
//	      open unchanged; the shards new code adds are 0x06, and a binary
//	      that knows only 0x05 refuses them ("unsupported version 0x06").
//
// A header with another magic, version, pack ID, nonzero padding or a CRC
// mismatch is corruption (ErrCorrupt naming the file).
//
// # Frame
//
// Frames follow the header back to back. One frame (FrameOverhead = 45
// bytes of framing plus the stored payload):
//
//	offset  size  field
//	     0     4  len: bytes from flags through payload = 37 + stored payload
//	     4     1  flags: bit0 FlagZstd, bit1 FlagReset, others must be 0
//	     5     4  raw_len: uncompressed payload length
//	     9    16  collection ID
//	    25    16  record ID (zero in a reset marker)
//	    41     n  payload (n = len - 37)
//	  41+n     4  CRC-32C of bytes [0, 41+n) of the frame (len through payload)
//
// Total frame size is len + 8. Rules a decoder enforces before trusting a
// frame: 37 <= len <= MaxShardBytesLimit-4096-8; no unknown flag bits;
// without FlagZstd raw_len == n; with FlagZstd n > 0 and raw_len bounded by
// the largest payload of a shard, and the payload is a zstd stream
// (klauspost/compress) that decodes to exactly raw_len bytes. The writer
// compresses only payloads of at least 64 bytes and only when that makes the
// frame smaller. PutMany compresses at SpeedFastest without zstd's entropy
// stage (literals stored raw, sequences FSE-coded); Repack compresses the
// raw frames it copies with it. A store in checksum mode full writes the
// zstd frames without their content checksum (the frame CRC covers the
// payload); the other modes keep it. The decoder reads every variant.
//
// With the entropy stage, zstd is 52-57% of the CPU samples of bench's
// bulk write (64 MB, batches of 1000 records, half of them text), about
// half of it building a Huffman table for each record's literals and
// FSE-compressing its weights. Without it a text record takes 4.3 us
// against 12.7 us and keeps 0.54 of its raw size against 0.48: the 64 MB
// store takes 58.9 MB on disk against 56.9 (74.0 raw).
//
// # Reset marker
//
// A frame with FlagReset is a collection reset marker: no other flag,
// record ID all zero, n = raw_len = 8, payload = position P:
//
//	offset  size  field (payload)
//	     0     4  sequence number of P's shard (u32; in a 0x05 shard the
//	              same bytes were written as pack ID u16 < 4096, zero u16,
//	              which reads as the same number)
//	     4     4  offset of P (u32, >= 4096)
//
// It means "forget every frame of this collection located before P in the
// global (sequence number, offset) order". DeleteCollection writes P = the end of
// the stream at that moment (its own position). Repack first appends the
// copies of a collection's kept frames, fsyncs, and only then appends the
// marker with P = the position of the first copy, and fsyncs again: a crash
// before the marker is durable leaves the old frames plus identical copies
// (nothing lost); after it, the old frames are dead and the copies live.
// A version 0x04 marker (n = 0) is read as P = its own position.
//
// Example: marker for collection 11..11 with P = (sequence 3, offset 4096):
//
//	2d000000                          len = 45 = 37 + 8
//	02                                flags: FlagReset
//	08000000                          raw_len = 8
//	11111111111111111111111111111111  collection ID
//	00000000000000000000000000000000  record ID (zero)
//	03000000 00100000                 P: sequence 3, offset 4096
//	6bf8274c                          CRC-32C (TestMarkerHexExample)
//
// Worked example: record ID 22..22 in collection 11..11 with the raw
// payload "hi" (TestFrameHexExample pins it):
//
//	27000000                          len = 39 = 37 + 2
//	00                                flags: raw
//	02000000                          raw_len = 2
//	11111111111111111111111111111111  collection ID
//	22222222222222222222222222222222  record ID
//	6869                              payload "hi"
//	da5955bc                          CRC-32C of the 43 bytes above
//
// # Append stream and order
//
// There is one global append stream; the global order of frames is
// (sequence number, offset). When the next frame would take the active
// shard past Options.MaxShardBytes (at most MaxShardBytesLimit, just under
// 256 MiB), the shard is fsynced and sealed and the next shard is started
// with the lowest free pack ID and the next sequence number; needing a new
// shard when all 4,096 pack IDs are held is ErrShardLimit and writes
// nothing of the batch. Readers never follow a slot into a shard that took
// a retired shard's pack ID unnoticed: a read that fails or finds nothing
// while a retirement happened retries with the new index generation, and
// the node cache is keyed by (sequence number, offset). Repack
// output goes through the same stream, starting in a fresh shard, so the
// scan order is always the write order and a later frame of a record
// supersedes an earlier one.
//
// # Index slot (in memory)
//
// Each collection has a power-of-two table of u64 slots:
//
//	bits 63..40  tag: ID[8:11] as a big-endian 24-bit number
//	bits 39..28  shard: pack ID (12 bits)
//	bits 27..0   offset + 1 (28 bits); the all-zero slot is empty
//
// The home bucket is the top log2(size) bits of big-endian ID[0:8]; the tag
// uses other bits of the ID. Linear probing, empty terminates, load at most
// 75% (growth rehashes into a double-size table, re-reading each record ID
// from its frame because the slot does not hold the bucket bits; it reads
// them in location order, the heads of frames up to 4 KiB apart in one
// pread, where one pread per frame is 11-15% of bench's bulk-write CPU). A tag
// match is verified against the frame's record ID; mismatches are tag
// collisions (counted in Stats.TagCollisions). Superseding replaces the
// slot in place with one atomic 64-bit store; growth and repack publish a
// new table through an atomic.Pointer, so readers never lock the writer.
//
// # Reads
//
// Sealed shards are memory-mapped read-only (edsrzf/mmap-go) in full. The
// active shard is mapped up to its size at open; frames appended since are
// read with ReadAt, and the shard is re-mapped in full when sealed. Get
// verifies the frame CRC and that the frame's collection and record ID are
// the requested ones, and returns an owned copy.
//
// A shard file cut below its mapped size by another process (or a page the
// device cannot read) would raise SIGBUS on the next touch of a page past
// the new end, which kills a Go process. Every read of a mapping runs with
// debug.SetPanicOnFault and turns the fault into an ErrCorrupt error naming
// the shard file and offset ("reading the mapped file faulted"); the store
// stays up and records in other shards stay readable
// (TestShardTruncatedWhileMapped). Cost: BenchmarkGetCacheMiss median
// 1,114 ns/op before, 1,210 after (7 alternated runs each, ranges 1,025-
// 1,522 and 1,125-1,283, load average 1.1).
//
// # Read-ahead
//
// Options.ReadAhead picks the hint for the mappings. By default
// (ReadAheadRandom) every mapping is MADV_RANDOM: a fault on a cold page
// reads that page only, where without a hint (ReadAheadKernel) the kernel
// reads around it, up to read_ahead_kb. packstore then reads ahead only
// where the next bytes are known to be wanted: a read that starts within
// 32 KiB after the previous read of its shard asks (MADV_WILLNEED) for a
// window of 128 KiB, doubling to 1 MiB along the run; a scan at Open runs
// under MADV_SEQUENTIAL; Repack asks for the frames it will copy, sorted,
// ranges under 32 KiB apart merged.
//
// Measured with BenchmarkColdRead (2 vCPU AMD EPYC VM, virtio disk with
// read_ahead_kb 8192, ext4, kernel 6.18; load average 3.1 to 3.6; a 128
// MB store of 500 B to 3 KB random records; shard files evicted with
// posix_fadvise DONTNEED and checked empty with mincore before each
// operation; bytes from /proc/self/io read_bytes; medians of 5 rounds,
// settings alternated, two runs):
//
//	cold operation                         kernel               random
//	Get (first 20 on a cold store), each   8.7-9.5 ms, 4.1 MiB  0.15-0.16 ms, 5 KiB
//	200 records in file order (350 KB)     13-15 ms, 8 MiB      2.4-3.9 ms, 0.7 MiB
//	2000 records in file order (3.4 MB)    24-25 ms, 16 MiB     13-19 ms, 3.9 MiB
//	Open by full scan (128 MiB read)       270-360 ms           180-200 ms
//	Repack of 1/4 of the records, shuffled 506-515 ms           526-545 ms
//	Gets of an 8 MiB region, shuffled      60-64 ms, 20 MiB     212-223 ms, 8 MiB
//
// Ranges are the two runs' medians. MADV_RANDOM alone, without
// packstore's own read-ahead, took 58-85 ms for the 2000-record run and
// 2.3-2.5 s for the repack. The last row is the cost of the default:
// reads that cover much of a region in random order pay one I/O per page
// where the kernel's read-around fetched the region in a few. bench-repack
// (30 MB pool, 3 runs per setting, load 4.4 to 5.7) shows it on walks: the
// current-state walk before repack took 335 ms cold against 138 ms, the
// resolve-extremities walk after repack about 310 ms against 190-210 ms;
// the auth-chain walk after repack took 8-11 ms against 15-16 ms (44 and
// 53 ms before repack), see README "Repack locality".
//
// # Index checkpoint (index.ckpt)
//
// The whole in-memory index, written by Close, by Sync when the delta has
// grown past its limit, after a repack retired shards, and by Open after it
// had to scan. Written as index.ckpt.tmp, fsynced, renamed, directory
// fsynced (Open deletes leftover .tmp files). Layout:
//
//	offset  size  field
//	     0     4  magic "MTCK"
//	     4     1  version 0x03 (0x02 and 0x01 still read; see below)
//	     5     3  zero
//	     8     8  generation (u64); the delta must carry the same
//	    16     8  covered position C: pack u16 | zero u16 | offset u32;
//	              every frame before C is reflected, C is the end of the
//	              last listed shard
//	    24     4  shard count S (<= 4096)
//	    28     4  meta entry count E
//	    32     4  collection count N
//	    36     8  zero
//	    44     4  CRC-32C of bytes [0, 44)
//	    48  8*S   shards, ascending: pack u16 | zero u16 | covered size u32
//	         28*E meta: kind u8 (1 data frames of coll, first at off;
//	              2 reset marker for coll with position P) | zero u8 |
//	              shard u16 | coll 16 | kind 1: first frame (pack u16 |
//	              zero u16 | offset u32); kind 2: P (sequence u32 |
//	              offset u32)
//	              N collections, each (K = used slots, T = 2^bits):
//	       0    16  collection ID
//	      16     1  table bits (3..30)
//	      17     3  zero
//	      20     4  used slots K (u32)
//	      24     8  live frame bytes (u64)
//	      32   T/8  occupancy bitmap: bit i%8 of byte i/8 is set when
//	              slot i is used (0x03)
//	  32+T/8   8*K  the used slots in slot order, u64 each (0x03)
//	              (0x01/0x02 instead: at 32, all T slots, u64 each)
//	   end-4     4  CRC-32C of bytes [48, end-4)
//
// Decoding checks counts against the file size before allocating, both
// CRCs, zero fields, load <= 75%, that the used slots equal the count (the
// bitmap's set bits, 0x03), that no used slot is zero and that every slot
// points inside a listed shard's covered bytes. Open reads the file in 1
// MiB pieces on another goroutine, which checksums the body as it reads,
// and decodes each part as it arrives; a CRC mismatch at the end drops
// what was decoded.
// Example (empty store, generation 1, C = pack 0 offset 4096, one shard):
//
//	4d54434b 03 000000 0100000000000000 0000 0000 00100000
//	01000000 00000000 00000000 0000000000000000 8b73b06e
//	0000 0000 00100000 00cf8afc
//
// and a collection 11..11 with 8 slots of which slot 2 holds record 22..22
// at pack 1 offset 4096 (testdata/checkpoint.bin ends with it):
//
//	11111111111111111111111111111111 03 000000 01000000
//	2f00000000000000 04 0110001000222222
//
// (TestDeltaEntryHex pins these bytes.) Versions: 0x01 first; 0x02 (with
// shard format 0x06) reads a kind-2 position as sequence u32 | offset u32
// in the bytes 0x01 wrote as pack u16 | zero u16 | offset u32, which is the
// same number for shards before 0x06; 0x03 stores each table as its
// occupancy bitmap and used slots instead of every slot (a table is 37.5%
// to 75% full: at 49%, a 64 MB store's 2.1 MB checkpoint became 1.0 MB and
// the 2M-record one of a 1 GB store 33.6 MB became 17.0 MB), so Open reads
// half the bytes. Open reads all three; after loading 0x01 index files it
// writes a current checkpoint and delta at once, and a 0x02 checkpoint is
// replaced at the next checkpoint (Close at the latest). A binary that
// knows only 0x02 finds a 0x03 checkpoint "unsupported" and rebuilds the
// index by scanning every shard (OpenReport.CheckpointErr says so).
//
// # Index delta (index.delta)
//
// Between checkpoints, Sync appends one fixed-width entry per frame written
// since the last Sync, after fsyncing the active shard, and does not fsync
// the delta: a commit costs one device flush. The delta is fsynced when a
// shard is created (roll: the sealed shard's entries and a kind-3 entry for
// the new shard, before any frame goes into it), when 64 KiB of entries
// (deltaLazyBytes) were written since its last fsync, and with every
// checkpoint (Close, Sync past the delta limit, retirement). Entries that a
// power loss drops only cost scanning: Open scans the shard bytes past the
// last entry it can replay. Before format 0x06 (delta 0x01) Sync fsynced
// the delta too: two flushes in series per commit (measured p50 1,146 us
// against a 431 us disk floor on the development machine).
//
//	header (24 bytes): magic "MTDL" | version 0x02 | zero 3 |
//	                   generation u64 | zero u32 | CRC-32C of [0, 20)
//	entry (48 bytes):
//	offset  size  field
//	     0     1  kind: 1 data frame, 2 reset marker, 3 new shard (0x02:
//	              offset 4096, size 0, zero collection, field at 28:
//	              its sequence number u32 | zero 12)
//	     1     1  zero
//	     2     2  pack ID of the frame
//	     4     4  offset of the frame
//	     8     4  frame size (len + 8)
//	    12    16  collection ID
//	    28    16  record ID (kind 1) or P: sequence u32 | offset u32 | zero 8
//	              (version 0x01: pack u16 | zero u16 | offset u32 | zero 8,
//	              the same bytes for shards before 0x06)
//	    44     4  CRC-32C of bytes [0, 44) of the entry
//
// Example: data frame of record 22..22 in collection 11..11 at pack 0
// offset 4096, 47 bytes (TestDeltaEntryHex):
//
//	01 00 0000 00100000 2f000000 11111111111111111111111111111111
//	22222222222222222222222222222222 3e10260c
//
// # Commit latency
//
// A commit (PutMany of a few records, then Sync) costs one device flush:
// the active shard's; the delta entries are written to the page cache and
// fsynced lazily (above). strace -f -c over 1,000 steady commits of 16
// records: 1,023 fsyncs (the rest are the bulk load's, the lazy delta
// fsyncs and Close's checkpoint), 2 pwrites per commit (shard, delta).
//
// An appending write changes the file size, so its fsync or fdatasync
// also waits for an ext4 journal commit. The active shard's file therefore
// runs ahead of its frames: when an append under 64 KiB (a commit's, not a
// bulk write's or a repack's, which would write most bytes twice) reaches
// the end of the file, the writer appends written zeros up to the next
// multiple of 1 MiB (preallocStep; at most MaxShardBytes), and Sync
// fdatasyncs the shard, so
// most commits overwrite allocated bytes inside the file size and flush
// data only (an LSM reuses its WAL files for the same reason). 9,000-byte
// commits with a 768-byte write to a second file, medians of 500, five
// alternated runs, load 17-20: append + fsync 271-442 us, append +
// fdatasync 276-506 us, overwrite + fdatasync 154-178 us. The zeros are
// cut when the shard is sealed (before its fsync) and at Close, so a
// closed store's files end with their last frame. After a
// crash the zeros past the last frame are found by the scan at Open, cut
// (ReadOnly: skipped) and counted in OpenReport.ZeroTailBytes, not taken
// for a torn tail: zeros are what an unwritten tail reads as whatever made
// them, and they hold no frame. The zeros need no new format version: a
// reader that does not expect them cuts them as a torn tail.
//
// The rest of a commit's cost is CPU before the flush. A CPU profile of
// 3,000 such commits (bench's record mix, load average 10) had zstd at 30%
// of the samples, about 100 us a commit, most of it building Huffman and FSE
// tables for each small payload; fsync's kernel time 29%; table growth
// and the delta write a few percent each. Timed separately, PutMany took
// 170-200 us with compression and 36-48 us without, Sync 260-1,000 us
// (the disk's append+fdatasync floor measured 220-690 us in the same
// minutes). zstd without its entropy stage still took 130 us a commit at
// that load. So a commit (the records written between two Syncs) below
// Options.InlineCompressMin records (64 by default) that follows a commit
// also below it is written uncompressed, except its Record.Dense payloads
// (entropy-free zstd, a few microseconds each), and Repack compresses the
// uncompressed frames it copies (with the entropy stage; a payload zstd cannot shrink
// stays raw and is tried again at every repack). No format change: such a
// frame is an ordinary frame without FlagZstd, which every version reads.
//
// # Open and recovery
//
// Open validates every shard header, loads the checkpoint, replays the
// delta entries that continue it contiguously and match the frame on disk
// (same size, collection, kind and record ID), and then scans only the
// shard bytes past that point. A checkpoint that is missing, short,
// damaged, or that lists a shard which is missing or shorter on disk,
// falls back to a full scan of every shard; a delta with another
// generation is ignored; replay stops at the first bad delta entry (a torn
// tail) and the scan covers the rest. OpenReport says which path ran. None
// of these panics or loses a frame: the shards are the truth, the index
// files only save scanning.
//
// Synced bytes are not treated as a torn tail where the index files prove
// them: the shard sizes of a decodable checkpoint and the frame named by
// every CRC-valid delta entry that reached the disk, of any generation
// (syncedFloor). Since Sync writes the delta without fsyncing it, a power
// loss (not a process crash: the page cache keeps the entries) can drop
// the entries of the frames synced into the active shard since the delta's
// last fsync (at most 64 KiB of entries); those frames are then proven
// only by their own CRCs, and if the same power loss also cut them short,
// Open takes the cut for a torn tail. A shard that may hold such frames
// (the checkpoint's covered shard, or the newest shard with a kind-3 entry)
// must exist: missing, it is an ErrCorrupt error naming the file. A shard file shorter than that is an ErrCorrupt
// error from Open naming the file and both lengths; a shard file that is
// missing although a checkpoint or delta entry names a synced frame in it
// is an ErrCorrupt error naming the file (retirement writes a checkpoint
// and an empty delta without the shard before deleting it, so such a file
// was lost, not retired). Open writes nothing in either case. A delta entry whose
// frame on disk does not match it (a damaged synced frame) is still
// applied: Open succeeds, OpenReport.Damaged lists it, and reading that
// record returns ErrCorrupt naming shard file and offset.
//
// Past the last frame of a shard, zeros to the end of the file are the
// writer's preallocation ("Commit latency"): cut (ReadOnly: skipped) and
// counted in OpenReport.ZeroTailBytes. In the last shard, a bad frame
// found by the scan past the synced bytes is a torn tail when no valid
// frame starts anywhere after it (a frame running past end of file, a
// final frame with a bad CRC, a frame cut short followed by zeros): the
// file is truncated at the last good frame and fsynced, and OpenReport says
// where (TruncatedFile, TruncatedAt) and how much (TruncatedBytes). Any
// other bad frame or header is an ErrCorrupt error naming the shard file
// and offset; nothing is truncated.
// With Options.ReadOnly recovery happens in memory only: the torn tail is
// reported (OpenReport.TailNotCut) and left on disk, nothing is truncated,
// quarantined, deleted or written, and LOCK is held shared.
// Frames covered by the checkpoint are not re-read at open: damage there is
// found by the read that needs the frame (ErrCorrupt naming shard and
// offset; every other record stays readable) and by Check.
//
// # Retirement
//
// Repack deletes a shard only when (a) no collection's index references it,
// (b) it is not the active shard, and (c) for every reset marker it holds
// for a collection X with position P, no other surviving shard holds a data
// frame of X located before P (else a rebuild by scan would resurrect it;
// each shard remembers the offset of its first frame per collection;
// "before" is in (sequence number, offset) order). Only X's marker with the
// largest P in any shard counts: a rebuild drops every frame of X before
// it, all that an older marker drops, so older markers never keep a shard
// (each repack of X would otherwise pin one while an old shard holds a dead
// frame of X beside another collection's live records). Retirement runs only
// after the repack output and the active shard are fsynced, and it writes a
// checkpoint (and an empty delta) without the shards before it deletes any
// file; shards are unmapped (after in-flight reads) before deletion and the
// directory is fsynced after. Their pack IDs are then free for new shards.
// A write that needs a new shard while no pack ID is free first retires
// whatever nothing references (a repack killed before retiring leaves its
// emptied inputs behind), and fails with ErrShardLimit only if that frees
// too few.
package packstore
