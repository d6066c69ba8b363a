package statetables

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/matrix-org/dendrite/roomserver/types"
	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/integration/dendrite/statetables/eventrows"
)

// What a state resolution reads of the store: the states after a room's prev
// events as HAMT roots (a snapshot, plus the prev event's own entry), the keys on
// which they differ (hamtstore.DiffN: subtrees the roots share are never opened),
// and single entries of one of them. Nothing here loads a whole state.

// ErrNoEventRows is returned by EventRows when the Store was not given the
// roomserver database (Swap gives it; Open and OpenPostgres alone do not).
var ErrNoEventRows = errors.New("statetables: no roomserver database to read event rows from")

// stateAfter returns the HAMT root of the state after an event: the snapshot
// before it, with the event's own entry when it is an accepted state event
// (Dendrite's LoadCombinedStateAfterEvents). The snapshot's nodes are made
// readable through ns (ov's base); new nodes go to ov only. Snapshot NID 0 is the
// empty state.
func (s *Store) stateAfter(ctx context.Context, roomNID types.RoomNID, ns *roomNodes, ov hamtstore.NodeStore, rd *hamtstore.Reader, st types.StateAtEvent) (hamtstore.NodeID, error) {
	root := hamtstore.EmptyRoot
	if st.BeforeStateSnapshotNID != 0 {
		ref, ok, err := s.ref(ctx, nil, st.BeforeStateSnapshotNID)
		if err != nil {
			return root, err
		}
		if !ok {
			return root, types.MissingStateError(fmt.Sprintf("statetables: state snapshot NID %d missing from the mtxdb state store", st.BeforeStateSnapshotNID))
		}
		if ref.room != roomNID {
			return root, fmt.Errorf("statetables: state snapshot NID %d is of room NID %d, not %d", st.BeforeStateSnapshotNID, ref.room, roomNID)
		}
		if err := s.use(ctx, nil, ns, ref); err != nil {
			return root, err
		}
		root = ref.root
	}
	if st.IsStateEvent() && !st.IsRejected {
		return hamtstore.Set(ov, rd, root, stateKey(st.StateKeyTuple), eventValue(st.EventNID))
	}
	return root, nil
}

// DiffStates returns the keys on which the states after the given events of a
// room differ (a key missing from some state included), each with the event NID
// every state gives it (0: absent), in the order of hamtstore.DiffN. Reads go
// outside any Dendrite transaction: snapshots only an open transaction holds are
// types.MissingStateError. Errors: that, a snapshot of another room, corrupt
// records or nodes.
func (s *Store) DiffStates(ctx context.Context, roomNID types.RoomNID, states []types.StateAtEvent) ([]types.StateKeyTuple, [][]types.EventNID, error) {
	if err := checkRoom(roomNID); err != nil {
		return nil, nil, err
	}
	ns := s.roomNodes(s.at(ctx, nil), roomNID)
	ov := hamtstore.NewOverlay(ns)
	rd := hamtstore.NewReader(ov)
	roots := make([]hamtstore.NodeID, len(states))
	for i, st := range states {
		var err error
		if roots[i], err = s.stateAfter(ctx, roomNID, ns, ov, rd, st); err != nil {
			return nil, nil, err
		}
	}
	var keys []types.StateKeyTuple
	var events [][]types.EventNID
	err := rd.DiffN(roots, func(key []byte, vals []*hamtstore.Value) error {
		t, err := parseStateKey(key)
		if err != nil {
			return err
		}
		evs := make([]types.EventNID, len(vals))
		for i, v := range vals {
			if v != nil {
				if evs[i], err = valueEvent(*v); err != nil {
					return err
				}
			}
		}
		keys, events = append(keys, t), append(events, evs)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("statetables: room NID %d: diff of %d states: %w", roomNID, len(states), err)
	}
	return keys, events, nil
}

// StateLookup returns a lookup into the state after an event of a room: the
// event NID it gives a key (0: absent). The state's root is computed once and
// the lookup's HAMT reader keeps the nodes it read, so a resolution that asks for
// many keys reads each node once. The lookup is not safe for concurrent use.
// Errors as DiffStates, from StateLookup and from the lookup.
func (s *Store) StateLookup(ctx context.Context, roomNID types.RoomNID, state types.StateAtEvent) (func(types.StateKeyTuple) (types.EventNID, error), error) {
	if err := checkRoom(roomNID); err != nil {
		return nil, err
	}
	ns := s.roomNodes(s.at(ctx, nil), roomNID)
	ov := hamtstore.NewOverlay(ns)
	rd := hamtstore.NewReader(ov)
	root, err := s.stateAfter(ctx, roomNID, ns, ov, rd, state)
	if err != nil {
		return nil, err
	}
	return func(k types.StateKeyTuple) (types.EventNID, error) {
		v, ok, err := rd.Get(root, stateKey(k))
		if err != nil {
			return 0, fmt.Errorf("statetables: room NID %d: state lookup: %w", roomNID, err)
		}
		if !ok {
			return 0, nil
		}
		return valueEvent(v)
	}, nil
}

// EventRows returns the events of a room above an event NID from the
// roomserver database Swap gave the Store (eventrows.Read), oldest first.
// Errors: ErrNoEventRows, and eventrows.Read's.
func (s *Store) EventRows(ctx context.Context, roomNID types.RoomNID, after types.EventNID) ([]eventrows.EventRow, error) {
	if s.eventsDB == nil {
		return nil, ErrNoEventRows
	}
	return eventrows.Read(ctx, s.eventsDB, s.eventsSQLite, roomNID, after)
}

// SetEventsDB gives the Store the roomserver database EventRows reads (Swap
// calls it; sqlite tells the dialect).
func (s *Store) SetEventsDB(db *sql.DB, sqlite bool) { s.eventsDB, s.eventsSQLite = db, sqlite }
