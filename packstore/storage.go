// storage.go: the store's configuration (Options), the PackfileStorage
// type and its lifecycle after Open: Close, Stats and listings. Opening and
// recovery are in open.go, the write path in commit.go, collection index
// maintenance in index.go, repack and retirement in repack.go.

package packstore

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/zstd"
)

// Options configures a PackfileStorage.
type Options struct {
	// Dir holds the shard files; Open creates it if needed.
	Dir string
	// MaxShardBytes is the size at which a shard is sealed and the next one
	// started. 0 means MaxShardBytesLimit (just under 256 MiB), which is also
	// the maximum; values below 5 KiB are rejected. A record's payload must
	// fit in one shard: MaxShardBytes - HeaderSize - FrameOverhead bytes.
	MaxShardBytes int64
	// Compress stores a payload zstd-compressed when that makes its frame
	// smaller: without zstd's entropy stage as it is written, with it when
	// Repack copies a frame written uncompressed (doc.go "Frame").
	// DefaultOptions sets it; the zero Options leaves it off.
	Compress bool
	// InlineCompressMin is the fewest records a commit (the records
	// written between two Syncs) needs for Compress to apply to its
	// records as they are written: a PutMany compresses its records when
	// they and the records written since the last Sync reach it, or when
	// the previous commit did (so a bulk writer whose commits spread over
	// many collections in small PutMany calls compresses from the PutMany
	// that takes its first commit past InlineCompressMin on). In a smaller
	// commit (a homeserver persists an event at a time) only Record.Dense
	// payloads are compressed (zstd without its entropy stage); the others
	// are written uncompressed and Repack compresses the uncompressed
	// frames it copies, as an LSM compresses at flush rather than in its
	// WAL. Until a repack such records take their raw size on disk
	// (bench's mix: 1.35x its compressed size; the bundled rooms' PDUs:
	// 1.48x). Why: zstd on a 16-record commit of bench's mix cost about
	// 100 us of CPU (up to 150 us at load 10), most of it building Huffman
	// and FSE tables for each small payload, against a 200-400 us device
	// flush (doc.go "Commit latency"). 0 or 1 compresses every commit as it
	// is written (a bulk writer's choice: the mtxdb commands set 0);
	// DefaultOptions sets DefaultInlineCompressMin.
	InlineCompressMin int

	// CacheBytes bounds the node cache of decoded payloads (ristretto v2,
	// cost = payload bytes + ~96). 0 disables it; DefaultOptions sets
	// DefaultCacheBytes.
	CacheBytes int64

	// Checksum selects how frame CRCs are used (none / writeonly / full).
	// The zero value is ChecksumFull.
	Checksum ChecksumMode

	// Perm is the permission of the files the store creates (shards, index
	// files, LOCK); the directory, when Open creates it, gets Perm plus an
	// execute bit for each class that may read. 0 means 0600 (directory
	// 0700): shards hold private rooms' events, so by default only the
	// owner may read them, as PostgreSQL keeps its data directory. Set 0640
	// (or wider) to let a group read. The process umask still applies.
	// Open does not change an existing store's modes; when the directory
	// or a file in it grants more than Perm (say 0755 and 0644 from an
	// older version), OpenReport.Warnings says so and Open proceeds.
	Perm os.FileMode

	// ReadOnly opens the store without changing anything on disk, as
	// bbolt's and mdbx_chk's checks do: the directory must exist; no file is
	// created, written, truncated, renamed or deleted; shard files are
	// opened read-only. Recovery runs in memory only: a torn tail of the
	// last shard is reported in OpenReport (TruncatedAt, TruncatedBytes,
	// with TailNotCut set) and the frames before it are served, a shard
	// file that a read-write Open would quarantine is reported and skipped,
	// leftover .tmp files stay. The lock on LOCK is shared (flock LOCK_SH)
	// and never upgraded: any number of read-only opens may run together,
	// a read-write Open fails with ErrLocked while one runs, and a
	// read-only Open fails with ErrLocked while a read-write one runs (if
	// the directory has no LOCK file, none is taken). Put, PutMany,
	// DeleteCollection and Repack return ErrReadOnly; Sync and Close write
	// nothing.
	ReadOnly bool

	// ReadAhead is the access-pattern hint for the shard mappings (Linux
	// only; elsewhere no hint is given). The zero value, ReadAheadRandom,
	// is the default: MADV_RANDOM, so a cold read faults in one 4 KiB page
	// instead of the kernel's read-around, plus packstore's own bounded
	// read-ahead (128 KiB to 1 MiB windows) for forward runs of reads,
	// MADV_SEQUENTIAL while Open scans, and a prefetch of a repack's input.
	// ReadAheadKernel gives no hint. Why, measured
	// on a 2-vCPU VM whose disk has read_ahead_kb 8192 (doc.go
	// "Read-ahead"): a cold Get read about 4 MiB and took about 9 ms with
	// ReadAheadKernel, 6 KiB and 0.15 ms with ReadAheadRandom. Walks that
	// read a large part of a small store in random order are slower with
	// ReadAheadRandom (up to 2.4x in bench-repack's 30 MB pool).
	ReadAhead ReadAheadMode

	// ReleaseEvery bounds the file-backed part of the process's resident set:
	// after every ReleaseEvery frames read from the shard mappings (cache hits
	// not counted), the reading call ends with ReleaseMapped, so the pages it
	// and earlier reads mapped leave the RSS (they stay in the page cache, and
	// a later read faults them back in for about a microsecond a page). Why in
	// the engine: each fault maps up to 16 neighbouring cached pages
	// (the kernel's fault-around), so a replay of a 1M-event room that
	// released every 4,096 events still held 1.2 GB of mapped store between
	// two releases. 0 means DefaultReleaseEvery; negative never releases
	// (a server whose store fits its memory).
	ReleaseEvery int

	// PreadKinds lists read kinds (GetKind's tag) whose frames are read
	// with pread(2) into a buffer instead of through the shard mappings.
	// Through a mapping, the first touch of a page since it was written or
	// released (ReleaseEvery) costs a page fault that also maps up to 15
	// neighbouring pages (the kernel's fault-around): a few microseconds
	// for a small record read at random, where one pread of the frame
	// costs about one. Reads of the other kinds, and Get, use the
	// mappings.
	PreadKinds []ReadKind

	// raMax replaces raMaxWindow in tests and benchmarks; negative turns the
	// explicit read-ahead off (MADV_RANDOM alone).
	raMax int64

	// maxShards lowers the shard limit for tests; 0 means MaxShards.
	maxShards int
	// fs replaces the operating system's filesystem in tests; nil means osFS.
	fs vfs
}

// ChecksumMode selects how frame CRC-32Cs are written and verified.
type ChecksumMode uint8

const (
	// ChecksumFull writes a CRC in every frame and verifies it on every
	// read (Get, GetMany, View, repack copies) and on every scan. Default.
	ChecksumFull ChecksumMode = iota
	// ChecksumWriteOnly writes CRCs but does not verify them on reads;
	// scans at open (recovery) still verify them.
	ChecksumWriteOnly
	// ChecksumNone writes a zero CRC field and verifies nothing. Shards it
	// creates carry FeatureNoCRC, so recovery relies on the structural
	// checks only (a torn tail is still found when its length, flags or
	// raw_len are invalid, but a torn payload is not). Index checkpoint and
	// delta files keep their CRCs in every mode.
	ChecksumNone
)

// String returns the name of the mode: "full", "writeonly", "none".
func (m ChecksumMode) String() string {
	switch m {
	case ChecksumFull:
		return "full"
	case ChecksumWriteOnly:
		return "writeonly"
	case ChecksumNone:
		return "none"
	}
	return fmt.Sprintf("ChecksumMode(%d)", uint8(m))
}

// DefaultCacheBytes is DefaultOptions' node cache size: 64 MiB.
const DefaultCacheBytes = 64 << 20

// DefaultOptions returns the options for a store in dir: the largest shards,
// compression on (inline for batches of DefaultInlineCompressMin records or
// more), a 64 MiB node cache and checksum mode "full".
func DefaultOptions(dir string) Options {
	return Options{Dir: dir, MaxShardBytes: MaxShardBytesLimit, Compress: true, InlineCompressMin: DefaultInlineCompressMin, CacheBytes: DefaultCacheBytes}
}

// DefaultInlineCompressMin is DefaultOptions' InlineCompressMin: commits of
// 64 records or more (bulk imports) are compressed as they are written,
// smaller ones when a Repack copies them.
const DefaultInlineCompressMin = 64

// DefaultReleaseEvery is Options.ReleaseEvery's default: 1,024 frame reads
// between two ReleaseMapped calls. Replaying the generated 1M-event room, the
// mapped store held up to 123 MiB of the process's RSS at 4,096 (97 MiB at the
// moment of its peak RSS, 958 MiB) and up to 89 MiB at 1,024 (30 MiB at its
// peak, 922 MiB), at no cost in time: in alternated runs 1,024 was the faster
// at 1M (65.4 s against 69.0 s) and at 100k (5.8-6.0 s against 6.0-6.3 s).
const DefaultReleaseEvery = 1024

// compressMin is the smallest payload the writer tries to compress.
const compressMin = 64

// zstdMode picks one of the writer's zstd encoders (zstdEncoder).
type zstdMode uint8

const (
	// zstdEntropy is zstd at SpeedFastest with its entropy stage: Huffman
	// literals and FSE sequences. Repack compresses with it.
	zstdEntropy zstdMode = iota
	// zstdNoEntropy stores the literals raw (the sequences keep FSE):
	// PutMany compresses with it, Dense records and bulk batches alike.
	// On bench's text records it takes 4.3 us a record against 12.7 us
	// with the entropy stage (building a Huffman table and compressing
	// its weights for each small payload is half of a bulk write's CPU
	// with it), for 0.54 of the raw size against 0.48.
	zstdNoEntropy
)

var (
	zstdOnce sync.Once
	// zstdEncs[mode][1] writes zstd's own content checksum (xxhash64,
	// 4 bytes) into each payload, zstdEncs[mode][0] does not.
	zstdEncs [2][2]*zstd.Encoder
	zstdDec  *zstd.Decoder
	zstdErr  error
)

// codecs returns the process-wide zstd decoder, after making the encoders
// zstdEncoder returns; DecodeAll and EncodeAll are safe for concurrent use.
func codecs() (*zstd.Decoder, error) {
	zstdOnce.Do(func() {
		// SpeedFastest: ingest attempts compression on every payload of
		// compressMin bytes or more, and the default level's match
		// search dominated PutMany's CPU profile (incompressible payloads
		// pay it for nothing). The stream format is the same.
		for mode := range zstdEncs {
			for crc := range zstdEncs[mode] {
				zstdEncs[mode][crc], zstdErr = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest),
					zstd.WithNoEntropyCompression(zstdMode(mode) == zstdNoEntropy), zstd.WithEncoderCRC(crc == 1))
				if zstdErr != nil {
					return
				}
			}
		}
		zstdDec, zstdErr = zstd.NewReader(nil, zstd.WithDecoderMaxMemory(maxRawLen))
	})
	return zstdDec, zstdErr
}

// zstdEncoder returns the encoder of mode for this store. A store in
// ChecksumFull mode writes no zstd content checksum: the frame's CRC-32C,
// verified on every read, covers the compressed payload, and the 4 bytes
// are 1-2% of a compressed 500-byte record. In the other modes a read
// checks no frame CRC, and the zstd checksum is what catches a damaged
// compressed payload. Open has made the encoders (codecs).
func (s *PackfileStorage) zstdEncoder(mode zstdMode) *zstd.Encoder {
	if s.opts.Checksum == ChecksumFull {
		return zstdEncs[mode][0]
	}
	return zstdEncs[mode][1]
}

// PackfileStorage is the packfile engine: one global append stream of shard
// files, a lossy fanout index per collection and caller-scheduled repack
// (doc.go has the format).
//
// It is safe for concurrent use. Writers (Put, PutMany, DeleteCollection,
// Sync, Repack, Close, Stats, CollectionRecords) serialize on one mutex.
// Readers (Get, GetMany, Collections) never take it: they load the
// collection's published index generation atomically and read frames under
// a per-shard read lock that only unmapping (seal, retire, close) contends.
type PackfileStorage struct {
	opts      Options
	maxShards int
	maxData   int // largest payload that fits in one shard

	closed      atomic.Bool
	shards      [MaxShards]atomic.Pointer[shard] // by pack ID; nil = absent
	colls       sync.Map                         // ID -> *collection
	collisions  atomic.Uint64                    // index tag collisions seen
	mappedReads atomic.Uint64                    // frames read from the mappings (Options.ReleaseEvery)
	pread       [256]bool                        // by ReadKind: Options.PreadKinds
	// retirements counts retireLocked's detachments of shards: a reader
	// that saw it change may have followed a slot naming a pack ID that a
	// new shard took since (read.go staleRead).
	retirements atomic.Uint64
	fs          vfs
	cache       *nodeCache // nil when Options.CacheBytes is 0
	reads       readStats  // read budget by kind (readstats.go)
	lock        *dirLock   // the store directory's LOCK, held until Close

	// repackProgress is the index of the collection plan a running repack
	// is copying, -1 when none (exported as a Prometheus gauge).
	repackProgress atomic.Int64
	// commitRecs counts the records PutMany wrote since the last Sync,
	// lastCommitRecs those the last Sync that followed a write covered
	// (inlineCompress). Stored under mu, read without it.
	commitRecs, lastCommitRecs atomic.Int64
	// syncLatency is the wall time of each Sync that could write (exported as a
	// Prometheus histogram).
	syncLatency latencyHist
	// testHookAfterMarkers, when set, runs after a repack appended its
	// reset markers and before it syncs them (crash tests).
	testHookAfterMarkers func()
	// testHookProbed, when set, runs in find between probing the index and
	// reading the candidate frames (tests of stale slots). Set it before
	// any reader starts.
	testHookProbed func()

	// mu serializes writers. It guards active, the writer-only fields of
	// every shard and collection, stores into published index tables, and
	// additions/removals in shards and colls.
	mu     sync.Mutex
	active *shard // the shard appends go to (highest pack ID)
	// broken is the first write-path error after which the on-disk state is
	// unknown (a failed fsync, or a failed write that could not be trimmed
	// off the file); every later write returns it. Reads continue.
	broken error

	// Index persistence, guarded by mu (see persist.go).
	gen        uint64 // generation of the current checkpoint and delta
	delta      vfile  // open delta file; nil: the next flush writes a checkpoint
	deltaSize  int64  // bytes of delta file written
	deltaN     int    // entries in the delta file
	deltaDirty int64  // delta bytes written since its last fsync
	deltaLimit int    // entries after which a checkpoint replaces the delta
	pending    []byte // encoded delta entries of frames not yet in the delta
	appendBuf  []byte // appendFramesLocked's write buffer, kept between appends
	ckptStale  bool   // shards were retired: the next flush writes a checkpoint
	report     OpenReport
}

// RefreshCollection is a no-op: this engine owns its directory exclusively
// and its in-memory index is always current. It returns ErrClosed after Close.
func (s *PackfileStorage) RefreshCollection(coll ID) error {
	if s.closed.Load() {
		return ErrClosed
	}
	return nil
}

// Collections returns the IDs of collections with at least one live record,
// sorted bytewise.
func (s *PackfileStorage) Collections() []ID {
	var out []ID
	s.colls.Range(func(k, v any) bool {
		out = append(out, k.(ID))
		return true
	})
	slices.SortFunc(out, ID.Compare)
	return out
}

// Close syncs and closes every shard. Later calls return ErrClosed; reads
// racing with Close may return ErrClosed.
func (s *PackfileStorage) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Swap(true) {
		return ErrClosed
	}
	err := s.broken
	if err == nil && !s.opts.ReadOnly {
		// The file ends with its last frame again (doc.go "Commit latency").
		if err = s.trimLocked(s.active); err == nil {
			err = s.syncActiveLocked()
		}
	}
	if err == nil && !s.opts.ReadOnly && (len(s.pending) > 0 || s.deltaN > 0 || s.ckptStale || s.delta == nil) {
		err = s.writeCheckpointLocked()
	}
	if s.delta != nil {
		if cerr := s.delta.Close(); err == nil {
			err = cerr
		}
		s.delta = nil
	}
	if cerr := s.closeShardsLocked(); err == nil {
		err = cerr
	}
	if s.cache != nil {
		s.cache.close()
	}
	if lerr := s.lock.release(); err == nil {
		err = lerr
	}
	return err
}

func (s *PackfileStorage) closeShardsLocked() error {
	var err error
	for i := range s.shards {
		if sh := s.shards[i].Load(); sh != nil {
			if cerr := sh.close(); cerr != nil && err == nil {
				err = cerr
			}
		}
	}
	return err
}

// Stats returns a summary of the store. It takes the writer lock.
func (s *PackfileStorage) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	var st Stats
	for i := range s.shards {
		if sh := s.shards[i].Load(); sh != nil {
			st.Shards++
			st.DiskBytes += sh.size
		}
	}
	s.colls.Range(func(k, v any) bool {
		c := v.(*collection)
		st.Collections++
		st.LiveRecords += c.live
		st.LiveBytes += c.liveBytes
		return true
	})
	st.TagCollisions = s.collisions.Load()
	return st
}

// CollectionRecords returns the IDs of all live records of coll, in index
// order; nil for an unknown collection. It takes the writer lock and reads
// each record's frame header.
func (s *PackfileStorage) CollectionRecords(coll ID) ([]ID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return nil, ErrClosed
	}
	c := s.collectionLoad(coll)
	if c == nil {
		return nil, nil
	}
	var out []ID
	var err error
	c.table.Load().each(func(l loc) {
		if err != nil {
			return
		}
		var id ID
		id, _, err = s.readIDScan(l)
		out = append(out, id)
	})
	return out, err
}
