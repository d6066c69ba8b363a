package hamtstore

import (
	"bytes"
	"fmt"
	"sort"
)

// Apply applies changes, in order, to the map rooted at root and returns the new
// root. Later changes to a key override earlier ones. The new nodes (only those
// reachable from the new root, about one per level per changed key) are written
// with a single PutNodes call, which is skipped if there are none; nothing is
// modified, so root and every other old root stay valid. The result is
// canonical: the same key/value set gives the same root ID whatever the order
// of sets, deletes and batches that produced it.
//
// r resolves existing nodes and receives the new ones decoded, so reads of the
// new root through r cost no store reads; a nil r means a fresh Reader over
// store. Errors: ErrKeyTooLong, a read error, a corruption error, or the error
// of PutNodes (then nothing is added to r).
func Apply(store NodeStore, r *Reader, root NodeID, changes []Change) (NodeID, error) {
	if r == nil {
		r = NewReader(store)
	}
	for i := range changes {
		if len(changes[i].Key) > MaxKeyLen {
			return root, fmt.Errorf("%w: change %d: %d bytes (max %d)", ErrKeyTooLong, i, len(changes[i].Key), MaxKeyLen)
		}
	}
	n, err := r.root(root)
	if err != nil {
		return root, err
	}
	for _, c := range changes {
		h := keyHash(c.Key)
		if c.Delete {
			if n == nil {
				continue
			}
			if n, err = r.del(n, &h, c.Key); err != nil {
				return root, err
			}
			continue
		}
		if n == nil {
			n = &node{dirty: true, datamap: 1 << fragment(&h, 0), entries: []entry{newEntry(c.Key, c.Value)}}
			continue
		}
		if n, err = r.set(n, &h, c.Key, c.Value); err != nil {
			return root, err
		}
	}
	if n == nil {
		return EmptyRoot, nil
	}
	if !n.dirty {
		return n.id, nil
	}
	var out []EncodedNode
	var fresh []*node
	finalize(n, &out, &fresh)
	if err := store.PutNodes(out); err != nil {
		return root, fmt.Errorf("hamtstore: put %d nodes: %w", len(out), err)
	}
	for _, f := range fresh {
		if _, ok := r.nodes[f.id]; !ok { // same content already decoded: keep that copy
			r.nodes[f.id] = f
		}
	}
	return n.id, nil
}

// Set is Apply with one change that sets key to v.
func Set(store NodeStore, r *Reader, root NodeID, key []byte, v Value) (NodeID, error) {
	return Apply(store, r, root, []Change{{Key: key, Value: v}})
}

// Delete is Apply with one change that removes key.
func Delete(store NodeStore, r *Reader, root NodeID, key []byte) (NodeID, error) {
	return Apply(store, r, root, []Change{{Key: key, Delete: true}})
}

func newEntry(key []byte, v Value) entry {
	return entry{key: bytes.Clone(key), val: v}
}

// finalize encodes the dirty nodes under n bottom-up, assigning IDs.
func finalize(n *node, out *[]EncodedNode, fresh *[]*node) {
	if !n.dirty {
		return
	}
	for i := range n.children {
		c := &n.children[i]
		if c.n != nil {
			finalize(c.n, out, fresh)
			c.id = c.n.id
		}
	}
	data := n.encode()
	n.id = NodeIDOf(data)
	n.dirty = false
	*out = append(*out, EncodedNode{ID: n.id, Data: data})
	*fresh = append(*fresh, n)
}

// clone returns a dirty shallow copy of n whose slices may be modified.
func (n *node) clone() *node {
	c := *n
	c.dirty = true
	c.id = NodeID{}
	c.entries = append([]entry(nil), n.entries...)
	c.children = append([]childRef(nil), n.children...)
	return &c
}

// set returns n with key set to v (n itself if nothing changes).
func (r *Reader) set(n *node, h *[32]byte, key []byte, v Value) (*node, error) {
	if n.collision {
		i := sort.Search(len(n.entries), func(i int) bool { return bytes.Compare(n.entries[i].key, key) >= 0 })
		if i < len(n.entries) && bytes.Equal(n.entries[i].key, key) {
			if n.entries[i].val == v {
				return n, nil
			}
			c := n.clone()
			c.entries[i].val = v
			return c, nil
		}
		c := n.clone()
		c.entries = append(c.entries[:i], append([]entry{newEntry(key, v)}, c.entries[i:]...)...)
		return c, nil
	}
	bit := uint32(1) << fragment(h, n.depth)
	switch {
	case n.datamap&bit != 0:
		i := index(n.datamap, bit)
		old := n.entries[i]
		if bytes.Equal(old.key, key) {
			if old.val == v {
				return n, nil
			}
			c := n.clone()
			c.entries[i].val = v
			return c, nil
		}
		oh := keyHash(old.key)
		sub := pair(n.depth+1, old, &oh, newEntry(key, v), h)
		c := n.clone()
		c.datamap &^= bit
		c.entries = append(c.entries[:i], c.entries[i+1:]...)
		c.nodemap |= bit
		j := index(c.nodemap, bit)
		c.children = append(c.children[:j], append([]childRef{{n: sub}}, c.children[j:]...)...)
		return c, nil
	case n.nodemap&bit != 0:
		j := index(n.nodemap, bit)
		child, err := r.child(n, j)
		if err != nil {
			return nil, err
		}
		nc, err := r.set(child, h, key, v)
		if err != nil || nc == child {
			return n, err
		}
		c := n.clone()
		c.children[j] = childRef{n: nc}
		return c, nil
	default:
		c := n.clone()
		c.datamap |= bit
		i := index(c.datamap, bit)
		c.entries = append(c.entries[:i], append([]entry{newEntry(key, v)}, c.entries[i:]...)...)
		return c, nil
	}
}

// pair builds the subtree at depth holding two entries with distinct keys whose
// hashes agree on all levels above depth.
func pair(depth int, a entry, ha *[32]byte, b entry, hb *[32]byte) *node {
	if depth == collisionDepth {
		if bytes.Compare(a.key, b.key) > 0 {
			a, b = b, a
		}
		return &node{dirty: true, depth: depth, collision: true, entries: []entry{a, b}}
	}
	fa, fb := fragment(ha, depth), fragment(hb, depth)
	if fa == fb {
		sub := pair(depth+1, a, ha, b, hb)
		return &node{dirty: true, depth: depth, nodemap: 1 << fa, children: []childRef{{n: sub}}}
	}
	if fa > fb {
		a, b = b, a
	}
	return &node{dirty: true, depth: depth, datamap: 1<<fa | 1<<fb, entries: []entry{a, b}}
}

// del returns n without key: n itself if key is absent, nil if n becomes empty.
// The result may be a single-entry node; the caller inlines it unless it is the
// root.
func (r *Reader) del(n *node, h *[32]byte, key []byte) (*node, error) {
	if n.collision {
		for i, e := range n.entries {
			if bytes.Equal(e.key, key) {
				c := n.clone()
				c.entries = append(c.entries[:i], c.entries[i+1:]...)
				return c, nil // one entry left at least; the parent inlines it
			}
		}
		return n, nil
	}
	bit := uint32(1) << fragment(h, n.depth)
	switch {
	case n.datamap&bit != 0:
		i := index(n.datamap, bit)
		if !bytes.Equal(n.entries[i].key, key) {
			return n, nil
		}
		if len(n.entries) == 1 && len(n.children) == 0 {
			return nil, nil
		}
		c := n.clone()
		c.datamap &^= bit
		c.entries = append(c.entries[:i], c.entries[i+1:]...)
		return c, nil
	case n.nodemap&bit != 0:
		j := index(n.nodemap, bit)
		child, err := r.child(n, j)
		if err != nil {
			return nil, err
		}
		nc, err := r.del(child, h, key)
		if err != nil || nc == child {
			return n, err
		}
		c := n.clone()
		switch {
		case nc == nil:
			c.nodemap &^= bit
			c.children = append(c.children[:j], c.children[j+1:]...)
			if len(c.entries)+len(c.children) == 0 {
				return nil, nil
			}
		case nc.single():
			// Contraction: a single entry moves up into this node.
			c.nodemap &^= bit
			c.children = append(c.children[:j], c.children[j+1:]...)
			c.datamap |= bit
			i := index(c.datamap, bit)
			c.entries = append(c.entries[:i], append([]entry{nc.entries[0]}, c.entries[i:]...)...)
		default:
			c.children[j] = childRef{n: nc}
		}
		return c, nil
	default:
		return n, nil
	}
}
