package resolver

import (
	"fmt"

	"github.com/mtxdb/mtxdb/roomrecord"
)

// AuthGraph is the auth index of one room for callers that keep the room's events
// outside a roomstate store (a server's own event tables) and hold its DAG in
// memory as a roomrecord.Graph: event IDs, auth_events edges and state keys, no
// PDUs. It answers the auth difference's questions for ResolveWithGraph as
// Replay's index over the graph records does (auth children, same-key lineages
// with jump pointers), in about 250 bytes per event.
//
// An AuthGraph is a snapshot of the Graph it was built from. It fills lineage
// links and auth depths on first use, so it is not safe for concurrent use: one
// resolution at a time.
type AuthGraph struct {
	g    *graph
	memo keyMemo
}

// NewAuthGraph indexes a room's DAG (roomrecord.GraphOf). The Graph must not be
// changed afterwards.
func NewAuthGraph(rg *roomrecord.Graph) *AuthGraph {
	return &AuthGraph{g: indexGraph(rg)}
}

// has reports whether the graph holds an event.
func (a *AuthGraph) has(eventID string) bool {
	_, ok := a.g.index.find(a.g.ids, eventID)
	return ok
}

// ResolveWithGraph runs ResolveConflicts (state resolution v2 or v2.1, room
// versions 2-12) with the graph as its auth index: the caller gives the
// conflicted part of the input states (ConflictInput: the conflicted keys and
// each state's events for them, from a diff of the states) and a lookup into the
// unconflicted state map; events are read from src. Every event of in.PerState
// and the auth chains of them and of the unconflicted map's events must be in the
// graph (an error wrapping ErrResolution names a missing one). Errors: those of
// ResolveConflicts, and the first failed Unconflicted lookup.
func (a *AuthGraph) ResolveWithGraph(in ConflictInput, src EventSource) (Resolution, error) {
	for _, ids := range in.PerState {
		for _, id := range ids {
			if !a.has(id) {
				return Resolution{}, fmt.Errorf("%w: conflicted event %s is not in the room's auth graph", ErrResolution, id)
			}
		}
	}
	a.memo.reset(len(a.g.keys))
	view := &resView{g: a.g, memo: &a.memo, unconflicted: func(k int32) (int32, bool, error) {
		id, found, err := in.Unconflicted(a.g.keys[k])
		if err != nil || !found {
			return -1, false, err
		}
		x, ok := a.g.index.find(a.g.ids, id)
		if !ok {
			// Answering "none" would put the event's auth ancestors in the auth
			// difference: a stale graph must fail the resolution instead.
			return -1, false, fmt.Errorf("%w: unconflicted event %s is not in the room's auth graph", ErrResolution, id)
		}
		return x, true, nil
	}}
	res, err := ResolveConflicts(in, src, view)
	if err == nil {
		err = view.err
	}
	return res, err
}
