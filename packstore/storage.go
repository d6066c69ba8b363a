package packstore

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
	// smaller. DefaultOptions sets it; the zero Options leaves it off.
	Compress bool

	// CacheBytes bounds the node cache of decoded payloads (ristretto v2,
	// cost = payload bytes + ~96). 0 disables it; DefaultOptions sets
	// DefaultCacheBytes.
	CacheBytes int64

	// Checksum selects how frame CRCs are used (seed "Benchmarks":
	// none / writeonly / full). The zero value is ChecksumFull.
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
	// ReadAheadKernel gives no hint (the behaviour before). Why, measured
	// on a 2-vCPU VM whose disk has read_ahead_kb 8192 (doc.go
	// "Read-ahead"): a cold Get read about 4 MiB and took about 9 ms with
	// ReadAheadKernel, 6 KiB and 0.15 ms with ReadAheadRandom. Walks that
	// read a large part of a small store in random order are slower with
	// ReadAheadRandom (up to 2.4x in bench-repack's 30 MB pool).
	ReadAhead ReadAheadMode

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

// String returns the seed's name of the mode: "full", "writeonly", "none".
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
// compression on, a 64 MiB node cache and checksum mode "full".
func DefaultOptions(dir string) Options {
	return Options{Dir: dir, MaxShardBytes: MaxShardBytesLimit, Compress: true, CacheBytes: DefaultCacheBytes}
}

// compressMin is the smallest payload the writer tries to compress.
const compressMin = 64

var (
	zstdOnce sync.Once
	zstdEnc  *zstd.Encoder
	zstdDec  *zstd.Decoder
	zstdErr  error
)

// codecs returns the process-wide zstd encoder and decoder; their EncodeAll
// and DecodeAll are safe for concurrent use.
func codecs() (*zstd.Encoder, *zstd.Decoder, error) {
	zstdOnce.Do(func() {
		// SpeedFastest: ingest attempts compression on every payload of
		// compressMin bytes or more, and the default level's match
		// search dominated PutMany's CPU profile (incompressible payloads
		// pay it for nothing). The stream format is the same.
		zstdEnc, zstdErr = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
		if zstdErr != nil {
			return
		}
		zstdDec, zstdErr = zstd.NewReader(nil, zstd.WithDecoderMaxMemory(maxRawLen))
	})
	return zstdEnc, zstdDec, zstdErr
}

// collection is one collection's index state.
type collection struct {
	// table is the published index generation; readers load it lock-free.
	table atomic.Pointer[lossyTable]

	// Writer-only, guarded by PackfileStorage.mu.
	live      int   // live records
	liveBytes int64 // frame bytes of live records
}

func newCollection(bits uint) *collection {
	c := &collection{}
	c.table.Store(newTable(bits))
	return c
}

// PackfileStorage is the packfile engine: one global append stream of shard
// files, a lossy fanout index per collection and caller-scheduled repack
// (seed "Packfile format", "The lossy fanout index", "Topological repack").
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

	closed     atomic.Bool
	shards     [MaxShards]atomic.Pointer[shard] // by pack ID; nil = absent
	colls      sync.Map                         // ID -> *collection
	collisions atomic.Uint64                    // index tag collisions seen
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
	ckptStale  bool   // shards were retired: the next flush writes a checkpoint
	report     OpenReport
}

// Open opens (creating if needed) the store in opts.Dir. It first takes an
// exclusive advisory lock on opts.Dir/LOCK (held until Close; see lockDir):
// if another PackfileStorage, in any process, has the store open, Open
// fails at once with an error matching ErrLocked. It then rebuilds the
// indexes from the checkpoint and delta plus a scan of what they do not
// cover (see rebuildLocked and doc.go "Open and recovery").
func Open(opts Options) (*PackfileStorage, error) {
	if opts.Dir == "" {
		return nil, errors.New("packstore: Options.Dir is empty")
	}
	if opts.MaxShardBytes == 0 {
		opts.MaxShardBytes = MaxShardBytesLimit
	}
	if opts.MaxShardBytes < minShardBytes || opts.MaxShardBytes > MaxShardBytesLimit {
		return nil, fmt.Errorf("packstore: MaxShardBytes %d outside [%d, %d]", opts.MaxShardBytes, minShardBytes, MaxShardBytesLimit)
	}
	if _, _, err := codecs(); err != nil {
		return nil, fmt.Errorf("packstore: zstd: %w", err)
	}
	if opts.Checksum > ChecksumNone {
		return nil, fmt.Errorf("packstore: unknown checksum mode %d", opts.Checksum)
	}
	if opts.ReadAhead > ReadAheadKernel {
		return nil, fmt.Errorf("packstore: unknown read-ahead mode %d", opts.ReadAhead)
	}
	if opts.fs == nil {
		opts.fs = osFS{}
	}
	s := &PackfileStorage{opts: opts, fs: opts.fs, maxShards: opts.maxShards, deltaLimit: defaultDeltaLimit}
	s.repackProgress.Store(-1)
	if s.maxShards <= 0 || s.maxShards > MaxShards {
		s.maxShards = MaxShards
	}
	s.maxData = int(opts.MaxShardBytes) - HeaderSize - FrameOverhead
	if opts.Perm == 0 {
		s.opts.Perm = defaultPerm
	}
	if !opts.ReadOnly {
		if err := s.fs.MkdirAll(opts.Dir, dirPerm(s.opts.Perm)); err != nil {
			return nil, fmt.Errorf("packstore: %w", err)
		}
	}
	lock, err := lockDir(opts.Dir, opts.ReadOnly, s.opts.Perm)
	if err != nil {
		return nil, err
	}
	s.lock = lock
	if opts.CacheBytes > 0 {
		if s.cache, err = newNodeCache(opts.CacheBytes); err != nil {
			lock.release()
			return nil, fmt.Errorf("packstore: cache: %w", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.rebuildLocked(); err != nil {
		s.closeShardsLocked()
		if s.delta != nil {
			s.delta.Close()
		}
		if s.cache != nil {
			s.cache.close()
		}
		lock.release()
		return nil, err
	}
	return s, nil
}

// rebuildLocked opens every shard file in pack-ID order, loads the index
// checkpoint and replays the delta (persist.go), then scans only the shard
// bytes past what they cover. A checkpoint or delta that cannot be used
// falls back to scanning every shard. If anything had to be scanned, a new
// checkpoint is written.
func (s *PackfileStorage) rebuildLocked() error {
	ents, err := s.fs.ReadDir(s.opts.Dir)
	if err != nil {
		return fmt.Errorf("packstore: %w", err)
	}
	var ids []uint16
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, ".tmp") && (strings.HasPrefix(name, "shard-") || strings.HasPrefix(name, "index.")) && !s.opts.ReadOnly {
			// An interrupted shard creation or checkpoint; never published.
			if err := s.fs.Remove(filepath.Join(s.opts.Dir, name)); err != nil {
				return fmt.Errorf("packstore: %w", err)
			}
			continue
		}
		if id, ok := parseShardFileName(name); ok && e.Type().IsRegular() {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	files := s.readIndexFiles()
	floor, must := syncedFloor(files)
	if ids, err = s.openShardsLocked(ids, files, floor, must); err != nil {
		return err
	}
	// From here on ids is in stream order (sequence numbers).
	if err := s.sortBySeqLocked(ids); err != nil {
		return err
	}
	s.warnPermsLocked(ents)
	if len(ids) == 0 {
		// A new store, unless index files say shards existed: then they were
		// lost, and writing a fresh index over them would hide it.
		if n, err := s.listedShards(); err != nil {
			return err
		} else if n > 0 {
			return fmt.Errorf("%w: %s lists %d shard files and none exists in %s", ErrCorrupt, checkpointFile, n, s.opts.Dir)
		}
		if s.opts.ReadOnly {
			return fmt.Errorf("packstore: read-only open: %s holds no shard file (a read-only open creates nothing)", s.opts.Dir)
		}
		sh, err := s.createShard(0, 0)
		if err != nil {
			return err
		}
		s.shards[0].Store(sh)
		s.active = sh
		s.report.Source = "scan"
		return s.writeCheckpointLocked()
	}
	if err := s.checkFloorLocked(floor, must); err != nil {
		return err
	}
	covered, ok := s.loadIndexLocked(ids, files)
	if s.report.MissingShard != nil {
		return s.report.MissingShard
	}
	if !ok {
		s.resetIndexLocked()
		s.report.Source = "scan"
		covered = loc{shard: ids[0], off: HeaderSize}
	}
	coveredSeq := s.shards[covered.shard].Load().seq
	for i, id := range ids {
		if s.shards[id].Load().seq < coveredSeq {
			continue
		}
		from := int64(HeaderSize)
		if id == covered.shard {
			from = int64(covered.off)
		}
		if err := s.scanShardLocked(s.shards[id].Load(), from, floor[id], i == len(ids)-1); err != nil {
			return err
		}
	}
	s.active = s.shards[ids[len(ids)-1]].Load()
	if s.opts.ReadOnly {
		return nil // nothing is written: no roll, no checkpoint, no delta file
	}
	if s.active.crc != s.writeCRC() {
		// The checksum mode changed: a shard's frames all follow its header.
		if err := s.rollLocked(); err != nil {
			return err
		}
	}
	if s.report.Source == "scan" || len(s.pending) > 0 || s.report.DeltaErr != nil || files.oldIndexFormat() {
		// Frames written by an earlier process may not be fsynced yet.
		s.active.synced = false
		return s.writeCheckpointLocked()
	}
	f, err := s.fs.OpenFile(s.indexPath(deltaFile), os.O_RDWR, 0)
	if err != nil {
		return s.writeCheckpointLocked()
	}
	s.delta, s.deltaSize = f, int64(deltaHeaderLen+s.deltaN*deltaEntryLen)
	return nil
}

// openShardsLocked opens the shard files ids (sorted) and returns the IDs
// of those it opened. A file whose header is bad (empty, short, zero-filled
// or damaged: a crash while creating a shard, a stray file) is quarantined
// when no acknowledged data is at stake: the index files name no synced
// frame in it (floor) and either a checkpoint decodes (so it would list
// the shard's synced bytes) or the file holds nothing past a header. It is
// renamed aside to NAME.quarantined-UNIXNANO (never deleted), the directory
// is fsynced, and OpenReport.Quarantined says so. Otherwise the bad header
// fails Open with ErrCorrupt naming the file, as before.
func (s *PackfileStorage) openShardsLocked(ids []uint16, files indexFiles, floor map[uint16]int64, must map[uint16]bool) ([]uint16, error) {
	ckptOK := false
	if files.ckptErr == nil {
		_, err := decodeCheckpoint(files.ckpt)
		ckptOK = err == nil
	}
	kept := ids[:0]
	for _, id := range ids {
		sh, size, err := s.openShard(id)
		if err == nil {
			s.shards[id].Store(sh)
			kept = append(kept, id)
			continue
		}
		if !errors.Is(err, errBadHeader) || floor[id] > HeaderSize || must[id] || !ckptOK && size > HeaderSize {
			return nil, err
		}
		if s.opts.ReadOnly {
			s.report.Quarantined = append(s.report.Quarantined, fmt.Sprintf("%s skipped, not renamed (read-only open): %v", shardFileName(id), err))
			continue
		}
		if err := s.quarantineLocked(id, err); err != nil {
			return nil, err
		}
	}
	return kept, nil
}

// quarantineLocked renames the shard file id aside and reports why.
func (s *PackfileStorage) quarantineLocked(id uint16, why error) error {
	name := shardFileName(id)
	to := fmt.Sprintf("%s.quarantined-%d", name, time.Now().UnixNano())
	if err := s.fs.Rename(filepath.Join(s.opts.Dir, name), filepath.Join(s.opts.Dir, to)); err != nil {
		return fmt.Errorf("packstore: quarantine %s: %w", name, err)
	}
	if err := syncDir(s.fs, s.opts.Dir); err != nil {
		return err
	}
	s.report.Quarantined = append(s.report.Quarantined, fmt.Sprintf("%s renamed to %s: %v", name, to, why))
	return nil
}

// defaultPerm is the permission of files a store creates when
// Options.Perm is 0: owner read and write only.
const defaultPerm os.FileMode = 0o600

// dirPerm returns the directory permission for file permission perm: an
// execute (search) bit for each class that may read.
func dirPerm(perm os.FileMode) os.FileMode {
	perm &= os.ModePerm
	return perm | (perm&0o444)>>2
}

// warnPermsLocked adds an OpenReport warning when the store directory or one
// of its files grants more than Options.Perm allows: a store created by an
// older version (0755 and 0644) lets every local user read every room.
func (s *PackfileStorage) warnPermsLocked(ents []os.DirEntry) {
	if fi, err := os.Stat(s.opts.Dir); err == nil {
		if extra := fi.Mode().Perm() &^ dirPerm(s.opts.Perm); extra != 0 {
			s.report.Warnings = append(s.report.Warnings, fmt.Sprintf(
				"store directory %s has mode %04o, more than %04o (Options.Perm %04o): other local users may read it; chmod %04o %s",
				s.opts.Dir, fi.Mode().Perm(), dirPerm(s.opts.Perm), s.opts.Perm, dirPerm(s.opts.Perm), s.opts.Dir))
		}
	}
	var wide []string
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&^s.opts.Perm != 0 {
			wide = append(wide, fmt.Sprintf("%s %04o", e.Name(), fi.Mode().Perm()))
		}
	}
	if len(wide) > 0 {
		s.report.Warnings = append(s.report.Warnings, fmt.Sprintf(
			"%d files in %s grant more than mode %04o (Options.Perm): %s", len(wide), s.opts.Dir, s.opts.Perm, strings.Join(wide[:min(len(wide), 5)], ", ")))
	}
}

// errBadHeader marks openShard's errors about the header itself (as
// opposed to I/O errors), which openShardsLocked may quarantine.
var errBadHeader = errors.New("bad shard header")

// openShard opens and maps an existing shard file after validating its
// header. It also returns the file size (for openShardsLocked); a header
// that fails validation is an ErrCorrupt error that also matches
// errBadHeader.
func (s *PackfileStorage) openShard(id uint16) (*shard, int64, error) {
	path := filepath.Join(s.opts.Dir, shardFileName(id))
	flag := os.O_RDWR
	if s.opts.ReadOnly {
		flag = os.O_RDONLY
	}
	f, err := s.fs.OpenFile(path, flag, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("packstore: %w", err)
	}
	size, err := f.Size()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("packstore: %w", err)
	}
	sh := newShardState(id, 0, path, f, size, true, &s.opts)
	hdr := make([]byte, HeaderSize)
	n, _ := f.ReadAt(hdr, 0)
	h, err := decodeHeader(hdr[:n])
	if err == nil && h.PackID != id {
		err = fmt.Errorf("header pack id %d does not match file name", h.PackID)
	}
	if err != nil {
		f.Close()
		return nil, size, fmt.Errorf("%w (%w)", sh.corruptf(0, "%v", err), errBadHeader)
	}
	sh.seq = h.Seq
	sh.crc = h.Features&FeatureNoCRC == 0
	sh.verify = sh.verify && sh.crc
	if err := sh.remap(sh.size); err != nil {
		f.Close()
		return nil, size, err
	}
	return sh, size, nil
}

// createShard creates a new shard file through a temporary name (see
// publishFile), so that a published shard file always has a complete,
// fsynced header.
func (s *PackfileStorage) createShard(id uint16, seq uint32) (*shard, error) {
	path := filepath.Join(s.opts.Dir, shardFileName(id))
	crc := s.opts.Checksum != ChecksumNone
	h := shardHeader{PackID: id, Seq: seq, Created: time.Now().UnixNano()}
	if !crc {
		h.Features |= FeatureNoCRC
	}
	f, err := s.publishFile(path, encodeHeader(h))
	if err != nil {
		return nil, err
	}
	return newShardState(id, seq, path, f, HeaderSize, crc, &s.opts), nil
}

// sortBySeqLocked sorts the opened shards ids into stream order, by
// sequence number. Two shards with one sequence number (a copied file, say)
// leave the order of their frames unknown: ErrCorrupt naming both.
func (s *PackfileStorage) sortBySeqLocked(ids []uint16) error {
	slices.SortFunc(ids, func(a, b uint16) int { return cmp.Compare(s.shards[a].Load().seq, s.shards[b].Load().seq) })
	for i := 1; i < len(ids); i++ {
		if a, b := s.shards[ids[i-1]].Load(), s.shards[ids[i]].Load(); a.seq == b.seq {
			return fmt.Errorf("%w: shards %s and %s have the same sequence number %d", ErrCorrupt, filepath.Base(a.path), filepath.Base(b.path), a.seq)
		}
	}
	return nil
}

// posOf returns the stream position of a frame location (its shard exists).
func (s *PackfileStorage) posOf(l loc) pos {
	return pos{seq: s.shards[l.shard].Load().seq, off: l.off}
}

// endPosLocked is endLocked as a stream position.
func (s *PackfileStorage) endPosLocked() pos {
	return pos{seq: s.active.seq, off: uint32(s.active.size)}
}

// scanShardLocked replays the frames of a mapped shard from offset from on
// into the indexes and queues them for the delta. In the last shard a torn
// tail is truncated (see tornTail), but only past synced, the bytes the
// index files say were fsynced (syncedFloor): a bad frame below it was
// acknowledged, and is corruption.
func (s *PackfileStorage) scanShardLocked(sh *shard, from, synced int64, last bool) (err error) {
	if err := sh.adviseScan(from, true); err != nil {
		return err
	}
	defer func() {
		if aerr := sh.adviseScan(from, false); err == nil {
			err = aerr
		}
	}()
	off := from
	defer sh.faultToError(off, debug.SetPanicOnFault(true), &err)
	b := sh.mm
	for off < int64(len(b)) {
		fv, err := decodeFrameCRC(b[off:], sh.crc)
		if err != nil {
			if off < synced {
				return sh.corruptf(off, "%v (in the %d bytes the index files say were synced)", err, synced)
			}
			if last && tornTail(b, off, sh.crc) {
				if s.opts.ReadOnly {
					s.report.TruncatedBytes, s.report.TailNotCut = sh.size-off, true
					s.report.TruncatedFile, s.report.TruncatedAt = filepath.Base(sh.path), off
					return nil
				}
				return s.truncateTail(sh, off)
			}
			return sh.corruptf(off, "%v", err)
		}
		m := metaOf(fv, loc{shard: sh.id, off: uint32(off)}, sh.seq)
		if err := s.applyMetaLocked(m); err != nil {
			return err
		}
		s.pending = appendDeltaEntry(s.pending, m)
		s.report.ScannedFrames++
		s.report.ScannedBytes += int64(fv.Size)
		off += int64(fv.Size)
	}
	return nil
}

// tornTail reports whether the bad frame at off can be a torn final write:
// no valid frame starts anywhere after it. Otherwise the damage is in the
// middle of the data and truncating would lose good frames.
func tornTail(b []byte, off int64, crc bool) bool {
	for p := off + 1; p+FrameOverhead <= int64(len(b)); p++ {
		if _, err := decodeFrameCRC(b[p:], crc); err == nil {
			return false
		}
	}
	return true
}

func (s *PackfileStorage) truncateTail(sh *shard, off int64) error {
	s.report.TruncatedBytes += sh.size - off
	s.report.TruncatedFile, s.report.TruncatedAt = filepath.Base(sh.path), off
	if err := sh.f.Truncate(off); err != nil {
		return fmt.Errorf("packstore: truncate torn tail of %s at %d: %w", sh.path, off, err)
	}
	if err := sh.f.Sync(); err != nil {
		return fmt.Errorf("packstore: fsync %s: %w", sh.path, err)
	}
	sh.size = off
	return sh.remap(off)
}

// metaOf returns what the index needs of a decoded frame at a location in
// the shard with sequence number seq.
func metaOf(fv frameView, at loc, seq uint32) frameMeta {
	m := frameMeta{at: at, size: fv.Size, coll: fv.Coll, id: fv.ID}
	if fv.Flags&FlagReset != 0 {
		m.reset, m.pos = true, fv.ResetPos
		if !fv.HasPos {
			m.pos = pos{seq: seq, off: at.off} // version 0x04 marker
		}
	}
	return m
}

// applyMetaLocked replays one frame (from a scan or a delta entry).
func (s *PackfileStorage) applyMetaLocked(m frameMeta) error {
	sh := s.shards[m.at.shard].Load()
	if m.reset {
		sh.noteReset(m.coll, m.pos)
		return s.dropBeforeLocked(m.coll, m.pos)
	}
	sh.noteData(m.coll, m.at.off)
	c := s.collectionOrCreateLocked(m.coll)
	return s.indexPutLocked(c, m.id, m.at, m.size)
}

// dropBeforeLocked applies a reset marker: it forgets every index entry of
// coll located before p, publishing a rebuilt table for the entries at or
// after p (a repack's copy), or dropping the collection if none remain.
func (s *PackfileStorage) dropBeforeLocked(coll ID, p pos) error {
	c := s.collectionLoad(coll)
	if c == nil {
		return nil
	}
	t := c.table.Load()
	kept := 0
	t.each(func(l loc) {
		if !s.posOf(l).less(p) {
			kept++
		}
	})
	if kept == 0 {
		s.dropCollectionLocked(coll)
		return nil
	}
	nt := newTable(tableBitsFor(kept))
	var err error
	var liveBytes int64
	t.each(func(l loc) {
		if err != nil {
			return
		}
		if s.posOf(l).less(p) {
			s.shards[l.shard].Load().live--
			return
		}
		id, size, rerr := s.readID(l)
		if rerr != nil {
			err = rerr
			return
		}
		nt.insertUnique(makeSlot(id, l), id)
		liveBytes += int64(size)
	})
	if err != nil {
		return err
	}
	c.live, c.liveBytes = kept, liveBytes
	c.table.Store(nt)
	return nil
}

func (s *PackfileStorage) collectionLoad(coll ID) *collection {
	v, ok := s.colls.Load(coll)
	if !ok {
		return nil
	}
	return v.(*collection)
}

func (s *PackfileStorage) collectionOrCreateLocked(coll ID) *collection {
	if c := s.collectionLoad(coll); c != nil {
		return c
	}
	c := newCollection(minTableBits)
	s.colls.Store(coll, c)
	return c
}

// dropCollectionLocked forgets a collection's index and its shard references.
func (s *PackfileStorage) dropCollectionLocked(coll ID) {
	c := s.collectionLoad(coll)
	if c == nil {
		return
	}
	c.table.Load().each(func(l loc) { s.shards[l.shard].Load().live-- })
	s.colls.Delete(coll)
}

// readID reads the record ID and frame size at l (writer side).
func (s *PackfileStorage) readID(l loc) (ID, int, error) {
	sh := s.shards[l.shard].Load()
	if sh == nil {
		return ID{}, 0, fmt.Errorf("%w: index references missing shard %d", ErrCorrupt, l.shard)
	}
	return sh.frameHead(int64(l.off))
}

// indexPutLocked points id at l in c's index, superseding an older version.
func (s *PackfileStorage) indexPutLocked(c *collection, id ID, l loc, size int) error {
	t := c.table.Load()
	if t.needsGrow() {
		nt, err := t.grown(s.readID)
		if err != nil {
			return err
		}
		c.table.Store(nt)
		t = nt
	}
	old, oldSize, replaced, err := t.upsert(id, l, s.readID, &s.collisions)
	if err != nil {
		return err
	}
	if replaced {
		s.shards[old.shard].Load().live--
		c.liveBytes -= int64(oldSize)
	} else {
		c.live++
	}
	s.shards[l.shard].Load().live++
	c.liveBytes += int64(size)
	return nil
}

// lookupLocked finds the current location and frame size of id (writer side).
func (s *PackfileStorage) lookupLocked(c *collection, id ID) (loc, int, bool, error) {
	for _, l := range c.table.Load().candidates(id, nil) {
		got, size, err := s.readID(l)
		if err != nil {
			return loc{}, 0, false, err
		}
		if got == id {
			return l, size, true, nil
		}
		s.collisions.Add(1)
	}
	return loc{}, 0, false, nil
}

// outFrame is one encoded frame queued for the append stream.
type outFrame struct {
	coll   ID
	id     ID
	marker bool
	pos    pos // a marker's position P
	b      []byte
}

// endLocked returns the position the next frame of the stream would take
// if no roll happens: the end of the active shard. As a reset position it is
// equivalent to the next frame's real position, since no frame lies between.
func (s *PackfileStorage) endLocked() loc {
	return loc{shard: s.active.id, off: uint32(s.active.size)}
}

// checkFitLocked reports ErrShardLimit if appending frames of the given
// sizes (after an optional roll to a fresh shard) would need more new
// shards than there are free pack IDs below the limit (IDs of retired
// shards are free again). It writes nothing.
func (s *PackfileStorage) checkFitLocked(roll bool, sizes func(yield func(int) bool)) error {
	need, cur := 0, s.active.size
	if roll && cur > HeaderSize {
		need, cur = need+1, HeaderSize
	}
	max := s.opts.MaxShardBytes
	for n := range sizes {
		if cur+int64(n) > max {
			need, cur = need+1, HeaderSize
		}
		cur += int64(n)
	}
	if free := s.freeIDsLocked(); need > free {
		return fmt.Errorf("%w: writing would need %d new shards, %d pack IDs are free (limit %d shards)", ErrShardLimit, need, free, s.maxShards)
	}
	return nil
}

// freeIDsLocked counts the pack IDs below the limit that no shard holds.
func (s *PackfileStorage) freeIDsLocked() int {
	n := 0
	for i := range s.maxShards {
		if s.shards[i].Load() == nil {
			n++
		}
	}
	return n
}

// nextIDLocked returns the lowest pack ID no shard holds, or false.
func (s *PackfileStorage) nextIDLocked() (uint16, bool) {
	for i := range s.maxShards {
		if s.shards[i].Load() == nil {
			return uint16(i), true
		}
	}
	return 0, false
}

// appendLocked writes frames to the global append stream, rolling to a new
// shard when the next frame would pass MaxShardBytes, and returns each
// frame's location. Callers check fit first (checkFitLocked).
func (s *PackfileStorage) appendLocked(frames []outFrame) ([]loc, error) {
	locs := make([]loc, len(frames))
	var buf []byte
	done := 0 // frames[:done] are written and queued for the delta
	flush := func(upto int) error {
		if len(buf) == 0 {
			return nil
		}
		a := s.active
		if _, err := a.f.WriteAt(buf, a.size); err != nil {
			err = fmt.Errorf("packstore: write %s offset %d: %w", a.path, a.size, err)
			// Trim whatever part of the write landed, so that the next
			// append does not leave stray frames behind it.
			if terr := a.f.Truncate(a.size); terr != nil {
				s.broken = err
			}
			return err
		}
		a.size += int64(len(buf))
		a.synced = false
		buf = buf[:0]
		for ; done < upto; done++ {
			fr := frames[done]
			s.pending = appendDeltaEntry(s.pending, frameMeta{at: locs[done], size: len(fr.b), reset: fr.marker, coll: fr.coll, id: fr.id, pos: fr.pos})
		}
		return nil
	}
	for i, fr := range frames {
		if s.active.size+int64(len(buf)+len(fr.b)) > s.opts.MaxShardBytes {
			if err := flush(i); err != nil {
				return nil, err
			}
			if err := s.rollLocked(); err != nil {
				return nil, err
			}
		}
		a := s.active
		locs[i] = loc{shard: a.id, off: uint32(a.size + int64(len(buf)))}
		if fr.marker {
			a.noteReset(fr.coll, fr.pos)
		} else {
			a.noteData(fr.coll, locs[i].off)
		}
		buf = append(buf, fr.b...)
		if len(buf) >= 1<<20 {
			if err := flush(i + 1); err != nil {
				return nil, err
			}
		}
	}
	return locs, flush(len(frames))
}

// rollLocked seals the active shard (fsync, map in full) and starts the next.
//
// The next shard takes the lowest free pack ID (one a retired shard left,
// or the next unused) and the next sequence number, which orders it after
// every shard before it whatever its pack ID (doc.go "Append stream").
func (s *PackfileStorage) rollLocked() error {
	a := s.active
	next, ok := s.nextIDLocked()
	if !ok {
		return fmt.Errorf("%w: no free pack ID (limit %d shards)", ErrShardLimit, s.maxShards)
	}
	if a.seq == math.MaxUint32 {
		return fmt.Errorf("%w: shard sequence numbers exhausted", ErrShardLimit)
	}
	if err := s.syncActiveLocked(); err != nil {
		return err
	}
	if err := a.remap(a.size); err != nil {
		return err
	}
	sh, err := s.createShard(next, a.seq+1)
	if err != nil {
		return err
	}
	s.shards[next].Store(sh)
	s.active = sh
	if s.opts.ReadOnly || s.gen == 0 {
		return nil // Open: it writes a checkpoint next
	}
	// Record the new shard (and the frames of the sealed one, fsynced
	// above) durably before any frame goes into it: Syncs write the delta
	// lazily, so this entry is what makes a lost file of this shard
	// detectable (syncedFloor's must). Never a checkpoint here: a roll can
	// fall in the middle of a batch whose frames are not indexed yet. With
	// no delta file open (a failed delta write dropped it), the next flush
	// writes a checkpoint, whose covered shard is this one.
	s.pending = appendDeltaEntry(s.pending, frameMeta{at: loc{shard: next, off: HeaderSize}, newShard: true, seq: sh.seq})
	if s.delta != nil {
		// On failure the delta file is dropped and the next flush writes a
		// checkpoint instead (returning its error if the disk still fails):
		// this put need not fail for it.
		_ = s.writeDeltaLocked(true)
	}
	return nil
}

func (sh *shard) syncFile() error {
	if sh.synced {
		return nil
	}
	if err := sh.f.Sync(); err != nil {
		return fmt.Errorf("packstore: fsync %s: %w", sh.path, err)
	}
	sh.synced = true
	return nil
}

// syncActiveLocked fsyncs the active shard (sealed shards were fsynced when
// sealed). After a failed fsync the page cache state is unknown, so the
// store refuses further writes (s.broken).
func (s *PackfileStorage) syncActiveLocked() error {
	if err := s.active.syncFile(); err != nil {
		s.broken = err
		return err
	}
	return nil
}

// writableLocked returns the error a write must fail with, if any.
func (s *PackfileStorage) writableLocked() error {
	if s.closed.Load() {
		return ErrClosed
	}
	if s.opts.ReadOnly {
		return ErrReadOnly
	}
	if s.broken != nil {
		return fmt.Errorf("packstore: store needs reopening after an earlier write failure: %w", s.broken)
	}
	return nil
}

// encodeRecord appends the frame of one record to dst, compressing the
// payload when enabled and smaller. scratch is a reusable buffer for the
// compressed payload; the grown buffer is returned.
func (s *PackfileStorage) encodeRecord(dst, scratch []byte, coll, id ID, data []byte) ([]byte, []byte, error) {
	if len(data) > s.maxData {
		return dst, scratch, fmt.Errorf("%w: %d bytes, at most %d per record with MaxShardBytes %d", ErrTooLarge, len(data), s.maxData, s.opts.MaxShardBytes)
	}
	if s.opts.Compress && len(data) >= compressMin {
		enc, _, _ := codecs()
		if scratch = enc.EncodeAll(data, scratch[:0]); len(scratch) < len(data) {
			return appendFrameCRC(dst, FlagZstd, len(data), coll, id, scratch, s.writeCRC()), scratch, nil
		}
	}
	return appendFrameCRC(dst, 0, len(data), coll, id, data, s.writeCRC()), scratch, nil
}

// parallelEncodeMin is the batch size from which PutMany encodes (and
// compresses) its records on several goroutines.
const parallelEncodeMin = 64

// encodeFrames encodes the frames of recs, on up to GOMAXPROCS goroutines
// for a large batch. Each frame is a subslice of one shared buffer per
// goroutine.
func (s *PackfileStorage) encodeFrames(coll ID, recs []Record) ([]outFrame, error) {
	frames := make([]outFrame, len(recs))
	workers := 1
	if len(recs) >= parallelEncodeMin {
		workers = min(runtime.GOMAXPROCS(0), len(recs)/(parallelEncodeMin/2))
	}
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := w*len(recs)/workers, (w+1)*len(recs)/workers
		wg.Add(1)
		go func() {
			defer wg.Done()
			size := 0
			for _, r := range recs[lo:hi] {
				size += FrameOverhead + len(r.Data)
			}
			buf := make([]byte, 0, size)
			var scratch []byte
			for i := lo; i < hi; i++ {
				r := recs[i]
				start := len(buf)
				var err error
				if buf, scratch, err = s.encodeRecord(buf, scratch, coll, r.ID, r.Data); err != nil {
					errs[w] = err
					return
				}
				frames[i] = outFrame{coll: coll, id: r.ID, b: buf[start:len(buf):len(buf)]}
			}
		}()
	}
	wg.Wait()
	return frames, errors.Join(errs...)
}

// Put appends one record; an existing record with the same ID is superseded.
// Errors: ErrTooLarge, ErrShardLimit, ErrClosed, I/O errors.
func (s *PackfileStorage) Put(coll, id ID, data []byte) error {
	return s.PutMany(coll, []Record{{ID: id, Data: data}})
}

// PutMany appends the records as one batch (one write per shard touched) and
// then indexes them in order, so the last occurrence of a duplicated ID
// wins. If the batch would pass the shard limit nothing is written
// (ErrShardLimit). The batch is not atomic across a crash: after Sync it is
// durable; before, any prefix of it may survive.
func (s *PackfileStorage) PutMany(coll ID, recs []Record) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if len(recs) == 0 {
		return nil
	}
	frames, err := s.encodeFrames(coll, recs)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writableLocked(); err != nil {
		return err
	}
	if err := s.checkFitLocked(false, frameSizes(frames)); err != nil {
		return err
	}
	locs, err := s.appendLocked(frames)
	if err != nil {
		return err
	}
	c := s.collectionOrCreateLocked(coll)
	for i, fr := range frames {
		if err := s.indexPutLocked(c, fr.id, locs[i], len(fr.b)); err != nil {
			return err
		}
	}
	return nil
}

// markerFrameLocked returns a reset marker frame for coll with position p.
func (s *PackfileStorage) markerFrameLocked(coll ID, p pos) outFrame {
	return outFrame{coll: coll, marker: true, pos: p, b: appendMarker(nil, coll, p, s.writeCRC())}
}

// writeCRC reports whether frames written by this store carry CRCs.
func (s *PackfileStorage) writeCRC() bool { return s.opts.Checksum != ChecksumNone }

func frameSizes(frames []outFrame) func(func(int) bool) {
	return func(yield func(int) bool) {
		for _, f := range frames {
			if !yield(len(f.b)) {
				return
			}
		}
	}
}

// DeleteCollection appends a collection reset marker whose position is its
// own (every earlier frame of the collection is dead) and forgets the
// collection's index. The space is reclaimed by a later Repack (which
// retires shards only after the marker is durable). Deleting an unknown
// collection is a no-op.
func (s *PackfileStorage) DeleteCollection(coll ID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writableLocked(); err != nil {
		return err
	}
	if s.collectionLoad(coll) == nil {
		return nil
	}
	fr := []outFrame{s.markerFrameLocked(coll, s.endPosLocked())}
	if err := s.checkFitLocked(false, frameSizes(fr)); err != nil {
		return err
	}
	if _, err := s.appendLocked(fr); err != nil {
		return err
	}
	s.dropCollectionLocked(coll)
	return nil
}

// Sync fsyncs the active shard; sealed shards were fsynced when sealed and
// the directory when each shard was created. Every write that returned
// before Sync is durable when it returns.
func (s *PackfileStorage) Sync() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opts.ReadOnly && !s.closed.Load() {
		return nil // nothing was written
	}
	if err := s.writableLocked(); err != nil {
		return err
	}
	if err := s.syncActiveLocked(); err != nil {
		return err
	}
	if a := s.active; a.size-int64(len(a.mm)) >= remapStep {
		// Map what was appended since, so that index inserts and growth
		// read frame heads from memory instead of one pread each.
		if err := a.remap(a.size); err != nil {
			return err
		}
	}
	return s.flushDeltaLocked(false)
}

// remapStep is how far the active shard may grow past its mapping before
// Sync re-maps it.
const remapStep = 1 << 20

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
		id, _, err = s.readID(l)
		out = append(out, id)
	})
	return out, err
}
