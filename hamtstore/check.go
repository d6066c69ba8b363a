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
	_, err := r.check(root, 0, &path)
	return err
}

// check validates the subtree id at depth, whose slots above are path[:depth],
// and returns its key count.
func (r *Reader) check(id NodeID, depth int, path *[collisionDepth]uint) (int, error) {
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
	}
	total := len(n.entries)
	for m, i := n.nodemap, 0; m != 0; m, i = m&(m-1), i+1 {
		bit := m & -m
		path[depth] = uint(bits.TrailingZeros32(bit))
		k, err := r.check(n.children[i].id, depth+1, path)
		if err != nil {
			return 0, err
		}
		total += k
	}
	if depth > 0 && total < 2 {
		return 0, corruptf(id, "non-canonical: subtree at depth %d holds %d key(s); it must be inlined", depth, total)
	}
	return total, nil
}
