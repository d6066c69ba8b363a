// open.go: Open and recovery (doc.go "Open and recovery"): shard files,
// quarantine, the scan past what the index files cover, torn tails.

package packstore

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"
)

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
	if _, err := codecs(); err != nil {
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
	for _, k := range opts.PreadKinds {
		s.pread[k] = true
	}
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
	// The node cache's counters and filters take milliseconds to allocate
	// and clear: build them on another goroutine while the index loads
	// (rebuildLocked reads no record through the cache).
	var cache *nodeCache
	var cacheErr error
	cacheDone := make(chan struct{})
	go func() {
		defer close(cacheDone)
		if opts.CacheBytes > 0 {
			cache, cacheErr = newNodeCache(opts.CacheBytes)
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	err = s.rebuildLocked()
	<-cacheDone
	s.cache = cache
	if cacheErr != nil && err == nil {
		err = fmt.Errorf("packstore: cache: %w", cacheErr)
	}
	if err != nil {
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
// fails Open with ErrCorrupt naming the file.
func (s *PackfileStorage) openShardsLocked(ids []uint16, files indexFiles, floor map[uint16]int64, must map[uint16]bool) ([]uint16, error) {
	ckptOK := files.checkpoint() != nil
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
			"%d files in %s grant more than mode %04o (Options.Perm): %s; chmod %04o %s/*", len(wide), s.opts.Dir, s.opts.Perm,
			strings.Join(wide[:min(len(wide), 5)], ", "), s.opts.Perm, s.opts.Dir))
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
			if allZero(b[off:]) {
				// Zeros written ahead of the frames (preallocLocked).
				s.report.ZeroTailBytes += int64(len(b)) - off
				if s.opts.ReadOnly {
					return nil
				}
				return s.cutTail(sh, off)
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

// allZero reports whether b holds only zero bytes.
func allZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeroPad))
		if !bytes.Equal(b[:n], zeroPad[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

func (s *PackfileStorage) truncateTail(sh *shard, off int64) error {
	s.report.TruncatedBytes += sh.size - off
	s.report.TruncatedFile, s.report.TruncatedAt = filepath.Base(sh.path), off
	return s.cutTail(sh, off)
}

// cutTail truncates a shard file at off and fsyncs it.
func (s *PackfileStorage) cutTail(sh *shard, off int64) error {
	if err := sh.f.Truncate(off); err != nil {
		return fmt.Errorf("packstore: truncate the tail of %s at %d: %w", sh.path, off, err)
	}
	if err := sh.f.Sync(); err != nil {
		return fmt.Errorf("packstore: fsync %s: %w", sh.path, err)
	}
	sh.size, sh.alloc = off, off
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
