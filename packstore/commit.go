// commit.go: the write path (doc.go "Append stream and order"): encoding,
// appending to the active shard, rolling to a new shard, Sync.

package packstore

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"sync"
	"time"
)

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

// endPosLocked is endLocked as a stream position.
func (s *PackfileStorage) endPosLocked() pos {
	return pos{seq: s.active.seq, off: uint32(s.active.size)}
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
// shards are free again). Short of IDs, it first retires the shards
// nothing references (retireLocked); otherwise it writes nothing.
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
	if need == 0 {
		return nil
	}
	free := s.freeIDsLocked()
	if need > free {
		// A repack that died before retiring leaves the shards it emptied
		// holding their pack IDs (each crash mid-repack can leave one or
		// two): retire what nothing references, then count again.
		if _, _, err := s.retireLocked(); err != nil {
			return err
		}
		free = s.freeIDsLocked()
	}
	if need > free {
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
	return s.appendFramesLocked(frames, true)
}

// appendFramesLocked is appendLocked; without prealloc it never writes
// zeros ahead of the frames (a pipelined bulk PutMany appends in pieces
// under preallocMaxAppend that would each be followed by zeros).
func (s *PackfileStorage) appendFramesLocked(frames []outFrame, prealloc bool) ([]loc, error) {
	locs := make([]loc, len(frames))
	n := 0
	for _, fr := range frames {
		n += len(fr.b)
	}
	if n = min(n, appendChunk+maxFrameGuess); cap(s.appendBuf) < n {
		s.appendBuf = make([]byte, 0, n)
	}
	buf := s.appendBuf[:0]
	defer func() { s.appendBuf = buf[:0] }()
	done := 0 // frames[:done] are written and queued for the delta
	flush := func(upto int) error {
		if len(buf) == 0 {
			return nil
		}
		a := s.active
		if _, err := a.f.WriteAt(buf, a.size); err != nil {
			err = fmt.Errorf("packstore: write %s offset %d: %w", a.path, a.size, pathless(err))
			// Trim whatever part of the write landed (and the zeros
			// written ahead), so that the next append does not leave
			// stray frames behind it.
			if terr := a.f.Truncate(a.size); terr != nil {
				s.broken = err
			}
			a.alloc = a.size
			return err
		}
		a.size += int64(len(buf))
		a.alloc = max(a.alloc, a.size)
		a.synced = false
		if prealloc && len(buf) < preallocMaxAppend {
			s.preallocLocked(a)
		}
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
		if len(buf) >= appendChunk {
			if err := flush(i + 1); err != nil {
				return nil, err
			}
		}
	}
	return locs, flush(len(frames))
}

// appendChunk is how many bytes of frames appendFramesLocked gathers per write;
// its buffer is sized for a chunk and a frame of maxFrameGuess beyond it (a
// larger frame grows it) and kept for the next append.
const (
	appendChunk   = 1 << 20
	maxFrameGuess = 64 << 10
)

// preallocStep is how far ahead of its frames the active shard's file is
// extended with written zeros (doc.go "Commit latency").
const preallocStep = 1 << 20

// preallocMaxAppend is the largest append after which the file is extended
// with zeros: a bulk write or a repack's copy (1 MiB chunks) would write
// most of its bytes twice, zeros first, for a flush it waits on anyway.
const preallocMaxAppend = 64 << 10

// zeroPad is the source of the zeros preallocLocked writes.
var zeroPad [preallocStep]byte

// preallocLocked extends the active shard's file with written zeros up to
// the next multiple of preallocStep (at most MaxShardBytes) once its frames
// reach the end of the file (after appends under preallocMaxAppend bytes). A later commit then overwrites allocated bytes
// inside the file size, so its fdatasync writes data only, without the
// journal commit an appending write needs for the new file size (measured
// 155-180 us against 270-500 us a commit). A failed extension is trimmed
// and costs nothing else: the frames before it are written.
func (s *PackfileStorage) preallocLocked(a *shard) {
	if a.size < a.alloc || s.opts.ReadOnly {
		return
	}
	end := min((a.size/preallocStep+1)*preallocStep, s.opts.MaxShardBytes)
	if end <= a.size {
		return
	}
	if _, err := a.f.WriteAt(zeroPad[:end-a.size], a.size); err != nil {
		if terr := a.f.Truncate(a.size); terr != nil {
			s.broken = fmt.Errorf("packstore: trim the zeros written ahead in %s: %w", a.path, terr)
		}
		return
	}
	a.alloc = end
}

// trimLocked cuts the zeros written ahead of a shard's frames (seal, Close):
// a sealed or closed shard file ends with its last frame.
func (s *PackfileStorage) trimLocked(a *shard) error {
	if a.alloc == a.size {
		return nil
	}
	if err := a.f.Truncate(a.size); err != nil {
		err = fmt.Errorf("packstore: trim the zeros written ahead in %s: %w", a.path, pathless(err))
		s.broken = err
		return err
	}
	a.alloc = a.size
	a.synced = false
	return nil
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
	if err := s.trimLocked(a); err != nil {
		return err
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

// syncFile makes the shard's written bytes durable: fdatasync where the
// file supports it (the file size is metadata fdatasync flushes; the
// timestamps it skips are not needed to read the frames back), else fsync.
func (sh *shard) syncFile() error {
	if sh.synced {
		return nil
	}
	if err := datasync(sh.f); err != nil {
		return fmt.Errorf("packstore: fdatasync %s: %w", sh.path, pathless(err))
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

// checkSize returns ErrTooLarge for a payload of n bytes that fits in no
// shard.
func (s *PackfileStorage) checkSize(n int) error {
	if n > s.maxData {
		return fmt.Errorf("%w: %d bytes, at most %d per record with MaxShardBytes %d", ErrTooLarge, n, s.maxData, s.opts.MaxShardBytes)
	}
	return nil
}

// encodeRecord appends the frame of one record to dst, compressing the
// payload with the encoder of mode when compress is set and that makes it
// smaller. scratch is a reusable buffer for the compressed payload; the
// grown buffer is returned.
func (s *PackfileStorage) encodeRecord(dst, scratch []byte, coll, id ID, data []byte, mode zstdMode, compress bool) ([]byte, []byte, error) {
	if err := s.checkSize(len(data)); err != nil {
		return dst, scratch, err
	}
	if compress && len(data) >= compressMin {
		if scratch = s.zstdEncoder(mode).EncodeAll(data, scratch[:0]); len(scratch) < len(data) {
			return appendFrameCRC(dst, FlagZstd, len(data), coll, id, scratch, s.writeCRC()), scratch, nil
		}
	}
	return appendFrameCRC(dst, 0, len(data), coll, id, data, s.writeCRC()), scratch, nil
}

// parallelEncodeMin is the batch size from which PutMany encodes its
// records on several goroutines when it does not compress them (CRCs and
// copies only: a hand-off costs more than a small batch's encoding), and
// parallelCompressMin the size from which it does when it compresses them
// (zstd costs 5-15 us a record of bench's mix).
const (
	parallelEncodeMin   = 64
	parallelCompressMin = 16
)

// inlineCompress reports whether a PutMany of n records compresses them all
// as it writes them (Options.InlineCompressMin): when the commit they
// belong to (the records written since the last Sync, these included) has
// at least InlineCompressMin records, or the previous commit had. So a
// bulk writer that spreads each commit over many collections, in
// PutMany calls smaller than InlineCompressMin, still compresses, and a
// server's small commits do not. It reads the counters without the writer
// lock: a concurrent writer can only move the decision from one valid
// encoding to the other.
func (s *PackfileStorage) inlineCompress(n int) bool {
	m := int64(s.opts.InlineCompressMin)
	return int64(n)+s.commitRecs.Load() >= m || s.lastCommitRecs.Load() >= m
}

// encodeFrames encodes the frames of recs, on up to GOMAXPROCS goroutines
// for a large batch. Each frame is a subslice of one shared buffer per
// goroutine; the buffers are returned for releaseFrameBufs once the frames
// are written. Unless inlineCompress, only Dense records are compressed
// (without the entropy stage, a few microseconds each); the others are
// written raw and Repack compresses them when it copies them.
func (s *PackfileStorage) encodeFrames(coll ID, recs []Record) ([]outFrame, []*[]byte, error) {
	frames := make([]outFrame, len(recs))
	inline := s.opts.Compress && s.inlineCompress(len(recs))
	workers, per := 1, parallelEncodeMin
	if inline {
		per = parallelCompressMin
	}
	if len(recs) >= per {
		workers = min(runtime.GOMAXPROCS(0), len(recs)/(per/2))
	}
	errs := make([]error, workers)
	bufs := make([]*[]byte, workers)
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := w*len(recs)/workers, (w+1)*len(recs)/workers
		if workers == 1 {
			bufs[w], errs[w] = s.encodeRange(coll, recs[lo:hi], frames[lo:hi], inline) // a small batch (a commit's): no goroutine hand-off
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			bufs[w], errs[w] = s.encodeRange(coll, recs[lo:hi], frames[lo:hi], inline)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		releaseFrameBufs(bufs...)
		return nil, nil, err
	}
	return frames, bufs, nil
}

// encodeRange encodes recs into frames (len(frames) == len(recs)), all in
// one buffer from frameBufs, compressing each payload when compress is set
// (Dense ones whenever Options.Compress is) and that makes it smaller. It
// returns the buffer, which the caller releases (releaseFrameBufs) once the
// frames are appended, and does not use after an error.
func (s *PackfileStorage) encodeRange(coll ID, recs []Record, frames []outFrame, compress bool) (*[]byte, error) {
	n := maxFramesSize(recs)
	bp, _ := frameBufs.Get().(*[]byte)
	if bp == nil || cap(*bp) < n {
		b := make([]byte, 0, n)
		bp = &b
	}
	buf := (*bp)[:0]
	var scratch []byte
	for i, r := range recs {
		start := len(buf)
		var err error
		if buf, scratch, err = s.encodeRecord(buf, scratch, coll, r.ID, r.Data, zstdNoEntropy, compress || s.opts.Compress && r.Dense); err != nil {
			releaseFrameBufs(bp)
			return nil, err
		}
		frames[i] = outFrame{coll: coll, id: r.ID, b: buf[start:len(buf):len(buf)]}
	}
	*bp = buf
	return bp, nil
}

// frameBufs holds the buffers encodeRange encodes frames into, for reuse
// by later batches: without it a bulk write allocates its payload again in
// frame buffers at every batch (1 MB for 1000 records of bench's mix) for
// the garbage collector to reclaim.
var frameBufs sync.Pool

// releaseFrameBufs returns encodeRange's buffers to frameBufs; no frame in
// them may be used afterwards. Buffers over 4 MiB are left to the garbage
// collector.
func releaseFrameBufs(bufs ...*[]byte) {
	for _, bp := range bufs {
		if bp != nil && cap(*bp) <= 4<<20 {
			frameBufs.Put(bp)
		}
	}
}

// maxFramesSize is the size of recs' frames uncompressed, which no encoding
// of them exceeds (a payload is stored compressed only when that is
// smaller).
func maxFramesSize(recs []Record) int {
	size := 0
	for _, r := range recs {
		size += FrameOverhead + len(r.Data)
	}
	return size
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
	if s.pipelines(len(recs)) {
		return s.putPipelined([]CollectionRecords{{Coll: coll, Recs: recs}})
	}
	frames, bufs, err := s.encodeFrames(coll, recs)
	if err != nil {
		return err
	}
	defer releaseFrameBufs(bufs...)
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
	return s.indexFramesLocked(coll, frames, locs)
}

// pipelines reports whether a batch of n records is written by putPipelined:
// it compresses as it is written and holds at least two pieces.
func (s *PackfileStorage) pipelines(n int) bool {
	return n >= 2*pipelineChunk && s.opts.Compress && s.inlineCompress(n)
}

// CollectionRecords is one collection's part of a PutBatch.
type CollectionRecords struct {
	Coll ID
	Recs []Record
}

// PutBatch appends the records of several collections as one batch: as
// PutMany of each part in turn, except that a batch that compresses (see
// Options.InlineCompressMin) is compressed as a whole, its records of every
// part on all cores while earlier pieces are appended, so a commit spread
// over many collections in small parts costs what one PutMany of all its
// records does. The batch is not atomic across a crash: after Sync it is
// durable; before, any prefix of it may survive. ErrShardLimit when the
// batch would pass the shard limit: the parts before the one that would pass
// it stay written (none of a batch compressed as a whole). Other errors: as
// PutMany's.
func (s *PackfileStorage) PutBatch(parts []CollectionRecords) error {
	if s.closed.Load() {
		return ErrClosed
	}
	n := 0
	for _, p := range parts {
		n += len(p.Recs)
	}
	if s.pipelines(n) {
		return s.putPipelined(parts)
	}
	for _, p := range parts {
		if err := s.PutMany(p.Coll, p.Recs); err != nil {
			return err
		}
	}
	return nil
}

// indexFramesLocked points the index at frames just appended at locs, in
// order (the last of a duplicated ID wins), and counts them in the commit.
func (s *PackfileStorage) indexFramesLocked(coll ID, frames []outFrame, locs []loc) error {
	s.commitRecs.Add(int64(len(frames)))
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
	start := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opts.ReadOnly && !s.closed.Load() {
		return nil // nothing was written
	}
	defer func() { s.syncLatency.observe(time.Since(start)) }()
	if err := s.writableLocked(); err != nil {
		return err
	}
	if err := s.syncActiveLocked(); err != nil {
		return err
	}
	if n := s.commitRecs.Swap(0); n > 0 {
		s.lastCommitRecs.Store(n)
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
