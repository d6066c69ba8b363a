package resolver

import (
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
type stateCursor struct {
	root  hamtstore.NodeID
	val   []int32 // by key index
	valid bool    // val holds root's state (false: not built yet, or a move failed)
}

// cursorElsewhere marks a key whose event the auth index does not hold.
const cursorElsewhere = -2

// stateAt moves the cursor to root and returns its array. The array is
// valid until the next move.
func (r *roomResolver) stateAt(root hamtstore.NodeID) ([]int32, error) {
	g, err := r.graph()
	if err != nil {
		return nil, err
	}
	c := &r.cursor
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
	c.valid = false // until the whole diff is applied
	err = r.rd.Diff(c.root, root, func(key []byte, _, v *hamtstore.Value) error {
		typ, sk, err := roomrecord.SplitStateKey(key)
		if err != nil {
			return err
		}
		k, ok := g.keyIndex[Key{Type: typ, StateKey: sk}]
		if !ok {
			return nil // a key no event of the auth index has: never asked by index
		}
		c.val[k] = -1
		if v == nil {
			return nil
		}
		if x, ok := g.byRecord[packstore.ID(*v)]; ok {
			c.val[k] = x
			return nil
		}
		id, err := r.eventIDOf(*v)
		if err != nil {
			return err
		}
		c.val[k] = cursorElsewhere
		if x, ok := g.index.find(g.ids, id); ok {
			c.val[k] = x
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	c.root, c.valid = root, true
	return c.val, nil
}

// applied moves the cursor along a change the resolver made, from the snapshot
// from to the snapshot to that from with set and del applied is, without a
// diff: when the cursor is at from (else it stays where it is).
func (r *roomResolver) applied(from, to hamtstore.NodeID, set StateMap, del []Key) {
	c := &r.cursor
	if !c.valid || c.root != from || r.g == nil {
		return
	}
	g := r.g
	for _, k := range del {
		if ki, ok := g.keyIndex[k]; ok {
			c.val[ki] = -1
		}
	}
	for k, id := range set {
		if ki, ok := g.keyIndex[k]; ok {
			c.val[ki] = cursorElsewhere
			if x, ok := g.index.find(g.ids, id); ok {
				c.val[ki] = x
			}
		}
	}
	c.root = to
}

// lookup returns the event at a key of a snapshot: from the state cursor moved
// to root, or from the HAMT for a key or event the auth index does not hold.
func (r *roomResolver) lookup(root hamtstore.NodeID, k Key) (string, bool, error) {
	g, err := r.graph()
	if err != nil {
		return "", false, err
	}
	if ki, ok := g.keyIndex[k]; ok {
		st, err := r.stateAt(root)
		if err != nil {
			return "", false, err
		}
		switch x := st[ki]; {
		case x >= 0:
			return g.ids[x], true, nil
		case x == -1:
			return "", false, nil
		}
	}
	return r.lookupHAMT(root, k)
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
