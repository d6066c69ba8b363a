package resolver

import (
	"context"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/roomstate"
)

// ResolveForwardExtremities resolves the states after the room's forward
// extremities (roomstate.Room.Head) as a server does when its extremities
// diverge, with nothing cached beforehand, and returns what that read: events is
// the PDUs loaded from the store (as Stats.EventsLoaded counts them), nodes the
// HAMT nodes read. The resolved state is measured, not kept: its nodes go to
// memory, so the room's store may be open read-only. It is repackplan's
// WalkResolve (mtxdb stats --reads). ctx is checked before the resolution.
func ResolveForwardExtremities(ctx context.Context, room *roomstate.Room) (events, nodes int, err error) {
	r, err := newRoomResolver(room)
	if err != nil {
		return 0, 0, err
	}
	r.writeInMemory()
	var roots []hamtstore.NodeID
	for _, f := range room.Head().ForwardExtremities {
		root, err := room.StateAfter(f)
		if err != nil {
			return 0, 0, err
		}
		roots = append(roots, root)
	}
	if _, err := r.resolveSnapshots(ctx, roots); err != nil {
		return 0, 0, err
	}
	return r.stats.EventsLoaded, r.rd.NodesRead(), nil
}
