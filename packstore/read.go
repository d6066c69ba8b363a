package packstore

import (
	"errors"
	"fmt"
	"slices"
)

// maxReadRetries bounds how often a reader reloads the index after finding
// that a shard it pointed to was retired by a concurrent repack.
const maxReadRetries = 64

// decodePayload returns an owned copy of the frame's uncompressed payload.
func decodePayload(sh *shard, off int64, fv frameView) ([]byte, error) {
	if fv.Flags&FlagZstd == 0 {
		out := make([]byte, len(fv.Payload))
		copy(out, fv.Payload)
		return out, nil
	}
	_, dec, err := codecs()
	if err != nil {
		return nil, err
	}
	out, err := dec.DecodeAll(fv.Payload, make([]byte, 0, fv.RawLen))
	if err != nil {
		return nil, sh.corruptf(off, "zstd: %v", err)
	}
	if len(out) != fv.RawLen {
		return nil, sh.corruptf(off, "zstd payload decoded to %d bytes, raw_len %d", len(out), fv.RawLen)
	}
	return out, nil
}

// readRecord reads the frame at l and, if it holds (coll, id), returns an
// owned copy of its payload with ok=true. ok=false means a tag collision.
func (s *PackfileStorage) readRecord(l loc, coll, id ID) (data []byte, ok bool, err error) {
	sh := s.shards[l.shard].Load()
	if sh == nil {
		return nil, false, errShardGone
	}
	off := int64(l.off)
	err = sh.withFrame(off, func(fv frameView) error {
		if fv.Flags&FlagReset != 0 {
			return sh.corruptf(off, "index points at a reset marker")
		}
		if fv.ID != id {
			return nil
		}
		if fv.Coll != coll {
			return sh.corruptf(off, "frame of record %s belongs to collection %s, index of %s", id, fv.Coll, coll)
		}
		var derr error
		data, derr = decodePayload(sh, off, fv)
		ok = derr == nil
		return derr
	})
	return data, ok, err
}

// retryable reports whether a read failed because a concurrent repack
// retired a shard of the index generation the reader had loaded.
func (s *PackfileStorage) retryable(err error, attempt int) (bool, error) {
	if !errors.Is(err, errShardGone) {
		return false, err
	}
	if s.closed.Load() {
		return false, ErrClosed
	}
	if attempt >= maxReadRetries {
		return false, fmt.Errorf("packstore: index keeps referencing retired shards")
	}
	return true, nil
}

// Get returns an owned copy of the record's payload, ErrNotFound if the
// collection has no such record, an ErrCorrupt error if its frame fails the
// CRC or names another collection, or ErrClosed. It does not take the writer
// lock.
func (s *PackfileStorage) Get(coll, id ID) ([]byte, error) {
	var cands [4]loc
	for attempt := 0; ; attempt++ {
		if s.closed.Load() {
			return nil, ErrClosed
		}
		c := s.collectionLoad(coll)
		if c == nil {
			return nil, ErrNotFound
		}
		var err error
		for _, l := range c.table.Load().candidates(id, cands[:0]) {
			var data []byte
			var ok bool
			data, ok, err = s.readRecord(l, coll, id)
			if err != nil {
				break
			}
			if ok {
				return data, nil
			}
			s.collisions.Add(1)
		}
		if err == nil {
			return nil, ErrNotFound
		}
		if retry, err := s.retryable(err, attempt); !retry {
			return nil, err
		}
	}
}

// GetMany returns the payloads of ids in request order, nil where a record
// is absent. It probes every ID first, then reads the candidate frames
// sorted by (shard, offset), so the physical reads move forward through the
// pool. It does not take the writer lock.
func (s *PackfileStorage) GetMany(coll ID, ids []ID) ([][]byte, error) {
	type cand struct {
		l loc
		i int
	}
	for attempt := 0; ; attempt++ {
		if s.closed.Load() {
			return nil, ErrClosed
		}
		out := make([][]byte, len(ids))
		c := s.collectionLoad(coll)
		if c == nil {
			return out, nil
		}
		t := c.table.Load()
		var cands []cand
		var buf [4]loc
		for i, id := range ids {
			for _, l := range t.candidates(id, buf[:0]) {
				cands = append(cands, cand{l: l, i: i})
			}
		}
		slices.SortFunc(cands, func(a, b cand) int {
			switch {
			case a.l.less(b.l):
				return -1
			case b.l.less(a.l):
				return 1
			}
			return a.i - b.i
		})
		var err error
		for _, cd := range cands {
			if out[cd.i] != nil {
				continue
			}
			var data []byte
			var ok bool
			data, ok, err = s.readRecord(cd.l, coll, ids[cd.i])
			if err != nil {
				break
			}
			if ok {
				out[cd.i] = data
			} else {
				s.collisions.Add(1)
			}
		}
		if err == nil {
			return out, nil
		}
		if retry, err := s.retryable(err, attempt); !retry {
			return nil, err
		}
	}
}
