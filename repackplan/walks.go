package repackplan

import (
	"container/heap"
	"context"
	"fmt"

	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomstate"
)

// The walks a homeserver does over one room, which bench-repack times before and after a repack
// (docs/benchmarks.md, "Repack locality"): each reads records through the room's store and
// returns how many of each kind it read. Physical reads, pages and seeks are counted
// by the engine (packstore read statistics), not here.

// WalkKind names a walk.
type WalkKind string

const (
	// WalkCurrentState loads the current state: its snapshot nodes, the metadata of
	// each entry and each state event's PDU (what a /sync of a joining client needs).
	WalkCurrentState WalkKind = "current-state"
	// WalkAuthChain walks auth_events breadth-first from the forward extremities,
	// reading each event's metadata and PDU (the auth chain a join or a state
	// resolution loads).
	WalkAuthChain WalkKind = "auth-chain"
	// WalkBackfill reads the newest events along prev_events from the forward
	// extremities (descending depth), metadata and PDU, up to a limit (/messages and
	// federation backfill).
	WalkBackfill WalkKind = "backfill"
	// WalkResolve resolves the states after the forward extremities with a fresh
	// resolver (what a server does when its extremities diverge), through Walk's
	// ResolveFunc.
	WalkResolve WalkKind = "resolve-extremities"
)

// WalkKinds lists the walks in the order benchmarks run them.
var WalkKinds = []WalkKind{WalkCurrentState, WalkAuthChain, WalkBackfill, WalkResolve}

// WalkStats counts what a walk read, by record kind.
type WalkStats struct {
	Events int // distinct events visited
	PDUs   int
	Metas  int
	Nodes  int // HAMT nodes read from the store
}

// ResolveFunc resolves the states after a room's forward extremities and
// returns the PDUs it loaded from the store and the HAMT nodes it read:
// resolver.ResolveForwardExtremities. WalkResolve runs it, so that this package
// needs no state resolution of its own.
type ResolveFunc func(ctx context.Context, room *roomstate.Room) (events, nodes int, err error)

// Walk runs one walk over a room; limit bounds the backfill walk (0: 1000
// events) and resolve runs WalkResolve (the other walks ignore it; nil fails
// WalkResolve). ctx goes to resolve.
func Walk(ctx context.Context, room *roomstate.Room, kind WalkKind, limit int, resolve ResolveFunc) (WalkStats, error) {
	var ws WalkStats
	h := room.Head()
	if !h.Replayed {
		return ws, fmt.Errorf("%w: %s", ErrNotReplayed, room.ID())
	}
	readEvent := func(id string) (roomrecord.EventMeta, error) {
		m, err := room.Meta(id)
		if err != nil {
			return m, err
		}
		ws.Metas++
		if _, err := room.EventJSON(id); err != nil {
			return m, err
		}
		ws.PDUs++
		ws.Events++
		return m, nil
	}
	switch kind {
	case WalkCurrentState:
		rd := room.NewReader()
		err := rd.Iterate(h.CurrentState, func(_ []byte, v hamtstore.Value) error {
			m, err := room.MetaByRecord(packstore.ID(v))
			if err != nil {
				return err
			}
			ws.Metas++
			if _, err := room.EventJSON(m.EventID); err != nil {
				return err
			}
			ws.PDUs++
			ws.Events++
			return nil
		})
		ws.Nodes = rd.NodesRead()
		return ws, err
	case WalkAuthChain:
		seen := map[string]bool{}
		queue := append([]string(nil), h.ForwardExtremities...)
		for _, id := range queue {
			seen[id] = true
		}
		for len(queue) > 0 {
			id := queue[0]
			queue = queue[1:]
			m, err := readEvent(id)
			if err != nil {
				return ws, err
			}
			for _, a := range m.AuthEvents {
				if !seen[a] {
					seen[a] = true
					queue = append(queue, a)
				}
			}
		}
		return ws, nil
	case WalkBackfill:
		if limit <= 0 {
			limit = 1000
		}
		q := &eventHeap{}
		seen := map[string]bool{}
		push := func(id string) error {
			if seen[id] {
				return nil
			}
			seen[id] = true
			m, err := readEvent(id)
			if err != nil {
				return err
			}
			heap.Push(q, m)
			return nil
		}
		for _, f := range h.ForwardExtremities {
			if err := push(f); err != nil {
				return ws, err
			}
		}
		taken := 0
		for q.Len() > 0 && taken < limit {
			m := heap.Pop(q).(roomrecord.EventMeta)
			taken++
			for _, p := range m.PrevEvents {
				if taken+q.Len() >= limit {
					break
				}
				if err := push(p); err != nil {
					return ws, err
				}
			}
		}
		return ws, nil
	case WalkResolve:
		if resolve == nil {
			return ws, fmt.Errorf("repackplan: walk %s needs a ResolveFunc", kind)
		}
		events, nodes, err := resolve(ctx, room)
		ws.Events, ws.PDUs, ws.Nodes = events, events, nodes
		return ws, err
	}
	return ws, fmt.Errorf("repackplan: unknown walk %q (have %v)", kind, WalkKinds)
}
