package hamtstore

import (
	"fmt"
	"math/bits"
)

// Check walks every node of the map rooted at root, reading each one from the
// store again (not from the Reader's decoded nodes), and returns the first
// problem: a read error, or an error wrapping ErrCorrupt when a node's ID is not
// the hash of its bytes, a node fails to decode (see decodeNode's checks), a
// node sits at the wrong depth, a key's hash does not lead to where the key is,
// or a node below the root holds fewer than two keys in its subtree. Check of
// EmptyRoot returns nil. It reads every node once; NodesRead counts the reads.
func (r *Reader) Check(root NodeID) error {
	if root == EmptyRoot {
		return nil
	}
	var path [collisionDepth]uint
	_, err := r.check(root, 0, &path, nil, nil)
	return err
}

// CheckShared is Check for the many roots of one store that share subtrees (a
// room's state snapshots): a subtree this Reader already passed through
// CheckShared, at the same depth under the same slots, is not read again, and
// visit, if set, is called once for each entry of each node it reads (so once per
// entry across all the roots checked). The first failure of visit is returned.
// Checking n snapshots of s entries that differ by a few entries each costs about
// the distinct nodes, not n*s.
func (r *Reader) CheckShared(root NodeID, visit func(key []byte, v Value) error) error {
	if root == EmptyRoot {
		return nil
	}
	if r.checked == nil {
		r.checked = map[checkedKey]int{}
	}
	var path [collisionDepth]uint
	_, err := r.check(root, 0, &path, r.checked, visit)
	return err
}

// checkedKey names a subtree checked at a position: its ID, depth and the slots
// above it.
type checkedKey struct {
	id    NodeID
	depth int
	path  [collisionDepth]uint8 // slots are 5-bit
}

// check validates the subtree id at depth, whose slots above are path[:depth],
// and returns its key count. With memo, subtrees found there are taken as
// checked and the ones checked are added; visit sees every entry read.
func (r *Reader) check(id NodeID, depth int, path *[collisionDepth]uint, memo map[checkedKey]int, visit func([]byte, Value) error) (int, error) {
	var mk checkedKey
	if memo != nil {
		mk = checkedKey{id: id, depth: depth}
		for d := range depth {
			mk.path[d] = uint8(path[d])
		}
		if k, ok := memo[mk]; ok {
			return k, nil
		}
	}
	r.reads++
	data, err := r.store.GetNode(id)
	if err != nil {
		return 0, fmt.Errorf("hamtstore: check: read node %x: %w", id[:], err)
	}
	n, err := decodeVerified(id, data, depth)
	if err != nil {
		return 0, err
	}
	for i, e := range n.entries {
		h := keyHash(e.key)
		for d := 0; d < depth; d++ {
			if f := fragment(&h, d); f != path[d] {
				return 0, corruptf(id, "entry %d: key hash fragment %d at depth %d, but the node is under slot %d", i, f, d, path[d])
			}
		}
		if visit != nil {
			if err := visit(e.key, e.val); err != nil {
				return 0, err
			}
		}
	}
	total := len(n.entries)
	for m, i := n.nodemap, 0; m != 0; m, i = m&(m-1), i+1 {
		bit := m & -m
		path[depth] = uint(bits.TrailingZeros32(bit))
		k, err := r.check(n.children[i].id, depth+1, path, memo, visit)
		if err != nil {
			return 0, err
		}
		total += k
	}
	if depth > 0 && total < 2 {
		return 0, corruptf(id, "non-canonical: subtree at depth %d holds %d key(s); it must be inlined", depth, total)
	}
	if memo != nil {
		memo[mk] = total
	}
	return total, nil
}
