package statetables

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/matrix-org/dendrite/roomserver/storage/tables"
	"github.com/matrix-org/dendrite/roomserver/types"
	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/pgstore"
)

// ctx0 is the context of the calls Dendrite gives none (State, ImportSnapshot).
var ctx0 = context.Background()

var (
	_ tables.StateSnapshot = (*Store)(nil)
	_ tables.StateBlock    = (*Store)(nil)
)

// room returns the write state of a room, creating it on first use.
func (s *Store) room(roomNID types.RoomNID) *room {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.rooms[roomNID]
	if !ok {
		r = &room{nid: roomNID, coll: RoomCollection(roomNID)}
		s.rooms[roomNID] = r
	}
	return r
}

// load reads the room's lease record once (packstore); the caller holds r.mu.
func (s *Store) load(r *room) error {
	if r.loaded {
		return nil
	}
	b, err := s.eng.Get(r.coll, leaseRecordID)
	switch {
	case errors.Is(err, packstore.ErrNotFound):
		r.next, r.leaseEnd = 1, 0
	case err != nil:
		return fmt.Errorf("statetables: room NID %d: lease record: %w", r.nid, err)
	default:
		end, err := decodeU32('L', b)
		if err != nil {
			return fmt.Errorf("room NID %d: %w", r.nid, err)
		}
		r.next, r.leaseEnd = end, end
	}
	r.loaded = true
	return nil
}

// nextSeq hands out the room's next snapshot seq; the caller holds r.mu. On
// packstore, lease is the lease record to append in the same batch as the snapshot
// (nil while the seq is below the lease end) and done, called once that batch is
// durable, moves the lease end. On PostgreSQL, when this Store's range of seqs is
// used up it takes the next LeaseStep seqs of the room by compare-and-set of the
// lease record, committed on its own before the seq is handed out (outside
// Dendrite's transaction: a rolled-back snapshot skips its seq, never reuses it);
// lease is nil and done does nothing.
func (s *Store) nextSeq(ctx context.Context, r *room) (seq uint32, lease []packstore.Record, done func(), err error) {
	if s.db == nil {
		if err := s.load(r); err != nil {
			return 0, nil, nil, err
		}
		if r.next == 0 || r.next >= maxSeq {
			return 0, nil, nil, fmt.Errorf("statetables: room NID %d has used all %d snapshot NIDs", r.nid, uint64(maxSeq))
		}
		seq = r.next
		newEnd := r.leaseEnd
		if seq >= r.leaseEnd {
			newEnd = uint32(min(uint64(seq)+LeaseStep, maxSeq))
			lease = []packstore.Record{{ID: leaseRecordID, Data: encodeU32('L', newEnd)}}
		}
		r.next++ // never handed out twice, even when the append fails
		return seq, lease, func() { r.leaseEnd = newEnd }, nil
	}
	for attempt := 0; !r.loaded || r.next >= r.leaseEnd; attempt++ {
		if attempt == 100 {
			return 0, nil, nil, fmt.Errorf("statetables: room NID %d: lease record: 100 compare-and-set conflicts in a row", r.nid)
		}
		v := pgstore.OverSQL(ctx, s.db)
		old, err := v.Get(r.coll, leaseRecordID)
		start := uint32(1)
		switch {
		case errors.Is(err, packstore.ErrNotFound):
			old = nil
		case err != nil:
			return 0, nil, nil, fmt.Errorf("statetables: room NID %d: lease record: %w", r.nid, err)
		default:
			if start, err = decodeU32('L', old); err != nil || start == 0 {
				return 0, nil, nil, fmt.Errorf("room NID %d: lease record %x: %v", r.nid, old, err)
			}
		}
		if start >= maxSeq {
			return 0, nil, nil, fmt.Errorf("statetables: room NID %d has used all %d snapshot NIDs", r.nid, uint64(maxSeq))
		}
		end := uint32(min(uint64(start)+LeaseStep, maxSeq))
		if leaseHook != nil {
			leaseHook()
		}
		err = v.PutIf(r.coll, leaseRecordID, encodeU32('L', end), old)
		if errors.Is(err, packstore.ErrConflict) {
			continue // another Store took a range first: read its end
		}
		if err != nil {
			return 0, nil, nil, fmt.Errorf("statetables: room NID %d: lease record: %w", r.nid, err)
		}
		r.next, r.leaseEnd, r.loaded = start, end, true
	}
	seq = r.next
	r.next++
	return seq, nil, func() {}, nil
}

// leaseHook, when set (tests only), runs between nextSeq's read of the lease
// record and its compare-and-set.
var leaseHook func()

// locate returns the room and HAMT root of a snapshot NID; ok is false when there
// is none (0, a delta NID, an unknown NID). It reads through s.at(ctx, txn). The
// root's nodes may need materialising before they are read (use).
func (s *Store) locate(ctx context.Context, txn *sql.Tx, nid types.StateSnapshotNID) (types.RoomNID, hamtstore.NodeID, bool, error) {
	ref, ok, err := s.ref(ctx, txn, nid)
	return ref.room, ref.root, ok, err
}

// nidOf returns the NID of a room's snapshot with this root; ok is false when none.
// It reads through s.at(ctx, txn).
func (s *Store) nidOf(ctx context.Context, txn *sql.Tx, r *room, root hamtstore.NodeID) (types.StateSnapshotNID, bool, error) {
	key := roomRoot{r.nid, root}
	if nid, ok := s.seqs.Get(key); ok {
		return nid, true, nil
	}
	b, err := s.at(ctx, txn).Get(r.coll, rootRecordID(root))
	if errors.Is(err, packstore.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("statetables: room NID %d: root record %x: %w", r.nid, root[:], err)
	}
	nid, err := decodeU64('R', b)
	if err != nil {
		return 0, false, fmt.Errorf("room NID %d: %w", r.nid, err)
	}
	if s.cacheable(txn) {
		s.seqs.Add(key, types.StateSnapshotNID(nid))
	}
	return types.StateSnapshotNID(nid), true, nil
}

// deltaChanges turns a delta's entries into HAMT changes: sorted by event NID so
// that the highest event NID of a key is applied last and wins (Dendrite's SQL
// sorts a block by event NID and LoadStateAtSnapshot keeps the last per key).
func deltaChanges(entries []types.StateEntry) []hamtstore.Change {
	sorted := slices.Clone(entries)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].EventNID < sorted[j].EventNID })
	ch := make([]hamtstore.Change, len(sorted))
	for i, e := range sorted {
		ch[i] = hamtstore.Change{Key: stateKey(e.StateKeyTuple), Value: eventValue(e.EventNID)}
	}
	return ch
}

// InsertState stores the state that the blocks make, merged in the order given (a
// later block's entry for a key replaces an earlier one), as one snapshot of the
// room, and returns its NID: the existing NID when the room already has this state.
// Blocks are snapshot NIDs of the same room or delta NIDs of BulkInsertStateData.
// On packstore the NID is durable when returned (group commit) and txn is not used;
// on PostgreSQL the records are written in txn (or, txn nil, committed before the
// NID is returned): doc.go "Durability and Dendrite's SQL transaction". Errors name
// the block and room: unknown block, block of another room, room NID out of range,
// engine errors, ErrBroken.
func (s *Store) InsertState(ctx context.Context, txn *sql.Tx, roomNID types.RoomNID, stateBlockNIDs types.StateBlockNIDs) (types.StateSnapshotNID, error) {
	start := time.Now()
	if err := checkRoom(roomNID); err != nil {
		return 0, err
	}
	if err := s.commit.broken(); err != nil {
		return 0, err
	}
	r := s.room(roomNID)
	r.mu.Lock()
	locked := true
	defer func() {
		if locked {
			r.mu.Unlock()
		}
	}()

	rec := s.at(ctx, txn)
	ns := s.roomNodes(rec, roomNID)
	ov := &overlay{base: ns, nodes: map[hamtstore.NodeID][]byte{}}
	rd := hamtstore.NewReader(ov)
	root, prev, chained, err := s.foldBlocks(ctx, txn, roomNID, stateBlockNIDs, ns, ov, rd)
	if err != nil {
		return 0, err
	}

	if nid, ok, err := s.nidOf(ctx, txn, r, root); err != nil || ok {
		if ok {
			snapshotsInserted.WithLabelValues("existing").Inc()
		}
		return nid, err
	}
	if !chained {
		if last, ok := s.mergeBase(ctx, txn, r, ns, rd, root); ok {
			prev, chained = last, true
		}
	}
	seq, lease, leaseDone, err := s.nextSeq(ctx, r)
	if err != nil {
		return 0, err
	}
	if s.db != nil {
		// PostgreSQL: no Go lock is held while the database may make this write
		// wait for another transaction's row locks (that transaction's goroutine
		// may need r.mu before it commits).
		r.mu.Unlock()
		locked = false
	}
	nid := SnapshotNID(roomNID, seq)
	ref := snapRef{room: roomNID, root: root, seq: seq}
	var recs []packstore.Record
	var l *layer
	if chained {
		var data []byte
		if ref, data, l, err = s.chain(ctx, txn, ns, rd, prev, ref); err != nil {
			return 0, fmt.Errorf("InsertState room NID %d: %w", roomNID, err)
		}
		recs = append(recs, packstore.Record{ID: snapshotRecordID(seq), Data: data})
	} else {
		if recs, err = s.newNodes(rec, ov, rd, ns, r, root); err != nil {
			return 0, err
		}
		recs = append(recs, packstore.Record{ID: snapshotRecordID(seq), Data: encodeSnapshot(root)})
	}
	nodes := len(recs) - 1 // a checkpoint's new nodes
	recs = append(recs, packstore.Record{ID: rootRecordID(root), Data: encodeU64('R', uint64(nid))})
	recs = append(recs, lease...)
	if err := rec.PutMany(r.coll, recs); err != nil {
		return 0, fmt.Errorf("statetables: InsertState room NID %d: %w", roomNID, err)
	}
	if err := s.durable(); err != nil {
		return 0, err
	}
	observeWrite(start, recs)
	leaseDone()
	if s.nodes != nil {
		for _, n := range recs[:nodes] {
			s.nodes.add(hamtstore.NodeID(n.ID), n.Data) // a node ID names its bytes: see nodeStore
		}
	}
	if s.db != nil {
		r.mu.Lock()
	}
	r.last = ref
	if s.db != nil {
		r.mu.Unlock()
	}
	if l != nil {
		s.layers.add(nid, l) // as materialise would make it: see there why a transaction's may enter
	}
	if s.cacheable(txn) {
		s.roots.Add(nid, ref)
		s.seqs.Add(roomRoot{roomNID, root}, nid)
	}
	s.deriveEntries(prev, nid, rd, root)
	return nid, nil
}

// deriveEntries caches the event NIDs of the new snapshot nid (state root, read
// through rd) when those of prev, the snapshot its first block named, are
// cached: prev's with the entries that differ replaced, so that Dendrite's next
// read of the whole state (BulkSelectStateBlockEntries, once per event) does not
// iterate the trie. Nothing is cached when the diff fails (the next read
// iterates and reports it).
func (s *Store) deriveEntries(prev snapRef, nid types.StateSnapshotNID, rd *hamtstore.Reader, root hamtstore.NodeID) {
	if prev.seq == 0 {
		return
	}
	before, ok := s.entries.Get(SnapshotNID(prev.room, prev.seq))
	if !ok {
		return
	}
	var gone, added []types.EventNID
	err := rd.Diff(prev.root, root, func(_ []byte, old, new *hamtstore.Value) error {
		for _, v := range []struct {
			val  *hamtstore.Value
			list *[]types.EventNID
		}{{old, &gone}, {new, &added}} {
			if v.val == nil {
				continue
			}
			ev, err := valueEvent(*v.val)
			if err != nil {
				return err
			}
			*v.list = append(*v.list, ev)
		}
		return nil
	})
	if err != nil {
		return
	}
	if ev, ok := replaceSorted(before, gone, added); ok {
		s.entries.Add(nid, ev)
	}
}

// replaceSorted returns the ascending list ev (not changed) with one occurrence
// of each NID of gone removed and those of added inserted; ok is false when a NID
// of gone is not in ev.
func replaceSorted(ev, gone, added []types.EventNID) (out []types.EventNID, ok bool) {
	slices.Sort(gone)
	slices.Sort(added)
	out = make([]types.EventNID, 0, len(ev)+len(added))
	g, a := 0, 0
	for _, n := range ev {
		if g < len(gone) && gone[g] < n {
			return nil, false
		}
		if g < len(gone) && gone[g] == n {
			g++
			continue
		}
		for a < len(added) && added[a] < n {
			out = append(out, added[a])
			a++
		}
		out = append(out, n)
	}
	return append(out, added[a:]...), g == len(gone)
}

// foldBlocks folds InsertState's blocks, in the order given, into the root of the
// state they make (new nodes in ov, read through rd). prev is the first block when
// it is a snapshot of the room's own seqs and every other block a delta; chained
// reports that the new state may then be chained to it (its chain position below
// the limit). Errors name the block and room.
func (s *Store) foldBlocks(ctx context.Context, txn *sql.Tx, roomNID types.RoomNID, stateBlockNIDs types.StateBlockNIDs,
	ns *roomNodes, ov *overlay, rd *hamtstore.Reader) (root hamtstore.NodeID, prev snapRef, chained bool, err error) {
	root = hamtstore.EmptyRoot
	chained = len(stateBlockNIDs) > 1
	for i, b := range stateBlockNIDs {
		if isDelta(int64(b)) {
			entries, ok := s.deltas.get(b)
			if !ok {
				return root, prev, false, fmt.Errorf("statetables: InsertState room NID %d: block %d (#%d) unknown: delta blocks live in memory from BulkInsertStateData until InsertState, and this process has none of that NID", roomNID, b, i)
			}
			var err error
			if root, err = hamtstore.Apply(ov, rd, root, deltaChanges(entries)); err != nil {
				return root, prev, false, fmt.Errorf("statetables: InsertState room NID %d: fold block %d: %w", roomNID, b, err)
			}
			continue
		}
		ref, ok, err := s.ref(ctx, txn, types.StateSnapshotNID(b))
		if err != nil {
			return root, prev, false, fmt.Errorf("InsertState room NID %d: %w", roomNID, err)
		}
		if !ok {
			return root, prev, false, fmt.Errorf("statetables: InsertState room NID %d: block %d (#%d) unknown", roomNID, b, i)
		}
		if ref.room != roomNID {
			return root, prev, false, fmt.Errorf("statetables: InsertState room NID %d: block %d (#%d) belongs to room NID %d", roomNID, b, i, ref.room)
		}
		if err := s.use(ctx, txn, ns, ref); err != nil {
			return root, prev, false, fmt.Errorf("InsertState room NID %d: block %d: %w", roomNID, b, err)
		}
		if i == 0 {
			prev = ref
		} else {
			chained = false
		}
		if root == hamtstore.EmptyRoot {
			root = ref.root
			continue
		}
		var changes []hamtstore.Change
		if err := rd.Iterate(ref.root, func(k []byte, v hamtstore.Value) error {
			changes = append(changes, hamtstore.Change{Key: slices.Clone(k), Value: v})
			return nil
		}); err != nil {
			return root, prev, false, fmt.Errorf("statetables: InsertState room NID %d: read block %d: %w", roomNID, b, err)
		}
		if root, err = hamtstore.Apply(ov, rd, root, changes); err != nil {
			return root, prev, false, fmt.Errorf("statetables: InsertState room NID %d: fold block %d: %w", roomNID, b, err)
		}
	}
	return root, prev, chained && prev.seq != 0 && prev.pos+1 < s.chainLimit, nil
}

// chain returns the version 2 record of a new snapshot (ref: room, root, seq)
// whose state is prev's (readable through ns and rd) with deltas applied: its
// changes against the snapshot at position chainBase(prev.pos+1) on prev's base
// chain. The changes are applied to that base again and must give the new root;
// the layer they make is returned for the cache.
func (s *Store) chain(ctx context.Context, txn *sql.Tx, ns *roomNodes, rd *hamtstore.Reader, prev, ref snapRef) (snapRef, []byte, *layer, error) {
	ref.pos = prev.pos + 1
	base := prev
	for base.pos != chainBase(ref.pos) {
		next, ok, err := s.ref(ctx, txn, SnapshotNID(base.room, base.base))
		if err != nil {
			return ref, nil, nil, err
		}
		if !ok || next.pos >= base.pos {
			return ref, nil, nil, fmt.Errorf("%w: snapshot NID %d: base seq %d missing or not below it in its chain", ErrCorrupt, SnapshotNID(base.room, base.seq), base.base)
		}
		base = next
	}
	ref.base = base.seq
	var changes []hamtstore.Change
	err := rd.Diff(base.root, ref.root, func(key []byte, _, v *hamtstore.Value) error {
		c := hamtstore.Change{Key: slices.Clone(key), Delete: v == nil}
		if v != nil {
			c.Value = *v
		}
		changes = append(changes, c)
		return nil
	})
	if err != nil {
		return ref, nil, nil, fmt.Errorf("statetables: snapshot seq %d: diff against base snapshot NID %d: %w", ref.seq, SnapshotNID(base.room, base.seq), err)
	}
	data, err := encodeChained(ref.root, ref.seq, ref.base, ref.pos, changes)
	if err != nil {
		return ref, nil, nil, err
	}
	var below *layer
	if base.pos > 0 {
		if below, err = s.materialise(ctx, txn, base); err != nil {
			return ref, nil, nil, err
		}
	}
	l, root, err := applyLayer(ns, below, base.root, changes)
	if err != nil {
		return ref, nil, nil, fmt.Errorf("statetables: snapshot seq %d: %w", ref.seq, err)
	}
	if root != ref.root {
		return ref, nil, nil, fmt.Errorf("statetables: snapshot seq %d: changes against its base give root %x, not %x", ref.seq, root[:], ref.root[:])
	}
	return ref, data, l, nil
}

// newNodes returns the records of the nodes reachable from root that the room's
// collection does not hold yet: those the overlay made and those materialised
// from chained snapshots (ns), less those the collection already has.
func (s *Store) newNodes(rec records, ov *overlay, rd *hamtstore.Reader, ns *roomNodes, r *room, root hamtstore.NodeID) ([]packstore.Record, error) {
	var ids []packstore.ID
	var data [][]byte
	if err := rd.Walk(root, func(id hamtstore.NodeID) (bool, error) {
		b, ok := ov.nodes[id]
		if !ok && ns != nil {
			b, ok = ns.materialised(id)
		}
		if !ok {
			return false, nil
		}
		ids, data = append(ids, packstore.ID(id)), append(data, b)
		return true, nil
	}); err != nil {
		return nil, fmt.Errorf("statetables: room NID %d: walk new state: %w", r.nid, err)
	}
	if len(ids) > 4 {
		// A state built from nothing (Dendrite's full-state AddState) shares most
		// nodes with states already stored, and a checkpoint's materialised nodes
		// may be stored already: keep only the missing ones.
		have, err := rec.GetMany(r.coll, ids)
		if err != nil {
			return nil, fmt.Errorf("statetables: room NID %d: %w", r.nid, err)
		}
		kept := 0
		for i := range ids {
			if have[i] == nil {
				ids[kept], data[kept] = ids[i], data[i]
				kept++
			}
		}
		ids, data = ids[:kept], data[:kept]
	}
	recs := make([]packstore.Record, len(ids))
	for i, id := range ids {
		recs[i] = packstore.Record{ID: id, Data: data[i]}
	}
	return recs, nil
}

// BulkSelectStateBlockNIDs returns the block list of each snapshot NID asked, as
// Dendrite's SQL does: sorted by snapshot NID, each NID once (Dendrite's callers,
// e.g. LoadMembershipAtEvent, binary-search the result). A snapshot's list is the
// snapshot itself, or no block for the empty state. An unknown or 0 NID is a
// types.MissingStateError, as in Dendrite's SQL.
func (s *Store) BulkSelectStateBlockNIDs(ctx context.Context, txn *sql.Tx, stateNIDs []types.StateSnapshotNID) ([]types.StateBlockNIDList, error) {
	nids := slices.Clone(stateNIDs)
	slices.Sort(nids)
	nids = slices.Compact(nids)
	out := make([]types.StateBlockNIDList, len(nids))
	for i, nid := range nids {
		_, root, ok, err := s.locate(ctx, txn, nid)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, types.MissingStateError(fmt.Sprintf("storage: state snapshot NID %d missing from the mtxdb state store", nid))
		}
		out[i].StateSnapshotNID = nid
		if root == hamtstore.EmptyRoot {
			out[i].StateBlockNIDs = []types.StateBlockNID{}
		} else {
			out[i].StateBlockNIDs = []types.StateBlockNID{types.StateBlockNID(nid)}
		}
	}
	return out, nil
}

// BulkSelectStateForHistoryVisibility is not supported (Dendrite's SQLite backend
// does not support it either): tables.OptimisationNotSupportedError.
func (s *Store) BulkSelectStateForHistoryVisibility(ctx context.Context, txn *sql.Tx, stateSnapshotNID types.StateSnapshotNID, domain string) ([]types.EventNID, error) {
	return nil, tables.OptimisationNotSupportedError
}

// BulkSelectMembershipForHistoryVisibility is not supported (as in Dendrite's
// SQLite backend): tables.OptimisationNotSupportedError.
func (s *Store) BulkSelectMembershipForHistoryVisibility(ctx context.Context, txn *sql.Tx, userNID types.EventStateKeyNID, roomInfo *types.RoomInfo, eventIDs ...string) (map[string]*types.HeaderedEvent, error) {
	return nil, tables.OptimisationNotSupportedError
}

// BulkInsertStateData keeps entries as a delta block in memory and returns its NID
// (1 .. 2^32-1), for the InsertState of the same AddState (doc.go "Model"). Within
// the delta, the highest event NID of a key wins. Never fails.
func (s *Store) BulkInsertStateData(ctx context.Context, txn *sql.Tx, entries types.StateEntries) (types.StateBlockNID, error) {
	return s.deltas.put(slices.Clone([]types.StateEntry(entries))), nil
}

// BulkSelectStateBlockEntries returns, per block NID and in request order, the
// block's event NIDs in ascending order (a snapshot: its whole state; a delta: its
// entries after the highest-event-NID-per-key rule). An unknown block is an error.
func (s *Store) BulkSelectStateBlockEntries(ctx context.Context, txn *sql.Tx, stateBlockNIDs types.StateBlockNIDs) ([][]types.EventNID, error) {
	out := make([][]types.EventNID, len(stateBlockNIDs))
	for i, b := range stateBlockNIDs {
		ev, err := s.blockEvents(ctx, txn, b)
		if err != nil {
			return nil, err
		}
		out[i] = ev
	}
	return out, nil
}

func (s *Store) blockEvents(ctx context.Context, txn *sql.Tx, b types.StateBlockNID) ([]types.EventNID, error) {
	if isDelta(int64(b)) {
		entries, ok := s.deltas.get(b)
		if !ok {
			return nil, fmt.Errorf("storage: state block NID %d missing (delta blocks live in memory until InsertState)", b)
		}
		last := map[types.StateKeyTuple]types.EventNID{}
		for _, e := range entries {
			if cur, ok := last[e.StateKeyTuple]; !ok || e.EventNID > cur {
				last[e.StateKeyTuple] = e.EventNID
			}
		}
		ev := make([]types.EventNID, 0, len(last))
		for _, n := range last {
			ev = append(ev, n)
		}
		slices.Sort(ev)
		return ev, nil
	}
	nid := types.StateSnapshotNID(b)
	// The record first: a NID's entries are cached only after its record is
	// found through the caller's view, so a snapshot of a transaction that
	// rolled back stays invisible; entries read through a transaction are
	// cached (a NID is never handed out twice, so its entries never change).
	ref, ok, err := s.ref(ctx, txn, nid)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("storage: state block NID %d missing from the mtxdb state store", b)
	}
	if ev, ok := s.entries.Get(nid); ok {
		return slices.Clone(ev), nil
	}
	ns := s.roomNodes(s.at(ctx, txn), ref.room)
	if err := s.use(ctx, txn, ns, ref); err != nil {
		return nil, fmt.Errorf("storage: state block NID %d: %w", b, err)
	}
	ev, err := stateEvents(ns, ref.root)
	if err != nil {
		return nil, fmt.Errorf("storage: state block NID %d: %w", b, err)
	}
	s.entries.Add(nid, ev)
	return slices.Clone(ev), nil
}

// stateEvents returns the event NIDs of a state, ascending.
func stateEvents(ns hamtstore.NodeStore, root hamtstore.NodeID) ([]types.EventNID, error) {
	var ev []types.EventNID
	rd := hamtstore.NewReader(ns)
	err := rd.Iterate(root, func(k []byte, v hamtstore.Value) error {
		n, err := valueEvent(v)
		if err != nil {
			return err
		}
		ev = append(ev, n)
		return nil
	})
	slices.Sort(ev)
	return ev, err
}

// State returns the entries of a snapshot, sorted by (type NID, state key NID); for
// checks and the migration. Errors: unknown snapshot (types.MissingStateError),
// corrupt records or nodes.
func (s *Store) State(nid types.StateSnapshotNID) ([]types.StateEntry, error) {
	ref, ok, err := s.ref(ctx0, nil, nid)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, types.MissingStateError(fmt.Sprintf("storage: state snapshot NID %d missing from the mtxdb state store", nid))
	}
	ns := s.roomNodes(s.at(ctx0, nil), ref.room)
	if err := s.use(ctx0, nil, ns, ref); err != nil {
		return nil, fmt.Errorf("statetables: snapshot NID %d: %w", nid, err)
	}
	var out []types.StateEntry
	rd := hamtstore.NewReader(ns)
	err = rd.Iterate(ref.root, func(k []byte, v hamtstore.Value) error {
		t, err := parseStateKey(k)
		if err != nil {
			return err
		}
		n, err := valueEvent(v)
		if err != nil {
			return err
		}
		out = append(out, types.StateEntry{StateKeyTuple: t, EventNID: n})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("statetables: snapshot NID %d: %w", nid, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StateKeyTuple.LessThan(out[j].StateKeyTuple) })
	return out, nil
}

// PurgeRoom deletes a room's snapshots and nodes (its collection) and keeps only its
// lease record, so the room's NIDs are never handed out again. The caller makes sure
// no SQL row names them any more: on packstore PurgeAfterSQL calls it once
// Dendrite's purge committed; on PostgreSQL it runs in the purge's transaction txn
// (txn nil: on its own).
func (s *Store) PurgeRoom(ctx context.Context, txn *sql.Tx, roomNID types.RoomNID) error {
	if err := checkRoom(roomNID); err != nil {
		return err
	}
	r := s.room(roomNID)
	if s.db != nil {
		// No Go lock held while the DELETE may wait for another transaction's
		// row locks (InsertState: the same reason). The lease record stays.
		v := pgstore.OverSQL(ctx, s.db)
		if txn != nil {
			v = pgstore.OverSQL(ctx, txn)
		}
		if err := v.DeleteCollectionExcept(r.coll, leaseRecordID); err != nil {
			return fmt.Errorf("statetables: purge room NID %d: %w", roomNID, err)
		}
	} else {
		r.mu.Lock()
		defer r.mu.Unlock()
		if err := s.load(r); err != nil {
			return err
		}
		end := max(r.leaseEnd, r.next)
		if err := s.eng.DeleteCollection(r.coll); err != nil {
			return fmt.Errorf("statetables: purge room NID %d: %w", roomNID, err)
		}
		if err := s.eng.Put(r.coll, leaseRecordID, encodeU32('L', end)); err != nil {
			return fmt.Errorf("statetables: purge room NID %d: lease: %w", roomNID, err)
		}
		if err := s.commit.wait(); err != nil {
			return err
		}
		r.next, r.leaseEnd = end, end
	}
	for _, k := range s.roots.Keys() {
		if rr, ok := s.roots.Peek(k); ok && rr.room == roomNID {
			s.roots.Remove(k)
		}
	}
	s.entries.Purge()
	s.layers.purge()
	if s.nodes != nil {
		s.nodes.purge()
	}
	for _, k := range s.seqs.Keys() {
		if k.room == roomNID {
			s.seqs.Remove(k)
		}
	}
	return nil
}
