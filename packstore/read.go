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
	dec, err := codecs()
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

// readRecord returns an owned copy of the payload of (coll, id) at l, from
// the cache or the frame. ok=false means a tag collision (another record).
func (s *PackfileStorage) readRecord(l loc, coll, id ID, kind ReadKind) (data []byte, ok bool, err error) {
	err = s.viewRecord(l, coll, id, kind, func(b []byte, owned bool) error {
		data, ok = b, true
		if !owned {
			data = append([]byte{}, b...)
		}
		return nil
	})
	return data, ok, err
}

// viewRecord calls fn with the payload of (coll, id) at l, unless the frame
// there holds another record ID (a tag collision: fn is not called). b is
// a cached or freshly decoded buffer (owned=true: fn may keep it) or the
// mapped frame bytes (owned=false: valid only during fn, while the shard's
// read lock keeps it mapped).
func (s *PackfileStorage) viewRecord(l loc, coll, id ID, kind ReadKind, fn func(b []byte, owned bool) error) error {
	sh := s.shards[l.shard].Load()
	if sh == nil {
		return errShardGone
	}
	p := pos{seq: sh.seq, off: l.off} // the cache key: pack IDs are reused, sequence numbers are not
	if s.cache != nil {
		if e, ok := s.cache.get(p); ok && e.coll == coll {
			if e.id != id {
				return nil
			}
			s.reads.cacheHit(kind)
			return fn(e.data, false)
		}
	}
	off := int64(l.off)
	pread := s.pread[kind]
	if !pread {
		s.mappedReads.Add(1)
	}
	err := sh.withFrame(off, pread, func(fv frameView) error {
		s.reads.physical(kind, l.shard, off, FrameOverhead+len(fv.Payload))
		if fv.Flags&FlagReset != 0 {
			return sh.corruptf(off, "index points at a reset marker")
		}
		if fv.ID != id {
			return nil
		}
		if fv.Coll != coll {
			return sh.corruptf(off, "frame of record %s belongs to collection %s, index of %s", id, fv.Coll, coll)
		}
		if fv.Flags&FlagZstd == 0 {
			if s.cache != nil {
				s.cache.put(p, coll, id, fv.Payload)
			}
			return fn(fv.Payload, false)
		}
		data, err := decodePayload(sh, off, fv)
		if err != nil {
			return err
		}
		if s.cache != nil {
			s.cache.put(p, coll, id, data)
		}
		return fn(data, true)
	})
	if errors.Is(err, ErrCorrupt) {
		// A damaged frame whose head names another record is not id's: the
		// writer, unable to match it to id, gave id a slot of its own.
		if got, _, herr := sh.frameHead(off, true); herr == nil && got != id {
			return otherRecordError{err}
		}
	}
	return err
}

// otherRecordError wraps the ErrCorrupt error of a damaged frame whose head
// (unchecked by its CRC) names another record than the one looked up: find
// goes on to the next candidate and returns the error only when none holds
// the record.
type otherRecordError struct{ error }

func (e otherRecordError) Unwrap() error { return e.error }

// find probes coll's current index generation for id and calls visit on
// each candidate location in probe order until one reports found. It
// retries with a fresh generation when a concurrent repack retired a shard
// the loaded generation pointed to (see staleRead). It returns ErrNotFound,
// ErrClosed or visit's error.
func (s *PackfileStorage) find(coll, id ID, visit func(l loc) (found bool, err error)) error {
	var cands [4]loc
	for attempt := 0; ; attempt++ {
		if s.closed.Load() {
			return ErrClosed
		}
		epoch := s.retirements.Load()
		c := s.collectionLoad(coll)
		if c == nil {
			return ErrNotFound
		}
		var err, other error
		probe := c.table.Load().candidates(id, cands[:0])
		if s.testHookProbed != nil {
			s.testHookProbed()
		}
		for _, l := range probe {
			var found bool
			if found, err = visit(l); err != nil {
				var o otherRecordError
				if errors.As(err, &o) && other == nil {
					other, err = err, nil // a later candidate may hold id
					continue
				}
				break
			}
			if found {
				return nil
			}
			s.collisions.Add(1)
		}
		if err == nil {
			err = other
		}
		if err == nil {
			err = ErrNotFound
		}
		if s.staleRead(epoch, attempt) {
			continue
		}
		if retry, err := s.retryable(err, attempt); !retry {
			return err
		}
	}
}

// staleRead reports whether a read that failed (or found nothing) may have
// followed a stale slot: a shard was retired since the reader loaded the
// retirement count epoch, so a slot it read may name a pack ID that a new
// shard has taken since, and the frame it read there is another. Retrying
// with a fresh index generation is then the answer, up to maxReadRetries.
// Reads that succeed need no check: a frame with the requested collection,
// record ID and a valid CRC in the new shard is a copy of the record
// written after the reader started.
func (s *PackfileStorage) staleRead(epoch uint64, attempt int) bool {
	return attempt < maxReadRetries && s.retirements.Load() != epoch
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
// collection has no such record, an ErrCorrupt error naming shard and
// offset if its frame fails the checks (CRC in checksum mode "full"), or
// ErrClosed. It does not take the writer lock.
func (s *PackfileStorage) Get(coll, id ID) ([]byte, error) {
	return s.GetKind(coll, id, ReadUntagged)
}

// View calls fn with the record's payload without copying it when the
// frame is stored raw: b aliases the shard's read-only mapping (or a cache
// entry) and is valid only until fn returns; fn must not modify or retain
// it. While fn runs the shard stays mapped even if a repack retires it
// (retirement waits for the view), so keep fn short: sealing and retiring
// that shard wait for it. Compressed frames are decoded into a fresh
// buffer. Errors: as Get, or fn's error.
func (s *PackfileStorage) View(coll, id ID, fn func(b []byte) error) error {
	defer s.releaseIfDue()
	return s.find(coll, id, func(l loc) (bool, error) {
		found := false
		err := s.viewRecord(l, coll, id, ReadUntagged, func(b []byte, _ bool) error {
			found = true
			return fn(b)
		})
		return found, err
	})
}

// GetMany returns the payloads of ids in request order, nil where a record
// is absent. It probes every ID first, then reads the candidate frames
// sorted by (shard, offset), so the physical reads move forward through the
// pool. It does not take the writer lock.
//
// A record that cannot be read (its frame fails the checks, or reading it
// fails) does not fail the batch: every other record is still returned,
// and the error is a *RecordErrors holding one error per requested ID (nil
// where the record was read or is absent); it matches ErrCorrupt through
// errors.Is (IsCorruption) when a failure was corruption. Only ErrClosed
// fails the whole batch (the slice is then nil).
func (s *PackfileStorage) GetMany(coll ID, ids []ID) ([][]byte, error) {
	defer s.releaseIfDue()
	type cand struct {
		l loc
		i int
	}
	for attempt := 0; ; attempt++ {
		if s.closed.Load() {
			return nil, ErrClosed
		}
		epoch := s.retirements.Load()
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
		var errs []error // per request index, allocated on the first failure
		var err error    // a failure of the whole batch (retried if a shard was retired)
		for _, cd := range cands {
			if out[cd.i] != nil {
				continue
			}
			data, ok, rerr := s.readRecord(cd.l, coll, ids[cd.i], ReadUntagged)
			switch {
			case errors.Is(rerr, errShardGone):
				err = rerr
			case rerr != nil:
				// This candidate may be a tag collision and a later one the
				// record: the error stands only if none is.
				if errs == nil {
					errs = make([]error, len(ids))
				}
				if errs[cd.i] == nil {
					errs[cd.i] = rerr
				}
			case ok:
				out[cd.i] = data
				if errs != nil {
					errs[cd.i] = nil
				}
			default:
				s.collisions.Add(1)
			}
			if err != nil {
				break
			}
		}
		if err == nil {
			failed := slices.ContainsFunc(errs, func(e error) bool { return e != nil })
			if (failed || slices.ContainsFunc(out, func(b []byte) bool { return b == nil })) && s.staleRead(epoch, attempt) {
				continue
			}
			if failed {
				return out, &RecordErrors{Errs: errs}
			}
			return out, nil
		}
		if retry, err := s.retryable(err, attempt); !retry {
			return nil, err
		}
	}
}

// RecordErrors is the error GetMany returns when some records of a batch
// could not be read while the others were. Errs has one entry per
// requested ID, in request order: nil where the record was read or is
// absent, otherwise why it could not be read (an ErrCorrupt error naming
// shard file and offset, or an I/O error). It unwraps to the non-nil
// errors, so errors.Is(err, ErrCorrupt) and IsCorruption hold when any
// failure was corruption. GetMany does not modify it after returning it:
// it is safe for concurrent reads.
type RecordErrors struct {
	Errs []error
}

// Error says how many records failed and quotes the first failure.
func (e *RecordErrors) Error() string {
	n, first := 0, -1
	for i, err := range e.Errs {
		if err != nil {
			n++
			if first < 0 {
				first = i
			}
		}
	}
	if first < 0 {
		return "packstore: no record failed"
	}
	return fmt.Sprintf("packstore: %d of %d records could not be read; request index %d: %v", n, len(e.Errs), first, e.Errs[first])
}

// Unwrap returns the non-nil per-record errors.
func (e *RecordErrors) Unwrap() []error {
	var out []error
	for _, err := range e.Errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}
