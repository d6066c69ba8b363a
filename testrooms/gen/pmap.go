package gen

import "slices"

// pmap is a persistent (immutable, structure-sharing) map from state key
// ("type\x00state_key") to event index: a hash trie of 32-way nodes on a 64-bit
// FNV-1a hash of the key. An update copies only the path to the changed entry, so
// the state after each of 100k events can be kept at a cost of a few nodes per
// state event, and two states that share most entries share most nodes: diff walks
// skip shared subtrees by pointer. Iteration order follows the hash, never Go map
// order, so it is deterministic; callers sort keys where order reaches the output.
//
// A pmap value is safe for concurrent reads; it is never mutated after creation.
//
// rec names the state in the room's stateLog: 0 is the empty state (the zero
// pmap), -1 a map not recorded (what set and del return when they change
// something); room.record gives a state its record. Two recorded pmaps with
// the same rec are the same state object (the same root).
type pmap struct {
	root *pnode
	size int
	rec  int32
}

const (
	pBits  = 5
	pWidth = 1 << pBits
	pMask  = pWidth - 1
	// pMaxShift is the last shift at which a hash has bits left; below it, entries
	// whose 64-bit hashes collide share one leaf.
	pMaxShift = 60
)

// pnode is an internal node (kids set, ents nil) or a leaf (ents non-empty, all
// with the same hash bits down to its level).
type pnode struct {
	kids *[pWidth]*pnode
	ents []pent
}

type pent struct {
	h uint64
	k string
	v int32
}

func phash(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	// FNV's low bits mix poorly for short keys that differ at the end; fold the
	// high half in, since the trie consumes low bits first.
	return h ^ (h >> 29) ^ (h >> 47)
}

// get returns the value for k.
func (m pmap) get(k string) (int32, bool) {
	h := phash(k)
	n := m.root
	for shift := uint(0); n != nil; shift += pBits {
		if n.kids == nil {
			for _, e := range n.ents {
				if e.h == h && e.k == k {
					return e.v, true
				}
			}
			return 0, false
		}
		n = n.kids[(h>>shift)&pMask]
	}
	return 0, false
}

// set returns a map with k set to v (m itself when it has that entry); m is
// unchanged.
func (m pmap) set(k string, v int32) pmap {
	h := phash(k)
	root, added := pset(m.root, 0, pent{h: h, k: k, v: v})
	switch {
	case root == m.root:
		return m
	case added:
		return pmap{root: root, size: m.size + 1, rec: -1}
	}
	return pmap{root: root, size: m.size, rec: -1}
}

func pset(n *pnode, shift uint, e pent) (*pnode, bool) {
	if n == nil {
		return &pnode{ents: []pent{e}}, true
	}
	if n.kids != nil {
		i := (e.h >> shift) & pMask
		child, added := pset(n.kids[i], shift+pBits, e)
		kids := *n.kids
		kids[i] = child
		return &pnode{kids: &kids}, added
	}
	for i, x := range n.ents {
		if x.h == e.h && x.k == e.k {
			if x.v == e.v {
				return n, false
			}
			ents := append([]pent(nil), n.ents...)
			ents[i] = e
			return &pnode{ents: ents}, false
		}
	}
	if n.ents[0].h == e.h || shift >= pMaxShift {
		ents := append(append(make([]pent, 0, len(n.ents)+1), n.ents...), e)
		return &pnode{ents: ents}, true
	}
	// Split the leaf: its entries share a hash and e differs from it at or below
	// this level. Re-inserting into the new internal node recurses until the
	// hashes part.
	var kids [pWidth]*pnode
	kids[(n.ents[0].h>>shift)&pMask] = n
	return pset(&pnode{kids: &kids}, shift, e)
}

// del returns a map without k (m itself when it has no k; the zero pmap when
// it has only k); m is unchanged. Emptied nodes are left in place
// (no canonical shape is needed: diff and get do not depend on it).
func (m pmap) del(k string) pmap {
	h := phash(k)
	root, removed := pdel(m.root, 0, h, k)
	if !removed {
		return m
	}
	if root == nil {
		return pmap{}
	}
	return pmap{root: root, size: m.size - 1, rec: -1}
}

func pdel(n *pnode, shift uint, h uint64, k string) (*pnode, bool) {
	if n == nil {
		return nil, false
	}
	if n.kids != nil {
		i := (h >> shift) & pMask
		child, removed := pdel(n.kids[i], shift+pBits, h, k)
		if !removed {
			return n, false
		}
		kids := *n.kids
		kids[i] = child
		return &pnode{kids: &kids}, true
	}
	for i, e := range n.ents {
		if e.h == h && e.k == k {
			if len(n.ents) == 1 {
				return nil, true
			}
			return &pnode{ents: slices.Delete(slices.Clone(n.ents), i, i+1)}, true
		}
	}
	return n, false
}

// each calls f for every entry in hash order.
func (m pmap) each(f func(k string, v int32)) { walk(m.root, f) }

func walk(n *pnode, f func(k string, v int32)) {
	if n == nil {
		return
	}
	if n.kids == nil {
		for _, e := range n.ents {
			f(e.k, e.v)
		}
		return
	}
	for _, c := range n.kids {
		walk(c, f)
	}
}

// diff calls f for every key whose value differs between a and b (absent on one
// side included). Subtrees shared by pointer are skipped.
func diff(a, b pmap, f func(k string)) {
	pdiff(a.root, b.root, 0, f)
}

func pdiff(a, b *pnode, shift uint, f func(k string)) {
	if a == b {
		return
	}
	if a != nil && b != nil && a.kids != nil && b.kids != nil {
		for i := range pWidth {
			pdiff(a.kids[i], b.kids[i], shift+pBits, f)
		}
		return
	}
	// At least one side is a leaf or empty: compare entry by entry.
	am, bm := leafEntries(a), leafEntries(b)
	for k, v := range am {
		if w, ok := bm[k]; !ok || w != v {
			f(k)
		}
	}
	for k := range bm {
		if _, ok := am[k]; !ok {
			f(k)
		}
	}
}

// leafEntries flattens a (small) subtree into a map.
func leafEntries(n *pnode) map[string]int32 {
	out := map[string]int32{}
	walk(n, func(k string, v int32) { out[k] = v })
	return out
}
