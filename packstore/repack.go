package packstore

import (
	"cmp"
	"fmt"
	"slices"
)

// repackChunk bounds the frame bytes a repack buffers before appending, and
// those it prefetches at a time (prefetchLocked).
const repackChunk = 4 << 20

// repackPrefetch is how many records' frame heads planJobsLocked prefetches
// at a time. With 2048, the heads of a shuffled plan over a quarter of a
// 128 MB store lay too far apart to merge into large reads, and a cold
// repack took 1.3x as long as with the kernel's read-around; with 16384 it
// took about as long (BenchmarkColdRead, pattern repack).
const repackPrefetch = 16384

// repackJob is one validated collection plan.
type repackJob struct {
	coll  ID
	c     *collection // nil if the collection has no live records
	ids   []ID
	locs  []loc // current location of each listed record
	sizes []int // frame size of each listed record
}

// Repack executes a plan (a CollectionPlan per collection). It writes, through
// the global append stream and starting in a fresh shard, verbatim copies of
// the current frames of exactly the listed records of every collection plan,
// in the listed order (one output stream for all collections), and fsyncs
// them. Only then does it append one reset marker per collection whose
// position P is the start of that collection's copy ("forget every frame of
// the collection before P"; for an empty list P is the marker's own
// position), fsyncs again, publishes each collection's replacement index
// (records not listed are dropped; an empty list empties the collection) and
// retires every shard that nothing references any more (see retireLocked).
//
// Crash safety: the copies are ordinary frames with the same content as the
// frames they supersede, so a crash or I/O error before a collection's
// marker is durable leaves that collection exactly as it was (plus harmless
// duplicates); after its marker is durable a rebuild yields the repacked
// collection. TestRepackCrashAtEveryFrameBoundary checks both.
//
// Before anything is written it checks the plan: a collection listed twice,
// a record listed twice in one collection, or a listed record that does not
// exist is an error (wrapping ErrNotFound for a missing record), and a plan
// that would pass the shard limit returns ErrShardLimit. An empty plan just
// syncs and retires garbage shards.
//
// Errors: until the reset markers are durable, an error leaves the
// in-memory index the old one. The fresh shard is created just before the
// first copy is appended: a repack that fails before that (a corrupt frame
// among the first it reads) creates no shard file. A failed write (out of space, say) or fsync
// of the copies leaves the old shards and index intact, and the copies are
// removed before the error returns: the output shard being written is cut
// back to its header and the output shards filled before it are retired
// (after a failed fsync the store refuses further writes and a reopen
// finds the copies as garbage). After a failure once some markers may be
// durable (a roll among the markers, their fsync), the store refuses
// writes and a reopen shows each collection repacked or as it was. Once
// they are durable the repack has taken effect and the new index is live:
// a failure after that (retiring shards, writing the index checkpoint or
// delta) is returned wrapped with ErrRepackApplied, with complete stats.
// Each error names the file that failed as it is on disk and says which of
// these the store holds.
func (s *PackfileStorage) Repack(plan RepackPlan) (RepackStats, error) {
	var st RepackStats
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writableLocked(); err != nil {
		return st, err
	}
	jobs, err := s.planJobsLocked(plan)
	if err != nil {
		return st, err
	}
	if len(jobs) > 0 {
		sizes := func(yield func(int) bool) {
			for _, j := range jobs {
				for _, n := range j.sizes {
					if !yield(n) {
						return
					}
				}
			}
			for range jobs {
				if !yield(FrameOverhead + markerPosLen) {
					return
				}
			}
		}
		if err := s.checkFitLocked(true, sizes); err != nil {
			return st, err
		}
	}
	defer s.repackProgress.Store(-1)
	// The copies start in an empty shard: the active one when it is empty,
	// else a new one, rolled into just before the first frame is appended
	// (startOut), so that a repack failing before it writes anything (a
	// corrupt frame among the first it reads) leaves no shard file behind.
	out := s.active
	roll := len(jobs) > 0 && s.active.size > HeaderSize
	startOut := func() error {
		if !roll {
			return nil
		}
		if err := s.rollLocked(); err != nil {
			return err
		}
		roll, out = false, s.active
		return nil
	}
	abandon := func(err error) error {
		switch {
		case !roll:
			return s.abandonLocked(out, err)
		case s.broken != nil: // the roll's fsync of the active shard failed
			return fmt.Errorf("packstore: repack: %w; %s on disk (no copy was written), and the store refuses writes until it is reopened", err, repackIntact)
		}
		return fmt.Errorf("packstore: repack: %w; %s (no copy was written)", err, repackIntact)
	}
	tables := make([]*lossyTable, len(jobs))
	bytes := make([]int64, len(jobs))
	starts := make([]pos, len(jobs))
	for i, j := range jobs {
		s.repackProgress.Store(int64(i))
		t, start, n, err := s.copyJobLocked(j, startOut)
		if IsCorruption(err) {
			err = &RepackCorruptError{Collection: j.coll, Err: err}
		}
		if err != nil {
			return st, abandon(err)
		}
		tables[i], bytes[i] = t, n
		if len(j.ids) > 0 {
			starts[i] = s.posOf(start)
		}
		st.CollectionsRepacked++
		st.RecordsCopied += len(j.ids)
		st.BytesCopied += n
	}
	// First durability point: every copy is on disk before any marker that
	// makes the old frames dead is written.
	if err := s.syncActiveLocked(); err != nil {
		return st, abandon(err)
	}
	if len(jobs) > 0 {
		if err := startOut(); err != nil { // no copies: the markers start the shard
			return st, abandon(err)
		}
		if err := s.markLocked(jobs, starts, out); err != nil {
			return st, err
		}
	}
	st.RecordsDropped = s.installLocked(jobs, tables, bytes)
	st.ShardsRetired, st.BytesRetired, err = s.retireLocked()
	if err == nil {
		// The old checkpoint may list retired shards: replace it now, so that
		// only a crash in this window costs a full scan at the next open.
		err = s.flushDeltaLocked(false)
	}
	if err != nil {
		return st, fmt.Errorf("%w: %w; %s", ErrRepackApplied, err, repackApplied)
	}
	return st, nil
}

// markLocked appends one reset marker per job, at the job's first copy
// (starts[i]) or, for an empty list, at the marker's own position, and
// fsyncs them: the second durability point of Repack, after which the
// copies are the collections. out is Repack's output shard, for
// abandonLocked. The error says what the store holds.
func (s *PackfileStorage) markLocked(jobs []repackJob, starts []pos, out *shard) error {
	markers := make([]outFrame, len(jobs))
	end := s.endPosLocked()
	for i, j := range jobs {
		p := starts[i]
		if len(j.ids) == 0 {
			p = end
		}
		markers[i] = s.markerFrameLocked(j.coll, p)
	}
	last := s.active
	if _, err := s.appendLocked(markers); err != nil {
		if s.active != last {
			// A roll fsynced the markers before it: on disk those
			// collections are repacked, in memory not yet.
			s.broken = err
			return fmt.Errorf("packstore: repack: %w; %s", err, repackSplit)
		}
		return s.abandonLocked(out, err)
	}
	if s.testHookAfterMarkers != nil {
		s.testHookAfterMarkers()
	}
	// The markers are on disk before any index refers only to the copies or
	// any shard is deleted.
	if err := s.syncActiveLocked(); err != nil {
		return fmt.Errorf("packstore: repack: %w; %s", err, repackSplit)
	}
	return nil
}

// installLocked publishes the replacement index of each job (tables[i],
// whose copies hold bytes[i] frame bytes), once the reset markers are
// durable: an empty list deletes the collection. It moves the shards' live
// counts from the old frames to the copies and returns the records dropped.
func (s *PackfileStorage) installLocked(jobs []repackJob, tables []*lossyTable, bytes []int64) (dropped int) {
	for i, j := range jobs {
		if j.c != nil {
			dropped += j.c.live - len(j.ids)
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
	return dropped
}

// What the store holds after a failed repack, as its error says.
const (
	// repackIntact: it failed before any reset marker was durable.
	repackIntact = "nothing was repacked: the old shards and index are intact and the store is consistent"
	// repackSplit: some reset markers may be durable, and the in-memory
	// index is the old one.
	repackSplit = "the store is consistent but needs reopening: it shows each collection either repacked or as it was"
	// repackApplied: the markers are durable and the new index is live
	// (ErrRepackApplied).
	repackApplied = "the new index is live and the store is consistent; the next Repack, Sync or Close retries what was left undone, which costs disk space or a longer next open, never records"
)

// abandonLocked handles a repack that failed (cause) before any of its
// reset markers was durable: no index references its copies, which begin
// in out, the shard that was active and empty when the copy began. It
// removes them: the active shard, out or one the copy rolled into, is cut
// back to its header (emptyActiveLocked) and the shards the copy filled
// before it are retired (retireLocked: nothing references them). A store
// that a failed fsync or trim broke is left as it is (it refuses writes;
// a reopen finds the copies as garbage). The error returned wraps cause
// and says what the store holds, and whether the copies are gone.
func (s *PackfileStorage) abandonLocked(out *shard, cause error) error {
	if s.broken != nil {
		return fmt.Errorf("packstore: repack: %w; %s on disk; the copies written are garbage the next repack reclaims, and the store refuses writes until it is reopened", cause, repackIntact)
	}
	err := s.emptyActiveLocked(out)
	if err == nil {
		_, _, err = s.retireLocked()
	}
	if err != nil {
		return fmt.Errorf("packstore: repack: %w; %s, but removing the copies written failed (%v): they are garbage the next repack reclaims", cause, repackIntact, err)
	}
	return fmt.Errorf("packstore: repack: %w; %s (the copies written were removed)", cause, repackIntact)
}

// emptyActiveLocked cuts the active shard back to its header, dropping the
// frames appended to it since out (the shard it or an earlier one was,
// empty) and the pending delta entries of those frames. The caller knows
// that no index slot and no durable index file refers to them: a delta
// entry is written only once its frame's shard is fsynced in a roll, and
// the roll into this shard, if there was one, wrote none for it.
func (s *PackfileStorage) emptyActiveLocked(out *shard) error {
	a := s.active
	if a.seq < out.seq {
		return fmt.Errorf("packstore: repack: active shard %s precedes its output shard %s", a.path, out.path)
	}
	if a.alloc == HeaderSize {
		return nil
	}
	if len(a.mm) > HeaderSize {
		// Sealed by a roll whose next shard could not be created.
		if err := a.remap(HeaderSize); err != nil {
			return err
		}
	}
	if err := a.f.Truncate(HeaderSize); err != nil {
		return fmt.Errorf("packstore: truncate %s to its header: %w", a.path, pathless(err))
	}
	a.size, a.alloc, a.synced = HeaderSize, HeaderSize, false
	clear(a.colls)
	clear(a.resets)
	kept := s.pending[:0]
	for b := s.pending; len(b) >= deltaEntryLen; b = b[deltaEntryLen:] {
		if m, err := decodeDeltaEntry(b); err == nil && !m.newShard && m.at.shard == a.id {
			continue
		}
		kept = append(kept, b[:deltaEntryLen]...)
	}
	s.pending = kept
	return nil
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
		var cands []loc
		for i, id := range cp.Records {
			if i%repackPrefetch == 0 && c != nil {
				// Ask for the frame heads lookupLocked reads, in file order.
				cands = cands[:0]
				for _, id := range cp.Records[i:min(i+repackPrefetch, len(cp.Records))] {
					cands = c.table.Load().candidates(id, cands)
				}
				if err := s.prefetchLocked(cands, nil); err != nil {
					return nil, err
				}
			}
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
				return nil, fmt.Errorf("packstore: repack: %w", &RepackMissingError{Collection: cp.Collection, Record: id})
			}
		}
		jobs = append(jobs, j)
	}
	return jobs, nil
}

// copyJobLocked appends copies of the listed frames of one job and returns
// the (unpublished) replacement index, the position of the first copy (the
// job's marker position; zero when nothing was listed) and the bytes copied.
// start runs before each append of frames (Repack's roll into its output
// shard).
func (s *PackfileStorage) copyJobLocked(j repackJob, start func() error) (*lossyTable, loc, int64, error) {
	t := newTable(tableBitsFor(len(j.ids)))
	var copied int64
	var at loc // the first copy's
	first := true
	var frames []outFrame
	pending := 0
	flush := func() error {
		if len(frames) > 0 {
			if err := start(); err != nil {
				return err
			}
		}
		locs, err := s.appendLocked(frames)
		if err != nil {
			return err
		}
		for i, fr := range frames {
			if first {
				at, first = locs[i], false
			}
			t.insertUnique(makeSlot(fr.id, locs[i]), fr.id)
			copied += int64(len(fr.b))
		}
		frames, pending = frames[:0], 0
		return nil
	}
	var scratch []byte // recompress's
	next := 0          // first record not yet prefetched
	for i, id := range j.ids {
		if i == next {
			for n := 0; next < len(j.ids) && n < repackChunk; next++ {
				n += j.sizes[next]
			}
			if err := s.prefetchLocked(j.locs[i:next], j.sizes[i:next]); err != nil {
				return nil, loc{}, 0, err
			}
		}
		l := j.locs[i]
		sh := s.shards[l.shard].Load()
		b, err := sh.rawFrame(int64(l.off), nil, s.active.crc)
		if err != nil {
			return nil, loc{}, 0, err
		}
		b, scratch = s.recompress(b, scratch)
		frames = append(frames, outFrame{coll: j.coll, id: id, b: b})
		pending += len(b)
		if pending >= repackChunk {
			if err := flush(); err != nil {
				return nil, loc{}, 0, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, loc{}, 0, err
	}
	return t, at, copied, nil
}

// retireLocked deletes every shard that (a) no index slot references, (b) is
// not the active shard and (c) holds no reset marker for a collection X with
// position P while another surviving shard holds a data frame of X located
// before P (deleting the marker would let a rebuild-by-scan resurrect it),
// counting only X's marker with the largest P of any shard: it drops all
// that an older one would. Shards are unmapped (waiting for readers) before
// their files are removed, and the directory is fsynced after.
func (s *PackfileStorage) retireLocked() (int, int64, error) {
	cand := make(map[uint16]*shard)
	var all []*shard
	newest := make(map[ID]pos) // collection -> largest P of its reset markers in any shard
	for i := range s.shards {
		sh := s.shards[i].Load()
		if sh == nil {
			continue
		}
		all = append(all, sh)
		if sh.live == 0 && sh != s.active {
			cand[sh.id] = sh
		}
		for x, p := range sh.resets {
			if q, ok := newest[x]; !ok || q.less(p) {
				newest[x] = p
			}
		}
	}
	slices.SortFunc(all, func(a, b *shard) int { return cmp.Compare(a.seq, b.seq) }) // stream order
	for changed := true; changed; {
		changed = false
		for id, sh := range cand {
			if s.markerNeededLocked(sh, all, cand, newest) {
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
	if len(ids) > 0 {
		// Detach the shards and write a checkpoint without them before any file
		// is removed: a shard the checkpoint lists is then never legitimately
		// missing, so Open can treat a missing one as lost data.
		s.retirements.Add(1) // before any pack ID can be taken again
		for _, id := range ids {
			s.shards[id].Store(nil)
		}
		if err := s.writeCheckpointLocked(); err != nil {
			for _, id := range ids {
				s.shards[id].Store(cand[id])
			}
			return 0, 0, err
		}
	}
	for _, id := range ids {
		sh := cand[id]
		if err := sh.close(); err != nil {
			return n, bytes, err
		}
		if err := s.fs.Remove(sh.path); err != nil {
			return n, bytes, fmt.Errorf("packstore: retire %s: %w", sh.path, err)
		}
		n++
		bytes += sh.size
	}
	if n > 0 {
		s.ckptStale = true
		if err := syncDir(s.fs, s.opts.Dir); err != nil {
			return n, bytes, err
		}
	}
	return n, bytes, nil
}

// markerNeededLocked reports whether sh holds a reset marker that still
// shadows a data frame in another surviving shard. all is in stream order
// (sorted by sequence number); newest is each collection's largest marker
// position in any shard.
//
// Only the newest marker of a collection X can be needed: a rebuild by scan
// drops every frame of X before it, which includes every frame an older
// marker drops, and while a data frame of X before it survives so does the
// newest marker's shard (this function keeps it); once none does, no older
// marker shadows anything either. Counting older markers too let repacks of
// X pin a shard each, for as long as an old shard held both a dead frame of
// X and live records of another collection: crashes that repeated one
// round's repack pinned all 16 pack IDs of TestPackIDReuseKill
// (TestRepacksBesideAnOldShard).
func (s *PackfileStorage) markerNeededLocked(sh *shard, all []*shard, cand map[uint16]*shard, newest map[ID]pos) bool {
	for x, p := range sh.resets {
		if p.less(newest[x]) {
			continue // superseded by a newer marker of x
		}
		for _, lower := range all {
			if lower.seq > p.seq {
				break
			}
			if _, dying := cand[lower.id]; dying || lower == sh {
				continue
			}
			if first, ok := lower.colls[x]; ok && (lower.seq < p.seq || first < p.off) {
				return true
			}
		}
	}
	return false
}

// recompress returns the copy b of a validated frame compressed, when it was
// written uncompressed (a batch below Options.InlineCompressMin, or an
// earlier attempt that did not shrink it), Compress is on and zstd makes it
// smaller; otherwise b itself. Only smaller, so the sizes checkFitLocked
// counted stay an upper bound. scratch is reused and returned.
func (s *PackfileStorage) recompress(b, scratch []byte) ([]byte, []byte) {
	if !s.opts.Compress {
		return b, scratch
	}
	fv, err := decodeFrameCRC(b, false)
	if err != nil || fv.Flags != 0 || len(fv.Payload) < compressMin {
		return b, scratch
	}
	out, scratch, err := s.encodeRecord(nil, scratch, fv.Coll, fv.ID, fv.Payload, zstdEntropy, true)
	if err != nil || len(out) >= len(b) {
		return b, scratch
	}
	return out, scratch
}
