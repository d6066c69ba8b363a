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

// encodedChunk is one piece of a pipelined batch: up to pipelineChunk
// records, in parts of one collection each, its frames once done is
// closed, or the error encoding it.
type encodedChunk struct {
	parts  []CollectionRecords
	frames []outFrame
	bufs   []*[]byte // the frames' buffers (encodeRange), one per part
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
	c := &e.chunks[i]
	n := 0
	for _, p := range c.parts {
		n += len(p.Recs)
	}
	c.frames = make([]outFrame, n)
	c.bufs = make([]*[]byte, len(c.parts))
	at := 0
	for j, p := range c.parts {
		if c.bufs[j], c.err = e.s.encodeRange(p.Coll, p.Recs, c.frames[at:at+len(p.Recs)], true); c.err != nil {
			break
		}
		at += len(p.Recs)
	}
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
		releaseFrameBufs(e.chunks[i].bufs...)
	}
}

// pipelineChunks splits a batch into pieces of pipelineChunk records (the
// last fewer), in batch order; a piece holds the ends and starts of as
// many of the batch's parts as it spans.
func pipelineChunks(parts []CollectionRecords) []encodedChunk {
	var chunks []encodedChunk
	var cur []CollectionRecords
	n := 0
	for _, p := range parts {
		for recs := p.Recs; len(recs) > 0; {
			take := min(pipelineChunk-n, len(recs))
			cur = append(cur, CollectionRecords{Coll: p.Coll, Recs: recs[:take]})
			recs, n = recs[take:], n+take
			if n == pipelineChunk {
				chunks = append(chunks, encodedChunk{parts: cur, done: make(chan struct{})})
				cur, n = nil, 0
			}
		}
	}
	if n > 0 {
		chunks = append(chunks, encodedChunk{parts: cur, done: make(chan struct{})})
	}
	return chunks
}

// putPipelined is PutBatch (and PutMany) for a batch of at least two
// pieces that is compressed as it is written. GOMAXPROCS-1 helper
// goroutines and the caller compress the pieces (pipelineChunks), each
// taking the next piece nobody has taken (so a helper the scheduler holds
// back delays one piece, not half the batch); the caller, holding the
// writer lock, appends each piece as soon as it and every piece before it
// are encoded and indexes it, compressing other pieces while it waits.
// Compressing the rest thus overlaps appending and indexing the first
// pieces. The batch is written in stream order: a crash before Sync leaves
// a prefix of it, and Sync makes all of it durable. Size and shard limit
// are checked for the whole batch (at its uncompressed size, which no
// encoding exceeds) before anything is written.
func (s *PackfileStorage) putPipelined(parts []CollectionRecords) error {
	for _, p := range parts {
		for _, r := range p.Recs {
			if err := s.checkSize(len(r.Data)); err != nil {
				return err
			}
		}
	}
	e := &chunkEncoder{s: s, chunks: pipelineChunks(parts)}
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
		for _, p := range parts {
			for _, r := range p.Recs {
				if !yield(FrameOverhead + len(r.Data)) {
					return
				}
			}
		}
	}
	if err := s.checkFitLocked(false, bound); err != nil {
		return err
	}
	for i := 0; i < len(e.chunks); {
		// The next piece, and the ones after it that are encoded already:
		// one write for all of them.
		first := i
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
		for _, c := range e.chunks[first:i] {
			for _, p := range c.parts {
				n := len(p.Recs)
				if err := s.indexFramesLocked(p.Coll, frames[:n], locs[:n]); err != nil {
					return err
				}
				frames, locs = frames[n:], locs[n:]
			}
		}
	}
	return nil
}
