package hamtstore

import (
	"bytes"
	"math/bits"
	"sort"
)

// Diff calls fn for every key whose value differs between the maps rooted at a
// and b: old is nil when the key is absent from a, new is nil when it is absent
// from b. Keys come in key-hash order. Subtrees with equal IDs on both sides are
// never read, so the cost is about (changed keys) x depth nodes. An error from
// fn stops the diff and is returned. old and new are valid until fn returns:
// copy what is kept.
func (r *Reader) Diff(a, b NodeID, fn func(key []byte, old, new *Value) error) error {
	return r.DiffN([]NodeID{a, b}, func(key []byte, vals []*Value) error {
		return fn(key, vals[0], vals[1])
	})
}

// DiffN compares N maps. A key present in every map with the same value is
// unconflicted and not reported; fn is called once for every other key (the
// conflicted ones, present in at least one map), in key-hash order, with
// vals[i] the key's value in roots[i] or nil where absent. Subtrees whose IDs
// are equal across all roots are never read. vals and the values it points to
// are reused between calls: copy what is kept beyond fn's return. An error from
// fn stops DiffN and is returned.
func (r *Reader) DiffN(roots []NodeID, conflicted func(key []byte, vals []*Value) error) error {
	slots := make([]slot, len(roots))
	for i, id := range roots {
		n, err := r.root(id)
		if err != nil {
			return err
		}
		slots[i].n = n
	}
	d := differ{r: r, fn: conflicted, vals: make([]*Value, len(roots)), store: make([]Value, len(roots))}
	return d.diff(slots, 0)
}

// slot is what one map holds at a trie position: nothing, a node, or a single
// entry (which, pushed down, acts as a node holding just that entry).
type slot struct {
	n *node
	e *entry
	h *[32]byte // hash of e.key, computed when first needed
}

func (s *slot) hash() *[32]byte {
	if s.h == nil {
		h := keyHash(s.e.key)
		s.h = &h
	}
	return s.h
}

type differ struct {
	r     *Reader
	fn    func(key []byte, vals []*Value) error
	vals  []*Value
	store []Value  // what vals points to
	keys  [][]byte // leaf's distinct keys, reused from leaf to leaf
}

// diff compares the slots of all maps at one position whose children are at depth.
func (d *differ) diff(slots []slot, depth int) error {
	// All nodes with one ID: identical subtrees, nothing conflicted.
	same := true
	for i := range slots {
		if slots[i].n == nil || slots[i].n.id != slots[0].n.id || slots[i].n.dirty {
			same = false
			break
		}
	}
	if same {
		return nil
	}
	if depth == collisionDepth {
		var entries []*entry
		for i := range slots {
			s := &slots[i]
			switch {
			case s.e != nil:
				entries = append(entries, s.e)
			case s.n != nil:
				for j := range s.n.entries {
					entries = append(entries, &s.n.entries[j])
				}
			}
		}
		return d.leaf(slots, entries, depth)
	}
	// Positions used by any map.
	var used uint32
	for i := range slots {
		s := &slots[i]
		switch {
		case s.n != nil:
			used |= s.n.datamap | s.n.nodemap
		case s.e != nil:
			used |= 1 << fragment(s.hash(), depth)
		}
	}
	sub := make([]slot, len(slots))
	for m := used; m != 0; m &= m - 1 {
		bit := m & -m
		pos := uint(bits.TrailingZeros32(bit))
		if sameChild(slots, bit) {
			continue // one subtree in every map: not even read
		}
		hasNode := false
		var entries []*entry
		for i := range slots {
			s := &slots[i]
			sub[i] = slot{}
			switch {
			case s.n != nil && s.n.datamap&bit != 0:
				sub[i].e = &s.n.entries[index(s.n.datamap, bit)]
				entries = append(entries, sub[i].e)
			case s.n != nil && s.n.nodemap&bit != 0:
				c, err := d.r.child(s.n, index(s.n.nodemap, bit))
				if err != nil {
					return err
				}
				sub[i].n = c
				hasNode = true
			case s.e != nil && fragment(s.hash(), depth) == pos:
				sub[i] = *s
				entries = append(entries, s.e)
			}
		}
		var err error
		if hasNode {
			err = d.diff(sub, depth+1)
		} else {
			err = d.leaf(sub, entries, depth+1)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// leaf reports the conflicted keys among entries, where no map holds a node:
// slots[i] holds map i's entry at this position (nil if none), or, at collision
// depth, map i's collision node or entry.
func (d *differ) leaf(slots []slot, entries []*entry, depth int) error {
	if len(entries) == 0 {
		return nil
	}
	// Distinct keys, in key-hash order (bytewise within a collision node).
	keys := d.keys[:0]
	defer func() { d.keys = keys[:0] }()
	for _, e := range entries {
		dup := false
		for _, k := range keys {
			if bytes.Equal(k, e.key) {
				dup = true
				break
			}
		}
		if !dup {
			keys = append(keys, e.key)
		}
	}
	if len(keys) > 1 && depth < collisionDepth {
		hs := make(map[string][32]byte, len(keys))
		for _, k := range keys {
			hs[string(k)] = keyHash(k)
		}
		sort.Slice(keys, func(i, j int) bool {
			hi, hj := hs[string(keys[i])], hs[string(keys[j])]
			if c := bytes.Compare(hi[:], hj[:]); c != 0 {
				return c < 0
			}
			return bytes.Compare(keys[i], keys[j]) < 0
		})
	} else if len(keys) > 1 {
		sort.Slice(keys, func(i, j int) bool { return bytes.Compare(keys[i], keys[j]) < 0 })
	}
	for _, k := range keys {
		for i := range slots {
			d.vals[i] = nil
			if e := slots[i].lookup(k); e != nil {
				d.store[i] = e.val
				d.vals[i] = &d.store[i]
			}
		}
		conflict := false
		for _, v := range d.vals {
			if v == nil || *v != *d.vals[0] {
				conflict = true
				break
			}
		}
		if conflict {
			if err := d.fn(k, d.vals); err != nil {
				return err
			}
		}
	}
	return nil
}

// lookup finds key in a leaf-level slot (an entry, or a collision node).
func (s *slot) lookup(key []byte) *entry {
	switch {
	case s.e != nil:
		if bytes.Equal(s.e.key, key) {
			return s.e
		}
	case s.n != nil:
		for j := range s.n.entries {
			if bytes.Equal(s.n.entries[j].key, key) {
				return &s.n.entries[j]
			}
		}
	}
	return nil
}

// sameChild reports whether every slot is a node holding, at bit, a child with
// one and the same ID.
func sameChild(slots []slot, bit uint32) bool {
	var id NodeID
	for i := range slots {
		n := slots[i].n
		if n == nil || n.nodemap&bit == 0 {
			return false
		}
		c := n.children[index(n.nodemap, bit)]
		if c.n != nil && c.n.dirty {
			return false
		}
		if i == 0 {
			id = c.id
		} else if c.id != id {
			return false
		}
	}
	return len(slots) > 0
}
