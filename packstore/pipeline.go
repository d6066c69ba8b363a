// pipeline.go: the pipelined write of a large compressed PutMany:
// compression of later pieces of the batch overlaps the append and the
// index inserts of earlier ones.

package packstore

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// pipelineChunk is the number of records putManyPipelined encodes and
// appends as one piece; PutMany pipelines batches of at least two pieces.
const pipelineChunk = 64

// encodedChunk is one piece of a pipelined batch: its frames once done is
// closed, or the error encoding it.
type encodedChunk struct {
	frames []outFrame
	buf    *[]byte // the frames' buffer (encodeRange)
	err    error
	done   chan struct{}
}

// isDone reports whether the piece is encoded (or failed).
func (c *encodedChunk) isDone() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// result returns the piece's frames or its error; the piece must be done.
func (c *encodedChunk) result() ([]outFrame, error) { return c.frames, c.err }

// chunkEncoder hands out the pieces of a pipelined batch to the goroutines
// that compress them (the caller among them) in order.
type chunkEncoder struct {
	s      *PackfileStorage
	coll   ID
	recs   []Record
	chunks []encodedChunk
	next   atomic.Int64 // the next piece nobody encodes yet
	wg     sync.WaitGroup
}

// work encodes the next unclaimed piece and reports whether there was one.
func (e *chunkEncoder) work() bool {
	i := int(e.next.Add(1) - 1)
	if i >= len(e.chunks) {
		return false
	}
	lo, hi := i*pipelineChunk, min((i+1)*pipelineChunk, len(e.recs))
	c := &e.chunks[i]
	c.frames = make([]outFrame, hi-lo)
	c.buf, c.err = e.s.encodeRange(e.coll, e.recs[lo:hi], c.frames, true)
	close(c.done)
	return true
}

// wait returns piece i, encoding other pieces while it is not done.
func (e *chunkEncoder) wait(i int) *encodedChunk {
	c := &e.chunks[i]
	for !c.isDone() {
		if !e.work() {
			<-c.done
		}
	}
	return c
}

// stop makes the helpers stop after their current piece and waits for
// them: afterwards no goroutine reads the caller's records. It releases
// the pieces' frame buffers (releaseFrameBufs).
func (e *chunkEncoder) stop() {
	e.next.Store(int64(len(e.chunks)))
	e.wg.Wait()
	for i := range e.chunks {
		releaseFrameBufs(e.chunks[i].buf)
	}
}

// putManyPipelined is PutMany for a batch of at least two pieces that is
// compressed as it is written. GOMAXPROCS-1 helper goroutines and the
// caller compress the pieces of pipelineChunk records, each taking the next
// piece nobody has taken (so a helper the scheduler holds back delays one
// piece, not half the batch); the caller, holding the writer lock, appends
// each piece as soon as it and every piece before it are encoded and
// indexes it, compressing other pieces while it waits. Compressing the
// rest thus overlaps appending and indexing the first pieces. The batch is
// written in stream order as with PutMany: a crash before Sync leaves a
// prefix of it, and Sync makes all of it durable. Size and shard limit are
// checked for the whole batch (at its uncompressed size, which no encoding
// exceeds) before anything is written.
func (s *PackfileStorage) putManyPipelined(coll ID, recs []Record) error {
	for _, r := range recs {
		if err := s.checkSize(len(r.Data)); err != nil {
			return err
		}
	}
	e := &chunkEncoder{s: s, coll: coll, recs: recs, chunks: make([]encodedChunk, (len(recs)+pipelineChunk-1)/pipelineChunk)}
	for i := range e.chunks {
		e.chunks[i].done = make(chan struct{})
	}
	for range min(runtime.GOMAXPROCS(0)-1, len(e.chunks)-1) {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			for e.work() {
			}
		}()
	}
	defer e.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writableLocked(); err != nil {
		return err
	}
	bound := func(yield func(int) bool) {
		for _, r := range recs {
			if !yield(FrameOverhead + len(r.Data)) {
				return
			}
		}
	}
	if err := s.checkFitLocked(false, bound); err != nil {
		return err
	}
	for i := 0; i < len(e.chunks); {
		// The next piece, and the ones after it that are encoded already:
		// one write for all of them.
		frames, err := e.wait(i).result()
		for i++; err == nil && i < len(e.chunks) && e.chunks[i].isDone(); i++ {
			var more []outFrame
			more, err = e.chunks[i].result()
			frames = append(frames, more...)
		}
		if err != nil {
			return err
		}
		locs, err := s.appendFramesLocked(frames, false)
		if err != nil {
			return err
		}
		if err := s.indexFramesLocked(coll, frames, locs); err != nil {
			return err
		}
	}
	return nil
}
