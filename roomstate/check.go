package roomstate

import (
	"context"
	"errors"
	"fmt"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/roomrecord"
)

// CheckResult counts what Check read.
type CheckResult struct {
	Events    int
	Snapshots int // distinct snapshot roots checked
	Rejected  int
	Dangling  int // events without a state record that point at events not stored (outliers)
	// NotKept counts events without a state record that the head's keep rule lets an
	// every-k repack drop (Head.KeepsState): not damage.
	NotKept int
	// Unreplayed counts events without a state record in a room that is not
	// replayed to its end (Head.Replayed false: never replayed, a replay that
	// stopped, or events imported since): replay computes them. Not damage.
	Unreplayed int
}

// Check reads every record of a room and validates it: the arrival log against the
// head, every PDU (parsed for the room version), metadata and state record, every
// distinct snapshot with hamtstore's Check (node hashes, canonical shape), that each
// snapshot value names a state event of that key, and that every prev/auth event is
// in the room. An event of a replayed room without a state record must be an outlier
// (an ancestor, transitively, is not in the room) or one whose record the head's keep
// rule lets an every-k repack drop (counted in NotKept); any other is reported as
// ErrCorruptRecord. In a room not replayed to its end (never replayed, replay
// interrupted, or events imported since), the state records that exist are
// checked and the events without one are counted in Unreplayed. For `mtxdb
// verify` and tests; it reads the whole room. ctx is checked before each
// event; progress, if set, is called after each event checked (about every millisecond
// in a large room) with the count so far: for progress bars.
func (r *Room) Check(ctx context.Context, progress func(events int)) (CheckResult, error) {
	var res CheckResult
	ids, err := r.EventIDs()
	if err != nil {
		return res, err
	}
	g, err := r.Graph()
	if err != nil {
		return res, err
	}
	index := make(map[string]int32, len(ids)) // also the set of the room's events
	for i, id := range ids {
		index[id] = int32(i)
	}
	rd := r.NewReader()
	roots := map[hamtstore.NodeID]bool{}
	checkRoot := func(root hamtstore.NodeID, what string) error {
		if roots[root] {
			return nil
		}
		roots[root] = true
		// Snapshots share most of their nodes: each node (and each entry's event)
		// is checked once, at its first snapshot.
		if err := rd.CheckShared(root, func(k []byte, v hamtstore.Value) error {
			_, err := r.snapshotEntry(k, v)
			return err
		}); err != nil {
			if errors.Is(err, roomrecord.ErrCorruptRecord) {
				return fmt.Errorf("%s: %w", what, err)
			}
			return fmt.Errorf("roomstate: room %s: %s: %w", r.head.RoomID, what, err)
		}
		return nil
	}
	for i, id := range ids {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if progress != nil && i > 0 {
			progress(i)
		}
		m, err := r.CheckMeta(g, i, func(id string) (int32, bool) { x, ok := index[id]; return x, ok })
		if err != nil {
			return res, err
		}
		if _, err := r.Event(id); err != nil {
			return res, err
		}
		dangling := ""
		for _, p := range append(append([]string(nil), m.PrevEvents...), m.AuthEvents...) {
			if _, ok := index[p]; !ok {
				dangling = p
			}
		}
		st, hasState, err := r.EventState(id)
		if err != nil {
			return res, err
		}
		if dangling != "" {
			if hasState {
				return res, fmt.Errorf("%w: room %s: event %s has a state but points at %s, which is not in the room",
					roomrecord.ErrCorruptRecord, r.head.RoomID, id, dangling)
			}
			res.Dangling++
			res.Events++
			continue
		}
		if !hasState {
			switch {
			case !r.head.Replayed && r.head.StateEvery == 0:
				res.Unreplayed++
			default:
				switch err := r.stateGap(m); {
				case errors.Is(err, ErrNoState) && r.head.Replayed: // an outlier's descendant
					res.Dangling++
				case errors.Is(err, ErrNoState):
					res.Unreplayed++
				case errors.Is(err, ErrStateNotKept):
					res.NotKept++
				default:
					return res, err
				}
			}
			res.Events++
			continue
		}
		// A state record is checked whether or not the room is replayed to its end
		// (an interrupted replay leaves some).
		if st.Rejected {
			res.Rejected++
			if st.After != st.Before {
				return res, fmt.Errorf("%w: room %s: rejected event %s changes the state", roomrecord.ErrCorruptRecord, r.head.RoomID, id)
			}
		}
		if err := checkRoot(st.Before, "state before "+id); err != nil {
			return res, err
		}
		if err := checkRoot(st.After, "state after "+id); err != nil {
			return res, err
		}
		res.Events++
	}
	if r.head.Replayed {
		if err := checkRoot(r.head.CurrentState, "current state"); err != nil {
			return res, err
		}
		for _, f := range r.head.ForwardExtremities {
			if _, ok := index[f]; !ok {
				return res, fmt.Errorf("%w: room %s: forward extremity %s is not in the room", roomrecord.ErrCorruptRecord, r.head.RoomID, f)
			}
		}
	}
	res.Snapshots = len(roots)
	return res, nil
}
