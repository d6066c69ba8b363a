package packstore

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sync"
	"time"
)

// defaultDeltaLimit is the number of delta entries after which Sync writes a
// new checkpoint instead of appending to the delta (48 bytes each: 12 MiB).
const defaultDeltaLimit = 1 << 18

// OpenReport says how Open rebuilt the indexes (from the index checkpoint and
// delta, doc.go "Open and recovery", or by a scan).
type OpenReport struct {
	// Source is "checkpoint+delta", "checkpoint" or "scan" (full scan of
	// every shard: no checkpoint, or one that could not be used).
	Source string
	// CheckpointErr says why an existing checkpoint was not used (it wraps
	// ErrCorrupt when the file was damaged); nil otherwise.
	CheckpointErr error
	// DeltaErr says why the delta was not used, or where its replay stopped.
	DeltaErr error
	// DeltaEntries is the number of delta entries replayed.
	DeltaEntries int
	// ScannedFrames and ScannedBytes count the shard frames read past what
	// the checkpoint and delta covered.
	ScannedFrames int
	ScannedBytes  int64
	// MissingShard is set (wrapping ErrCorrupt) when the checkpoint lists a
	// shard file that does not exist; Open then fails with it.
	MissingShard error
	// TruncatedBytes is the size of a torn tail cut off the last shard,
	// TruncatedFile the shard file's name and TruncatedAt the offset it was
	// cut at. Only bytes past what the index files say was synced (so never
	// acknowledged by a Sync) are ever truncated.
	// With Options.ReadOnly the tail is only found, not cut (TailNotCut):
	// the frames before TruncatedAt are served, the file is unchanged.
	TruncatedBytes int64
	TruncatedFile  string
	TruncatedAt    int64
	TailNotCut     bool
	// ZeroTailBytes counts the zero bytes found after the last frame of a
	// shard file, to its end: the zeros the writer writes ahead of its
	// frames (doc.go "Commit latency") that a crash left, or a file
	// extension whose data never reached the disk. Nothing is lost there:
	// Open cuts them (with ReadOnly it only skips them), and they are not
	// reported as a torn tail.
	ZeroTailBytes int64
	// Damaged lists the frames that the index files say were synced but
	// whose bytes on disk do not match (each error wraps ErrCorrupt and
	// names the shard file and offset). Open still succeeds; reading those
	// records returns ErrCorrupt, and Check fails.
	Damaged []error
	// Quarantined lists the shard files with a bad header (empty, short,
	// zero-filled or damaged: typically a crash while one was created)
	// that held no acknowledged data and were renamed aside, as
	// "NAME renamed to NAME.quarantined-UNIXNANO: why". A bad header on a
	// shard that may hold acknowledged data fails Open instead.
	Quarantined []string
	// Warnings are conditions Open did not refuse but a caller should
	// show: a store directory or files that grant more than Options.Perm
	// (other local users may read the rooms).
	Warnings []string
}

// indexFiles are the index files as Open read them: the checkpoint decoded
// (cp; cpErr is its decoding error, nil when the file is missing or
// unreadable: see ckptErr) with its version byte (0 if shorter), and the
// raw delta.
type indexFiles struct {
	delta             []byte
	ckptErr, deltaErr error // fs.ErrNotExist when missing
	ckptVersion       byte
	cp                *checkpoint
	cpErr             error
}

// checkpoint returns the decoded checkpoint, or nil when the file is
// missing, unreadable or does not decode.
func (f indexFiles) checkpoint() *checkpoint {
	if f.ckptErr != nil || f.cpErr != nil {
		return nil
	}
	return f.cp
}

// listedShards returns how many shard files the index files name (0 when
// neither exists): the checkpoint's shard list if it decodes, otherwise 1 for
// a checkpoint that exists but does not decode or a delta with entries (a store
// had data), so that a directory whose shards are all gone is not taken for a
// new store.
func (s *PackfileStorage) listedShards() (int, error) {
	f := s.readIndexFiles()
	if f.ckptErr == nil {
		if cp := f.checkpoint(); cp != nil {
			n := 0
			for _, sh := range cp.shards {
				if sh.size > HeaderSize {
					n++ // a shard with frames; an empty first shard is a new store's
				}
			}
			return n, nil
		}
		return 1, nil
	}
	if f.deltaErr == nil && len(f.delta) > deltaHeaderLen {
		return 1, nil
	}
	return 0, nil
}

// oldIndexFormat reports whether the checkpoint or delta was written in
// version 0x01 (Open then replaces both at once, so that no 0x02 entry is
// ever appended to a 0x01 file).
func (f indexFiles) oldIndexFormat() bool {
	return f.ckptErr == nil && f.ckptVersion == checkpointVersionV1 ||
		f.deltaErr == nil && len(f.delta) > 4 && f.delta[4] == deltaVersionV1
}

func (s *PackfileStorage) readIndexFiles() indexFiles {
	var f indexFiles
	f.ckptErr = s.readCheckpoint(&f)
	f.delta, f.deltaErr = s.readWhole(deltaFile)
	return f
}

// ckptReadChunk is the size of the pieces readCheckpoint reads (or, from
// a mapping, checksums) at a time.
const ckptReadChunk = 1 << 20

// readCheckpoint reads the checkpoint file and decodes it into f (cp,
// cpErr, ckptVersion). It maps the file, so that decoding reads the page
// cache's bytes in place (no buffer to zero, no copy), and reads it into a
// buffer when it cannot be mapped. Another goroutine goes through the file
// in ckptReadChunk pieces (reading them, or touching the mapped pages, which
// reads them from disk if they are not cached), checksums the body as it
// goes, while decoding consumes what it has passed
// (decodeCheckpointAsRead), so that decoding a large index overlaps reading
// it from a cold disk and its checksumming. A device error under the
// mapping (a SIGBUS, see shard.faultToError) is caught and returned as a
// read error. It returns the error of opening or reading the file
// (fs.ErrNotExist when it is missing); then f.cp is unset.
func (s *PackfileStorage) readCheckpoint(f *indexFiles) error {
	file, err := s.fs.OpenFile(s.indexPath(checkpointFile), os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer file.Close()
	n, err := file.Size()
	if err != nil {
		return err
	}
	if n > 1<<40 {
		return fmt.Errorf("%s: %d bytes is not plausible", checkpointFile, n)
	}
	var b []byte
	mapped := false
	if n > 0 {
		if m, err := file.Map(int(n)); err == nil {
			defer m.Unmap()                // after decoding and the reader below are done
			_ = madvise(m, madvSequential) // advice only: more read-ahead
			b, mapped = m, true
		}
	}
	if !mapped {
		b = make([]byte, n)
	}
	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	read, readErr, crc := 0, error(nil), uint32(0) // guarded by mu
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		sum := uint32(0) // CRC-32C of the body bytes read so far
		for off := 0; off < len(b); {
			end := min(off+ckptReadChunk, len(b))
			var err error
			if !mapped {
				_, err = file.ReadAt(b[off:end], int64(off))
			}
			// From a mapping, the checksum is what reads the body's pages.
			if lo, hi := max(off, ckptHeaderLen), min(end, len(b)-crcLen); err == nil && lo < hi {
				err = guardFault(func() error {
					sum = crc32.Update(sum, castagnoli, b[lo:hi])
					return nil
				})
			}
			mu.Lock()
			read, readErr, crc, off = end, err, sum, end
			mu.Unlock()
			cond.Broadcast()
			if err != nil {
				return
			}
		}
	}()
	avail := func(end int) {
		mu.Lock()
		for read < end && readErr == nil {
			cond.Wait()
		}
		mu.Unlock()
	}
	bodyCRC := func() uint32 {
		mu.Lock()
		defer mu.Unlock()
		return crc
	}
	// On a read error decoding runs over bytes never read (zeros, or
	// pages that fault; every count is checked against the size): its
	// result is dropped below.
	decodeErr := guardFault(func() error {
		f.cp, f.cpErr = decodeCheckpointAsRead(b, avail, bodyCRC)
		return nil
	})
	<-finished
	if readErr == nil {
		readErr = decodeErr
	}
	if readErr != nil {
		f.cp, f.cpErr = nil, nil
		return readErr
	}
	if len(b) > 4 {
		f.ckptVersion = b[4]
	}
	return nil
}

// guardFault runs fn with debug.SetPanicOnFault on and returns a fault
// (SIGBUS from a mapped file whose page the device failed to read, see
// shard.faultToError) as an error instead of letting it kill the process.
// Any other panic is re-raised.
func guardFault(fn func() error) (err error) {
	defer func(old bool) {
		debug.SetPanicOnFault(old)
		r := recover()
		if r == nil {
			return
		}
		if f, ok := r.(interface{ Addr() uintptr }); ok {
			err = fmt.Errorf("packstore: reading a mapped index file faulted at address %#x: the device failed to read it, or it was truncated", f.Addr())
			return
		}
		panic(r)
	}(debug.SetPanicOnFault(true))
	return fn()
}

// syncedFloor returns, per pack ID, how many bytes of the shard the index
// files prove were fsynced before a Sync (or Close) returned: the shard
// sizes a decodable checkpoint lists, and the end of every frame named by a
// CRC-valid delta entry (of any generation: a frame once synced stays
// synced; a delta never outlives a retirement, since retirement writes a
// checkpoint and a fresh delta before it deletes a shard file and frees its
// pack ID, so every entry names the shard that holds that pack ID now).
// Bytes below the floor were
// acknowledged, so missing or damaged ones are corruption, never a torn
// tail.
//
// must lists the shards that may hold acknowledged frames the index files
// do not name: the delta is fsynced lazily (flushDeltaLocked), so the
// shard that was active when they were last made durable may have received
// synced frames since, whose entries a power loss dropped. That shard is
// the checkpoint's covered shard or the shard of the last entryShard entry
// (written and fsynced when the shard was created, before any frame). Such
// a shard missing is corruption even when its floor shows no frame.
func syncedFloor(files indexFiles) (floor map[uint16]int64, must map[uint16]bool) {
	floor, must = map[uint16]int64{}, map[uint16]bool{}
	if cp := files.checkpoint(); cp != nil {
		for _, sh := range cp.shards {
			floor[sh.id] = max(floor[sh.id], int64(sh.size))
		}
		must[cp.covered.shard] = true
	}
	if files.deltaErr != nil {
		return floor, must
	}
	if _, err := decodeDeltaHeader(files.delta); err != nil {
		return floor, must
	}
	last, created := uint16(0), false
	for off := deltaHeaderLen; off+deltaEntryLen <= len(files.delta); off += deltaEntryLen {
		m, err := decodeDeltaEntry(files.delta[off:])
		if err != nil {
			break // a torn delta tail: never acknowledged
		}
		if m.newShard {
			last, created = m.at.shard, true
			floor[m.at.shard] = max(floor[m.at.shard], HeaderSize)
			continue
		}
		floor[m.at.shard] = max(floor[m.at.shard], int64(m.at.off)+int64(m.size))
	}
	if created {
		must[last] = true
	}
	return floor, must
}

// checkFloorLocked fails Open with ErrCorrupt when a shard file is shorter
// than the index files say was synced, or missing although they name a
// synced frame in it. Retirement writes a checkpoint (and an empty delta)
// that no longer names a shard before it deletes the file, so a shard the
// index files prove synced frames in is never legitimately missing: its
// acknowledged records were lost, and Open must not serve the store without
// them (nor write a fresh checkpoint that hides the loss).
func (s *PackfileStorage) checkFloorLocked(floor map[uint16]int64, must map[uint16]bool) error {
	for _, id := range sortedKeys16(floor) {
		sh := s.shards[id].Load()
		if sh == nil && floor[id] > HeaderSize {
			return fmt.Errorf("%w: shard %d (%s) is missing from %s: the index files say %d bytes of it were synced",
				ErrCorrupt, id, shardFileName(id), s.opts.Dir, floor[id])
		}
		if sh == nil && must[id] {
			return fmt.Errorf("%w: shard %d (%s) is missing from %s: it was the active shard when the index files were last made durable, so it may hold synced records",
				ErrCorrupt, id, shardFileName(id), s.opts.Dir)
		}
		if sh != nil && sh.size < floor[id] {
			return fmt.Errorf("%w: shard %d (%s): the index files say %d bytes were synced, the file has %d",
				ErrCorrupt, id, filepath.Base(sh.path), floor[id], sh.size)
		}
	}
	return nil
}

func sortedKeys16[V any](m map[uint16]V) []uint16 {
	out := make([]uint16, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// OpenReport returns how Open rebuilt the indexes.
func (s *PackfileStorage) OpenReport() OpenReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.report
}

func (s *PackfileStorage) indexPath(name string) string { return filepath.Join(s.opts.Dir, name) }

// readWhole reads a whole file through the vfs; missing files return
// fs.ErrNotExist.
func (s *PackfileStorage) readWhole(name string) ([]byte, error) {
	f, err := s.fs.OpenFile(s.indexPath(name), os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	n, err := f.Size()
	if err != nil {
		return nil, err
	}
	if n > 1<<40 {
		return nil, fmt.Errorf("%s: %d bytes is not plausible", name, n)
	}
	b := make([]byte, n)
	if _, err := f.ReadAt(b, 0); err != nil && n > 0 {
		return nil, err
	}
	return b, nil
}

// indexCorruptf returns an ErrCorrupt error naming an index file and offset.
func (s *PackfileStorage) indexCorruptf(name string, off int64, format string, args ...any) error {
	return fmt.Errorf("%w: %s offset %d: %s", ErrCorrupt, name, off, fmt.Sprintf(format, args...))
}

// loadIndexLocked loads the checkpoint and replays the delta into the
// (empty) indexes of the already opened shards ids. It returns the position
// up to which the shard bytes are reflected; ok=false means the caller must
// reset the indexes and scan every shard.
func (s *PackfileStorage) loadIndexLocked(ids []uint16, files indexFiles) (covered loc, ok bool) {
	err := files.ckptErr
	if errors.Is(err, fs.ErrNotExist) {
		return loc{}, false
	}
	if err != nil {
		s.report.CheckpointErr = err
		return loc{}, false
	}
	cp := files.checkpoint()
	if cp == nil {
		s.report.CheckpointErr = s.indexCorruptf(checkpointFile, ckptErrorOffset(files.cpErr), "%v", files.cpErr)
		return loc{}, false
	}
	// extent: the bytes of each shard the index reflects.
	extent := make(map[uint16]int64, len(cp.shards))
	for _, sh := range cp.shards {
		extent[sh.id] = int64(sh.size)
	}
	if extent[cp.covered.shard] != int64(cp.covered.off) {
		s.report.CheckpointErr = s.indexCorruptf(checkpointFile, 16, "covered position %v is not the end of a listed shard", cp.covered)
		return loc{}, false
	}
	for id, n := range extent {
		if sh := s.shards[id].Load(); sh == nil || sh.size < n {
			s.report.CheckpointErr = fmt.Errorf("packstore: %s lists shard %d (%d bytes) that is missing or shorter on disk", checkpointFile, id, n)
			if sh == nil && n > HeaderSize {
				// Retirement writes a checkpoint without a shard before it deletes
				// the file, so a listed shard that is gone was lost, not retired.
				s.report.MissingShard = fmt.Errorf("%w: shard %d (%s) is listed in %s but missing",
					ErrCorrupt, id, shardFileName(id), checkpointFile)
			}
			return loc{}, false
		}
	}
	for _, cc := range cp.colls {
		c := &collection{live: cc.count, liveBytes: cc.liveBytes}
		c.table.Store(&lossyTable{slots: cc.slots, bits: cc.bits, count: cc.count})
		s.colls.Store(cc.coll, c)
	}
	for id, n := range cp.live { // every listed shard is open (checked above)
		if n > 0 {
			s.shards[id].Load().live += n
		}
	}
	for _, m := range cp.meta {
		sh := s.shards[m.shard].Load()
		if m.kind == metaData {
			sh.noteData(m.coll, m.at.off)
		} else {
			sh.noteReset(m.coll, m.pos)
		}
	}
	s.gen = cp.gen
	s.report.Source = "checkpoint"
	covered = cp.covered
	covered, s.deltaN = s.replayDeltaLocked(files, cp.gen, covered, extent)
	if s.deltaN > 0 {
		s.report.Source = "checkpoint+delta"
	}
	// Every shard below the covered position must be exactly what the
	// checkpoint and delta describe, or hold no frames at all.
	for _, id := range ids { // stream order
		if id == covered.shard {
			break
		}
		n, known := extent[id]
		if size := s.shards[id].Load().size; !(known && size == n || !known && size == HeaderSize) {
			s.report.CheckpointErr = fmt.Errorf("packstore: shard %d has %d bytes, the index covers %d", id, size, n)
			return loc{}, false
		}
	}
	return covered, true
}

// replayDeltaLocked applies the delta entries that continue the checkpoint
// contiguously; it stops at the first entry that is torn (bad CRC) or does
// not continue, and returns the new covered position and the number of
// entries applied. An entry whose frame on disk does not match it names a
// synced frame that was damaged: it is applied anyway (reads of the record
// fail with ErrCorrupt) and listed in OpenReport.Damaged.
func (s *PackfileStorage) replayDeltaLocked(files indexFiles, gen uint64, covered loc, extent map[uint16]int64) (loc, int) {
	b, err := files.delta, files.deltaErr
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.report.DeltaErr = err
		}
		return covered, 0
	}
	g, err := decodeDeltaHeader(b)
	if err != nil {
		s.report.DeltaErr = s.indexCorruptf(deltaFile, 0, "%v", err)
		return covered, 0
	}
	if g != gen {
		s.report.DeltaErr = fmt.Errorf("packstore: %s generation %d, checkpoint %d: ignored", deltaFile, g, gen)
		return covered, 0
	}
	n := 0
	for off := int64(deltaHeaderLen); off < int64(len(b)); off += deltaEntryLen {
		m, err := decodeDeltaEntry(b[off:])
		if err == nil && m.newShard {
			// A shard's creation, not a frame: its frames follow as entries.
			if sh := s.shards[m.at.shard].Load(); sh == nil || sh.seq != m.seq {
				s.report.DeltaErr = s.indexCorruptf(deltaFile, off, "shard %d (sequence %d) created here is not the shard file on disk", m.at.shard, m.seq)
				break
			}
			n++
			continue
		}
		if err == nil {
			err = s.deltaEntryContinuesLocked(m, covered)
		}
		if err != nil {
			s.report.DeltaErr = s.indexCorruptf(deltaFile, off, "%v", err)
			break
		}
		if err := s.deltaEntryMatchesLocked(m); err != nil {
			s.report.Damaged = append(s.report.Damaged, err)
		}
		if err := s.applyMetaLocked(m); err != nil {
			s.report.Damaged = append(s.report.Damaged, err)
		}
		covered = loc{shard: m.at.shard, off: m.at.off + uint32(m.size)}
		extent[m.at.shard] = int64(covered.off)
		n++
	}
	s.report.DeltaEntries = n
	return covered, n
}

// deltaEntryContinuesLocked checks that a delta entry continues the covered
// position (the next frame, or the first frame of a later shard once the
// current one is complete) and lies inside the shard files.
func (s *PackfileStorage) deltaEntryContinuesLocked(m frameMeta, covered loc) error {
	if m.at != covered {
		cur, next := s.shards[covered.shard].Load(), s.shards[m.at.shard].Load()
		if cur == nil || next == nil || next.seq <= cur.seq || m.at.off != HeaderSize || cur.size != int64(covered.off) {
			return fmt.Errorf("entry at %d/%d does not continue %d/%d", m.at.shard, m.at.off, covered.shard, covered.off)
		}
		for i := range s.shards { // shards between the two in stream order
			if sh := s.shards[i].Load(); sh != nil && sh.seq > cur.seq && sh.seq < next.seq && sh.size != HeaderSize {
				return fmt.Errorf("entry at %d/%d skips frames of shard %d", m.at.shard, m.at.off, sh.id)
			}
		}
	}
	sh := s.shards[m.at.shard].Load()
	if sh == nil || int64(m.at.off)+int64(m.size) > sh.size {
		return fmt.Errorf("entry at %d/%d size %d lies outside the shard files", m.at.shard, m.at.off, m.size)
	}
	return nil
}

// deltaEntryMatchesLocked checks (structurally, without the frame CRC, which
// reads verify) that the frame on disk is the one a delta entry names.
func (s *PackfileStorage) deltaEntryMatchesLocked(m frameMeta) (err error) {
	sh := s.shards[m.at.shard].Load()
	defer sh.faultToError(int64(m.at.off), debug.SetPanicOnFault(true), &err)
	fv, err := decodeFrameCRC(sh.mm[m.at.off:], false)
	if err != nil || fv.Size != m.size || fv.Coll != m.coll || (fv.Flags&FlagReset != 0) != m.reset || !m.reset && fv.ID != m.id {
		return sh.corruptf(int64(m.at.off), "synced frame (index.delta: %d bytes, collection %s) does not match the bytes on disk (%v)", m.size, m.coll, err)
	}
	return nil
}

// resetIndexLocked forgets everything loadIndexLocked may have applied.
func (s *PackfileStorage) resetIndexLocked() {
	s.colls.Clear()
	for i := range s.shards {
		if sh := s.shards[i].Load(); sh != nil {
			sh.live = 0
			clear(sh.colls)
			clear(sh.resets)
		}
	}
	s.deltaN = 0
	s.report.DeltaEntries = 0
}

// deltaLazyBytes bounds the delta bytes written since its last fsync:
// past it, flushDeltaLocked fsyncs the delta even when not asked to.
const deltaLazyBytes = 64 << 10

// flushDeltaLocked appends the pending delta entries to the delta file, or
// writes a new checkpoint when there is no usable delta file or the delta
// has grown past its limit. Callers have fsynced the shards. With durable
// (a roll, Close) the delta is fsynced; otherwise (Sync, Repack) only when
// deltaLazyBytes were written since its last fsync: a commit costs the
// shard's fsync alone, and the entries written but not yet fsynced only
// save scanning after a crash (Open scans the shard bytes they would have
// covered; see syncedFloor for what still proves synced bytes).
//
// The write itself (no fsync) is not free: ext4 data=ordered writes the
// delta's dirty block out with the journal commit of the shard's fsync,
// about 80 us a commit (raw 8.8 KiB append + fdatasync, median of 5
// alternated runs of 1,500: 346 us alone, 428 us with a 768-byte write to
// a second file; load average 2.3). Keeping the entries in memory instead
// removed that, but then a process crash (not only a power loss) lost the
// proof of the synced tail, and a shard cut short afterwards was taken for
// a torn tail (TestSyncedTailNotTruncated, TestShortShardIsCorruption);
// the write stays.
func (s *PackfileStorage) flushDeltaLocked(durable bool) error {
	if len(s.pending) == 0 && s.delta != nil && !s.ckptStale && !(durable && s.deltaDirty > 0) {
		return nil
	}
	if s.delta == nil || s.ckptStale || s.deltaN+len(s.pending)/deltaEntryLen > s.deltaLimit {
		return s.writeCheckpointLocked()
	}
	return s.writeDeltaLocked(durable)
}

// writeDeltaLocked appends the pending entries to the open delta file,
// fsyncing it when durable or when deltaLazyBytes were written since its
// last fsync. On failure the delta file is closed and dropped: the next
// flush writes a checkpoint instead.
func (s *PackfileStorage) writeDeltaLocked(durable bool) error {
	n := len(s.pending) / deltaEntryLen
	fail := func(err error) error {
		// Cut what part of the entries landed: the file ends with whole
		// entries, as a crash would leave it.
		s.delta.Truncate(s.deltaSize)
		s.delta.Close()
		s.delta = nil // the next flush writes a checkpoint instead
		return fmt.Errorf("packstore: append to %s offset %d: %w", s.indexPath(deltaFile), s.deltaSize, pathless(err))
	}
	if _, err := s.delta.WriteAt(s.pending, s.deltaSize); err != nil {
		return fail(err)
	}
	s.deltaDirty += int64(len(s.pending))
	if durable || s.deltaDirty >= deltaLazyBytes {
		if err := s.delta.Sync(); err != nil {
			return fail(err)
		}
		s.deltaDirty = 0
	}
	s.deltaSize += int64(len(s.pending))
	s.deltaN += n
	s.pending = s.pending[:0]
	return nil
}

// writeCheckpointLocked fsyncs the active shard and writes the whole index
// as a new checkpoint (temporary file, fsync, rename, directory fsync) with
// an empty delta of the same generation.
func (s *PackfileStorage) writeCheckpointLocked() error {
	if err := s.syncActiveLocked(); err != nil {
		return err
	}
	gen := max(s.gen+1, uint64(time.Now().UnixNano()))
	cp := &checkpoint{gen: gen, covered: s.endLocked()}
	for i := range s.shards {
		sh := s.shards[i].Load()
		if sh == nil {
			continue
		}
		cp.shards = append(cp.shards, ckptShard{id: sh.id, size: uint32(sh.size)})
		for _, coll := range sortedKeys(sh.colls) {
			cp.meta = append(cp.meta, ckptMeta{kind: metaData, shard: sh.id, coll: coll, at: loc{sh.id, sh.colls[coll]}})
		}
		for _, coll := range sortedKeys(sh.resets) {
			cp.meta = append(cp.meta, ckptMeta{kind: metaReset, shard: sh.id, coll: coll, pos: sh.resets[coll]})
		}
	}
	for _, coll := range s.Collections() {
		c := s.collectionLoad(coll)
		t := c.table.Load()
		// The live table itself: only the writer, which holds mu, stores into it.
		cc := ckptColl{coll: coll, bits: t.bits, count: t.count, liveBytes: c.liveBytes, slots: t.slots}
		cp.colls = append(cp.colls, cc)
	}
	if err := s.writeFileAtomic(checkpointFile, encodeCheckpoint(cp), false); err != nil {
		return err
	}
	if s.delta != nil {
		s.delta.Close()
		s.delta = nil
	}
	if err := s.writeFileAtomic(deltaFile, encodeDeltaHeader(gen), true); err != nil {
		return err
	}
	s.gen, s.deltaSize, s.deltaN, s.deltaDirty = gen, deltaHeaderLen, 0, 0
	s.pending = s.pending[:0]
	s.ckptStale = false
	return nil
}

// writeFileAtomic publishes an index file (see publishFile). With keep, the
// file stays open as s.delta.
func (s *PackfileStorage) writeFileAtomic(name string, b []byte, keep bool) error {
	f, err := s.publishFile(s.indexPath(name), b)
	if err != nil {
		return err
	}
	if keep {
		s.delta = f
		return nil
	}
	return f.Close()
}

// publishFile creates path with content b so that a crash never leaves a
// partial file under that name: it writes path.tmp, fsyncs it, renames it
// and fsyncs the directory. It returns the open file. On failure the
// temporary file is removed and the error names path.
func (s *PackfileStorage) publishFile(path string, b []byte) (vfile, error) {
	tmp := path + ".tmp"
	f, err := s.fs.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, s.opts.Perm)
	if err != nil {
		return nil, fmt.Errorf("packstore: create %s: %w", path, pathless(err))
	}
	fail := func(err error) (vfile, error) {
		f.Close()
		s.fs.Remove(tmp)
		return nil, fmt.Errorf("packstore: write %s: %w", path, pathless(err))
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := s.fs.Rename(tmp, path); err != nil {
		return fail(err)
	}
	if err := syncDir(s.fs, s.opts.Dir); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func sortedKeys[V any](m map[ID]V) []ID {
	out := make([]ID, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, ID.Compare)
	return out
}
