package packstore

import (
	"fmt"
	"os"
	"slices"
)

// repackChunk bounds the frame bytes a repack buffers before appending.
const repackChunk = 4 << 20

// repackJob is one validated collection plan.
type repackJob struct {
	coll  ID
	c     *collection // nil if the collection has no live records
	ids   []ID
	locs  []loc // current location of each listed record
	sizes []int // frame size of each listed record
}

// Repack executes a plan (seed "Topological repack"). For each collection
// plan it writes, through the global append stream and starting in a fresh
// shard, a collection reset marker followed by verbatim copies of the
// current frames of exactly the listed records, in the listed order. It then
// fsyncs the output, publishes each collection's replacement index (records
// not listed are dropped; an empty list empties the collection) and retires
// every shard that nothing references any more (see retireLocked).
//
// Before anything is written it checks the plan: a collection listed twice,
// a record listed twice in one collection, or a listed record that does not
// exist is an error (wrapping ErrNotFound for a missing record), and a plan
// that would pass the shard limit returns ErrShardLimit. An empty plan just
// syncs and retires garbage shards.
//
// Known gap: an I/O error in the middle of the copy leaves written but
// unpublished frames; the in-memory state stays the old one, but a reopen
// would replay them.
func (s *PackfileStorage) Repack(plan RepackPlan) (RepackStats, error) {
	var st RepackStats
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return st, ErrClosed
	}
	jobs, err := s.planJobsLocked(plan)
	if err != nil {
		return st, err
	}
	if len(jobs) > 0 {
		sizes := func(yield func(int) bool) {
			for _, j := range jobs {
				if !yield(FrameOverhead) {
					return
				}
				for _, n := range j.sizes {
					if !yield(n) {
						return
					}
				}
			}
		}
		if err := s.checkFitLocked(true, sizes); err != nil {
			return st, err
		}
		if s.active.size > HeaderSize {
			if err := s.rollLocked(); err != nil {
				return st, err
			}
		}
	}
	tables := make([]*lossyTable, len(jobs))
	bytes := make([]int64, len(jobs))
	for i, j := range jobs {
		t, n, err := s.copyJobLocked(j)
		if err != nil {
			return st, err
		}
		tables[i], bytes[i] = t, n
		st.CollectionsRepacked++
		st.RecordsCopied += len(j.ids)
		st.BytesCopied += n
	}
	// Durability point: the output (and any Put before it) reaches disk
	// before any index refers to it or any shard is deleted.
	if err := s.active.syncFile(); err != nil {
		return st, err
	}
	for i, j := range jobs {
		if j.c != nil {
			st.RecordsDropped += j.c.live - len(j.ids)
			j.c.table.Load().each(func(l loc) { s.shards[l.shard].Load().live-- })
		}
		if len(j.ids) == 0 {
			s.colls.Delete(j.coll)
			continue
		}
		tables[i].each(func(l loc) { s.shards[l.shard].Load().live++ })
		c := j.c
		if c == nil {
			c = &collection{}
		}
		c.live, c.liveBytes = len(j.ids), bytes[i]
		c.table.Store(tables[i])
		if j.c == nil {
			s.colls.Store(j.coll, c)
		}
	}
	st.ShardsRetired, st.BytesRetired, err = s.retireLocked()
	return st, err
}

// planJobsLocked validates a plan and resolves each record's location.
func (s *PackfileStorage) planJobsLocked(plan RepackPlan) ([]repackJob, error) {
	var jobs []repackJob
	seenColl := make(map[ID]bool, len(plan.Collections))
	for _, cp := range plan.Collections {
		if seenColl[cp.Collection] {
			return nil, fmt.Errorf("packstore: repack: collection %s listed twice", cp.Collection)
		}
		seenColl[cp.Collection] = true
		c := s.collectionLoad(cp.Collection)
		if c == nil && len(cp.Records) == 0 {
			continue // nothing on disk is live for it
		}
		j := repackJob{coll: cp.Collection, c: c, ids: cp.Records,
			locs: make([]loc, len(cp.Records)), sizes: make([]int, len(cp.Records))}
		seen := make(map[ID]bool, len(cp.Records))
		for i, id := range cp.Records {
			if seen[id] {
				return nil, fmt.Errorf("packstore: repack: collection %s: record %s listed twice", cp.Collection, id)
			}
			seen[id] = true
			found := false
			if c != nil {
				var err error
				j.locs[i], j.sizes[i], found, err = s.lookupLocked(c, id)
				if err != nil {
					return nil, err
				}
			}
			if !found {
				return nil, fmt.Errorf("packstore: repack: collection %s record %s: %w", cp.Collection, id, ErrNotFound)
			}
		}
		jobs = append(jobs, j)
	}
	return jobs, nil
}

// copyJobLocked appends the reset marker and the listed frames of one job
// and returns the (unpublished) replacement index and the bytes copied.
func (s *PackfileStorage) copyJobLocked(j repackJob) (*lossyTable, int64, error) {
	t := newTable(tableBitsFor(len(j.ids)))
	var copied int64
	frames := []outFrame{{coll: j.coll, marker: true, b: appendFrame(nil, FlagReset, 0, j.coll, ID{}, nil)}}
	pending := FrameOverhead
	flush := func() error {
		locs, err := s.appendLocked(frames)
		if err != nil {
			return err
		}
		for i, fr := range frames {
			if !fr.marker {
				t.insertUnique(makeSlot(fr.id, locs[i]), fr.id)
				copied += int64(len(fr.b))
			}
		}
		frames, pending = frames[:0], 0
		return nil
	}
	for i, id := range j.ids {
		l := j.locs[i]
		sh := s.shards[l.shard].Load()
		b, err := sh.rawFrame(int64(l.off), nil)
		if err != nil {
			return nil, 0, err
		}
		frames = append(frames, outFrame{coll: j.coll, id: id, b: b})
		pending += len(b)
		if pending >= repackChunk {
			if err := flush(); err != nil {
				return nil, 0, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, 0, err
	}
	return t, copied, nil
}

// retireLocked deletes every shard that (a) no index slot references, (b) is
// not the active shard and (c) holds no reset marker for a collection X
// while a surviving shard with a lower pack ID holds frames of X (deleting
// the marker would let a rebuild-by-scan resurrect those frames). Shards are
// unmapped (waiting for readers) before their files are removed, and the
// directory is fsynced after.
func (s *PackfileStorage) retireLocked() (int, int64, error) {
	cand := make(map[uint16]*shard)
	var all []*shard
	for i := range s.shards {
		sh := s.shards[i].Load()
		if sh == nil {
			continue
		}
		all = append(all, sh)
		if sh.live == 0 && sh != s.active {
			cand[sh.id] = sh
		}
	}
	for changed := true; changed; {
		changed = false
		for id, sh := range cand {
			if s.markerNeededLocked(sh, all, cand) {
				delete(cand, id)
				changed = true
			}
		}
	}
	ids := make([]uint16, 0, len(cand))
	for id := range cand {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var n int
	var bytes int64
	for _, id := range ids {
		sh := cand[id]
		s.shards[id].Store(nil)
		if err := sh.close(); err != nil {
			return n, bytes, err
		}
		if err := os.Remove(sh.path); err != nil {
			return n, bytes, fmt.Errorf("packstore: retire %s: %w", sh.path, err)
		}
		n++
		bytes += sh.size
	}
	if n > 0 {
		if err := syncDir(s.opts.Dir); err != nil {
			return n, bytes, err
		}
	}
	return n, bytes, nil
}

// markerNeededLocked reports whether sh holds a reset marker that still
// shadows frames in a lower surviving shard.
func (s *PackfileStorage) markerNeededLocked(sh *shard, all []*shard, cand map[uint16]*shard) bool {
	for x := range sh.resets {
		for _, lower := range all {
			if lower.id >= sh.id {
				break
			}
			if _, dying := cand[lower.id]; dying {
				continue
			}
			if _, ok := lower.colls[x]; ok {
				return true
			}
		}
	}
	return false
}
