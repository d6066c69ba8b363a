package roomstate

import (
	"context"
	"errors"
	"fmt"

	"github.com/mtxdb/mtxdb/hamtstore"
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
// event.
func (r *Room) Check(ctx context.Context) (CheckResult, error) { return r.CheckProgress(ctx, nil) }

// CheckProgress is Check calling progress, if set, after each event checked (about
// every millisecond in a large room) with the count so far: for progress bars.
func (r *Room) CheckProgress(ctx context.Context, progress func(events int)) (CheckResult, error) {
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
			if errors.Is(err, ErrCorruptRecord) {
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
		m, err := r.Meta(id)
		if err != nil {
			return res, err
		}
		if d := g.diffMeta(i, &m, index); d != "" {
			return res, fmt.Errorf("%w: room %s: the graph record of event %s disagrees with its metadata: %s", ErrCorruptRecord, r.head.RoomID, id, d)
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
					ErrCorruptRecord, r.head.RoomID, id, dangling)
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
				return res, fmt.Errorf("%w: room %s: rejected event %s changes the state", ErrCorruptRecord, r.head.RoomID, id)
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
				return res, fmt.Errorf("%w: room %s: forward extremity %s is not in the room", ErrCorruptRecord, r.head.RoomID, f)
			}
		}
	}
	res.Snapshots = len(roots)
	return res, nil
}

// diffMeta describes how event i of g differs from its metadata record, "" when
// it does not (index: event ID -> arrival index).
func (g *Graph) diffMeta(i int, m *EventMeta, index map[string]int32) string {
	key, isState := StatePair{}, g.Key[i] >= 0
	if isState {
		key = g.Keys[g.Key[i]]
	}
	switch {
	case isState != m.IsState || (isState && key != StatePair{m.Type, m.StateKey}):
		return fmt.Sprintf("key %v (state %v), metadata %v (state %v)", key, isState, StatePair{m.Type, m.StateKey}, m.IsState)
	case g.Redacted[i] != m.Redacted:
		return fmt.Sprintf("redacted %v, metadata %v", g.Redacted[i], m.Redacted)
	case len(g.Prev(i)) != len(m.PrevEvents) || len(g.Auth(i)) != len(m.AuthEvents):
		return fmt.Sprintf("%d prev and %d auth events, metadata %d and %d", len(g.Prev(i)), len(g.Auth(i)), len(m.PrevEvents), len(m.AuthEvents))
	}
	check := func(what string, got []int32, want []string, missing func(j int) string) string {
		for j, id := range want {
			x, ok := index[id]
			if !ok {
				x = -1
			}
			if got[j] != x || (x < 0 && missing(j) != id) {
				return fmt.Sprintf("%s %d is %d, metadata %s", what, j, got[j], id)
			}
		}
		return ""
	}
	if d := check("prev_event", g.Prev(i), m.PrevEvents, func(j int) string { return g.MissingPrev(i, j) }); d != "" {
		return d
	}
	return check("auth_event", g.Auth(i), m.AuthEvents, func(j int) string { return g.MissingAuth(i, j) })
}
