package statetables

import (
	"fmt"
	"math"

	"github.com/matrix-org/dendrite/roomserver/types"
	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
)

// ImportSnapshot stores a snapshot migrated from Dendrite's SQL under its own NID
// (1 .. 2^32-1, the range Dendrite's SQL counter hands out), so that the SQL rows
// naming it stay valid; doc.go "Records" gives the records. A later InsertState of
// the same state in the room returns this NID. Entries must have one entry per
// state key (an error names the key otherwise). Not durable until Sync on packstore;
// committed when it returns on PostgreSQL. Errors: NID
// or room NID out of range, duplicate keys, engine errors.
func (s *Store) ImportSnapshot(roomNID types.RoomNID, nid types.StateSnapshotNID, entries []types.StateEntry) error {
	if err := checkRoom(roomNID); err != nil {
		return err
	}
	if nid <= 0 || nid > math.MaxUint32 {
		return fmt.Errorf("statetables: migrated snapshot NID %d out of range [1, 2^32-1]", nid)
	}
	r := s.room(roomNID)
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := make(map[types.StateKeyTuple]bool, len(entries))
	changes := make([]hamtstore.Change, len(entries))
	for i, e := range entries {
		if seen[e.StateKeyTuple] {
			return fmt.Errorf("statetables: migrated snapshot NID %d: two entries for state key (%d, %d)", nid, e.EventTypeNID, e.EventStateKeyNID)
		}
		seen[e.StateKeyTuple] = true
		changes[i] = hamtstore.Change{Key: stateKey(e.StateKeyTuple), Value: eventValue(e.EventNID)}
	}
	rec := s.at(ctx0, nil)
	ov := &overlay{base: nodeStore{eng: rec, coll: r.coll}, nodes: map[hamtstore.NodeID][]byte{}}
	rd := hamtstore.NewReader(ov)
	root, err := hamtstore.Apply(ov, rd, hamtstore.EmptyRoot, changes)
	if err != nil {
		return fmt.Errorf("statetables: migrated snapshot NID %d: %w", nid, err)
	}
	recs, err := s.newNodes(rec, ov, rd, nil, r, root)
	if err != nil {
		return err
	}
	recs = append(recs, packstore.Record{ID: legacyRecordID(nid), Data: encodeSnapshot(root)})
	if _, ok, err := s.nidOf(ctx0, nil, r, root); err != nil {
		return err
	} else if !ok {
		recs = append(recs, packstore.Record{ID: rootRecordID(root), Data: encodeU64('R', uint64(nid))})
		s.seqs.Add(roomRoot{roomNID, root}, nid)
	}
	if err := rec.PutMany(r.coll, recs); err != nil {
		return fmt.Errorf("statetables: migrated snapshot NID %d: %w", nid, err)
	}
	if err := rec.PutMany(LegacyCollection, []packstore.Record{{ID: legacyRecordID(nid), Data: encodeU64('M', uint64(roomNID))}}); err != nil {
		return fmt.Errorf("statetables: migrated snapshot NID %d: %w", nid, err)
	}
	s.roots.Add(nid, snapRef{room: roomNID, root: root})
	return nil
}

// Sync makes every write so far durable (a group commit; nothing to do on
// PostgreSQL).
func (s *Store) Sync() error { return s.durable() }
