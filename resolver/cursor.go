package resolver

import (
	"errors"
	"sync/atomic"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomrecord"
)

// stateCursor is one state snapshot of the room as an array over the auth
// index's keys: the graph index of the event each key holds, -1 for none,
// cursorElsewhere for an event the auth index does not hold (looked up in the
// HAMT, as a key the auth index does not hold is). It
// answers the state lookups of a resolution (the unconflicted event of each key
// its auth-difference walks reach) and of an authorisation (the state before
// the event) in O(1), where a lookup in the snapshot's HAMT reads a node per
// level. It moves from snapshot to snapshot by the HAMT's diff of the two, whose
// cost is that of the keys that differ: a replay asks for the state after an
// event's first prev_event, then for the state before the event, then for the
// state after the next event's first prev_event, snapshots a few keys apart.
//
// A replay of a room that several servers wrote switches between their branches:
// the next event's first prev_event is often another server's last event, whose
// state after it a cursor left a few events ago. So the resolver keeps
// stateCursors cursors: a snapshot one of them is at costs no diff, and a
// snapshot none is at moves the least recently used one, unless the move is
// more than cursorMoveMax keys: that snapshot's keys are then read from its
// HAMT, a node per level each.
type stateCursor struct {
	root  hamtstore.NodeID
	val   []int32 // by key index
	valid bool    // val holds root's state (false: not built yet, or a move failed)
	used  uint64  // cursorSet.tick when last used
}

// stateCursors is how many state cursors a resolver keeps.
const stateCursors = 4

// cursorSet is a resolver's state cursors.
type cursorSet struct {
	c    [stateCursors]stateCursor
	tick uint64
	// far is the last snapshot stateAt found too far from its cursor
	// (errCursorFar), asked again without a diff; moves is the buffer of a
	// move.
	far   hamtstore.NodeID
	moves []cursorMove
}

// at returns the cursor at root, nil when none is.
func (cs *cursorSet) at(root hamtstore.NodeID) *stateCursor {
	for i := range cs.c {
		if c := &cs.c[i]; c.valid && c.root == root {
			return c
		}
	}
	return nil
}

// cursorElsewhere marks a key whose event the auth index does not hold.
const cursorElsewhere = -2

// stateAt returns the array of a cursor at root, moving one there when none
// is. The array is valid until the next call. errCursorFar when root is more
// than cursorMoveMax keys from the cursor that would move: the caller reads
// root from the HAMT.
func (r *roomResolver) stateAt(root hamtstore.NodeID) ([]int32, error) {
	g, err := r.graph()
	if err != nil {
		return nil, err
	}
	cs := &r.cursors
	cs.tick++
	if c := cs.at(root); c != nil {
		c.used = cs.tick
		return c.val, nil
	}
	c := &cs.c[0]
	for i := range cs.c {
		if cs.c[i].used < c.used {
			c = &cs.c[i]
		}
	}
	c.used = cs.tick
	if !c.valid {
		if len(c.val) != len(g.keys) {
			c.val = make([]int32, len(g.keys))
		}
		for i := range c.val {
			c.val[i] = -1
		}
		c.root, c.valid = hamtstore.EmptyRoot, true
	}
	if c.root == root {
		return c.val, nil
	}
	if c.root != hamtstore.EmptyRoot {
		if root == cs.far {
			return nil, errCursorFar
		}
		// A move of more than cursorMoveMax keys is given up before the
		// cursor changes: the callers read that snapshot from the HAMT.
		moves := cs.moves[:0]
		err = r.rd.Diff(c.root, root, func(key []byte, _, v *hamtstore.Value) error {
			if len(moves) == cursorMoveMax {
				return errCursorFar
			}
			k, x, ok, err := r.cursorValue(g, key, v)
			if ok {
				moves = append(moves, cursorMove{k, x})
			}
			return err
		})
		cs.moves = moves
		if errors.Is(err, errCursorFar) {
			cs.far = root
			farMoves.Add(1)
		}
		if err != nil {
			return nil, err
		}
		for _, m := range moves {
			c.val[m.k] = m.x
		}
		c.root = root
		return c.val, nil
	}
	c.valid = false // until the whole diff is applied
	err = r.rd.Diff(c.root, root, func(key []byte, _, v *hamtstore.Value) error {
		k, x, ok, err := r.cursorValue(g, key, v)
		if ok {
			c.val[k] = x
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	c.root, c.valid = root, true
	return c.val, nil
}

// cursorMoveMax is the most keys a cursor moves by from one snapshot to
// another. Snapshots further apart are read from the HAMT, a node per level
// for each key asked, which a resolution or authorisation asks a few dozen of.
// They are those of events whose prev_events are far back in the room's
// history: the last 420 events of the generated 1M-event room each fork off
// an older event, and moving a cursor from the current state to the first of
// them is a diff of 123,640 keys (a variable for the tests).
var cursorMoveMax = 1024

// farMoves counts the cursor moves given up (read by tests).
var farMoves atomic.Int64

// errCursorFar is stateAt's error for a snapshot more than cursorMoveMax keys
// away from every cursor (a cursor not built yet is built whatever the size).
var errCursorFar = errors.New("resolver: snapshot too far from the state cursors")

// cursorMove is one key of a cursor move: its key index and its new value.
type cursorMove struct{ k, x int32 }

// cursorValue returns the key index and cursor value of one change of a
// snapshot diff (v nil: the key removed); ok is false for a key the auth
// index does not hold (never asked by index).
func (r *roomResolver) cursorValue(g *graph, key []byte, v *hamtstore.Value) (k, x int32, ok bool, err error) {
	typ, sk, err := roomrecord.SplitStateKey(key)
	if err != nil {
		return 0, 0, false, err
	}
	if k, ok = g.keyIdx(Key{Type: typ, StateKey: sk}); !ok {
		return 0, 0, false, nil
	}
	if v == nil {
		return k, -1, true, nil
	}
	i, held, err := r.graphIndexOf(g, *v)
	if err != nil {
		return 0, 0, false, err
	}
	if !held {
		return k, cursorElsewhere, true, nil
	}
	return k, i, true, nil
}

// applied moves the cursor at from (if one is) along a change the resolver
// made, to the snapshot to that from with set and del applied is, without a
// diff.
func (r *roomResolver) applied(from, to hamtstore.NodeID, set StateMap, del []Key) {
	c := r.cursors.at(from)
	if c == nil || r.g == nil || from == to {
		return
	}
	g := r.g
	for _, k := range del {
		if ki, ok := g.keyIdx(k); ok {
			c.val[ki] = -1
		}
	}
	for k, id := range set {
		if ki, ok := g.keyIdx(k); ok {
			c.val[ki] = cursorElsewhere
			if x, ok := g.index.find(g.ids, id); ok {
				c.val[ki] = x
			}
		}
	}
	c.root = to
}

// graphIndexOf returns the graph index of the event a snapshot value names,
// false when the auth index does not hold it.
func (r *roomResolver) graphIndexOf(g *graph, v hamtstore.Value) (int32, bool, error) {
	if x, ok := g.byRecord.find(packstore.ID(v)); ok {
		return x, true, nil
	}
	id, err := r.eventIDOf(v)
	if err != nil {
		return -1, false, err
	}
	x, ok := g.index.find(g.ids, id)
	return x, ok, nil
}

// lookup returns the event at a key of a snapshot: from the state cursor moved
// to root, or from the HAMT for a key or event the auth index does not hold.
func (r *roomResolver) lookup(root hamtstore.NodeID, k Key) (string, bool, error) {
	id, _, ok, err := r.lookupAt(root, k)
	return id, ok, err
}

// lookupAt is lookup, with the event's graph index when the state cursor gave
// it (findIndex when the HAMT did).
func (r *roomResolver) lookupAt(root hamtstore.NodeID, k Key) (string, int32, bool, error) {
	g, err := r.graph()
	if err != nil {
		return "", 0, false, err
	}
	if ki, ok := g.keyIdx(k); ok {
		st, err := r.stateAt(root)
		if errors.Is(err, errCursorFar) {
			id, ok, err := r.lookupHAMT(root, k)
			return id, findIndex, ok, err
		}
		if err != nil {
			return "", 0, false, err
		}
		switch x := st[ki]; {
		case x >= 0:
			return g.ids[x], x, true, nil
		case x == -1:
			return "", 0, false, nil
		}
	}
	id, ok, err := r.lookupHAMT(root, k)
	return id, findIndex, ok, err
}

// lookupHAMT returns the event at a key of a snapshot, read from the HAMT.
func (r *roomResolver) lookupHAMT(root hamtstore.NodeID, k Key) (string, bool, error) {
	v, ok, err := r.rd.Get(root, roomrecord.StateKey(k.Type, k.StateKey))
	if err != nil || !ok {
		return "", false, err
	}
	id, err := r.eventIDOf(v)
	return id, err == nil, err
}
