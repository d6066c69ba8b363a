package hamtstore

import (
	"bytes"
	"fmt"
)

// Reader reads maps through a NodeStore. It keeps every node it decodes (and
// every node Apply builds through it) for its lifetime, and children, once
// resolved, are held by pointer in their parent (pointer swizzling), so
// a node is read from the store at most once per Reader. Make a Reader per
// traversal or task, or call Reset, to bound the memory it holds.
//
// A Reader is not safe for concurrent use.
type Reader struct {
	store NodeStore
	nodes map[NodeID]*node // every decoded node, by ID
	reads int
	// checked: subtrees CheckShared has passed, with their key counts.
	checked map[checkedKey]int
}

// NewReader returns a Reader over store.
func NewReader(store NodeStore) *Reader {
	return &Reader{store: store, nodes: make(map[NodeID]*node)}
}

// NodesRead returns the number of GetNode calls this Reader has made.
func (r *Reader) NodesRead() int { return r.reads }

// Reset forgets every decoded node (NodesRead is kept).
func (r *Reader) Reset() { r.nodes = make(map[NodeID]*node) }

// load returns the node id, expected at depth, decoding it on first use. It
// checks that the ID is the hash of the stored bytes and that the node sits at
// the expected depth.
func (r *Reader) load(id NodeID, depth int) (*node, error) {
	if n, ok := r.nodes[id]; ok {
		if n.depth != depth {
			return nil, corruptf(id, "node at depth %d reached at depth %d", n.depth, depth)
		}
		return n, nil
	}
	r.reads++
	data, err := r.store.GetNode(id)
	if err != nil {
		return nil, fmt.Errorf("hamtstore: read node %x: %w", id[:], err)
	}
	n, err := decodeVerified(id, data, depth)
	if err != nil {
		return nil, err
	}
	r.nodes[id] = n
	return n, nil
}

// decodeVerified decodes data, checks that id is its hash and that the node
// sits at depth.
func decodeVerified(id NodeID, data []byte, depth int) (*node, error) {
	if got := NodeIDOf(data); got != id {
		return nil, corruptf(id, "content hashes to %x", got[:])
	}
	n, err := decodeNode(id, data)
	if err != nil {
		return nil, err
	}
	if n.depth != depth {
		return nil, corruptf(id, "node at depth %d reached at depth %d", n.depth, depth)
	}
	return n, nil
}

// root returns the root node, or nil for EmptyRoot.
func (r *Reader) root(id NodeID) (*node, error) {
	if id == EmptyRoot {
		return nil, nil
	}
	return r.load(id, 0)
}

// child resolves n's i-th child, keeping the resolved pointer in n.
func (r *Reader) child(n *node, i int) (*node, error) {
	c := &n.children[i]
	if c.n == nil {
		cn, err := r.load(c.id, n.depth+1)
		if err != nil {
			return nil, err
		}
		c.n = cn
	}
	return c.n, nil
}

// Get returns the value stored under key in the map rooted at root, and whether
// it is present. It reads at most one node per level of the key's path.
func (r *Reader) Get(root NodeID, key []byte) (Value, bool, error) {
	n, err := r.root(root)
	if err != nil || n == nil {
		return Value{}, false, err
	}
	h := keyHash(key)
	for {
		if n.collision {
			for _, e := range n.entries {
				if bytes.Equal(e.key, key) {
					return e.val, true, nil
				}
			}
			return Value{}, false, nil
		}
		bit := uint32(1) << fragment(&h, n.depth)
		switch {
		case n.datamap&bit != 0:
			e := n.entries[index(n.datamap, bit)]
			if bytes.Equal(e.key, key) {
				return e.val, true, nil
			}
			return Value{}, false, nil
		case n.nodemap&bit != 0:
			if n, err = r.child(n, index(n.nodemap, bit)); err != nil {
				return Value{}, false, err
			}
		default:
			return Value{}, false, nil
		}
	}
}

// Iterate calls fn for every key of the map rooted at root, in key-hash order
// (slot by slot, depth first; keys of a collision node bytewise). It stops at
// the first error from fn or from reading, and returns it. fn must not modify
// key (it may keep it: keys are immutable).
func (r *Reader) Iterate(root NodeID, fn func(key []byte, v Value) error) error {
	n, err := r.root(root)
	if err != nil || n == nil {
		return err
	}
	return r.iterate(n, fn)
}

func (r *Reader) iterate(n *node, fn func(key []byte, v Value) error) error {
	if n.collision {
		for _, e := range n.entries {
			if err := fn(e.key, e.val); err != nil {
				return err
			}
		}
		return nil
	}
	for m := n.datamap | n.nodemap; m != 0; m &= m - 1 {
		bit := m & -m
		if n.datamap&bit != 0 {
			e := n.entries[index(n.datamap, bit)]
			if err := fn(e.key, e.val); err != nil {
				return err
			}
			continue
		}
		c, err := r.child(n, index(n.nodemap, bit))
		if err != nil {
			return err
		}
		if err := r.iterate(c, fn); err != nil {
			return err
		}
	}
	return nil
}

// Len returns the number of keys in the map rooted at root. It reads every node.
func (r *Reader) Len(root NodeID) (int, error) {
	n, err := r.root(root)
	if err != nil || n == nil {
		return 0, err
	}
	return r.count(n)
}

func (r *Reader) count(n *node) (int, error) {
	total := len(n.entries)
	for i := range n.children {
		c, err := r.child(n, i)
		if err != nil {
			return 0, err
		}
		k, err := r.count(c)
		if err != nil {
			return 0, err
		}
		total += k
	}
	return total, nil
}

// Walk visits the ID of every node reachable from root in pre-order (a parent
// before its children, children in slot order). If fn returns descend == false
// the node's children are skipped and the node itself is not read; an error from
// fn stops the walk and is returned. Walk of EmptyRoot visits nothing.
func (r *Reader) Walk(root NodeID, fn func(id NodeID) (descend bool, err error)) error {
	if root == EmptyRoot {
		return nil
	}
	return r.walk(root, 0, fn)
}

func (r *Reader) walk(id NodeID, depth int, fn func(id NodeID) (bool, error)) error {
	descend, err := fn(id)
	if err != nil || !descend {
		return err
	}
	n, err := r.load(id, depth)
	if err != nil {
		return err
	}
	for i := range n.children {
		c := &n.children[i]
		if err := r.walk(c.id, depth+1, fn); err != nil {
			return err
		}
		if c.n == nil {
			// Keep the swizzled pointer if walk decoded the child.
			c.n = r.nodes[c.id]
		}
	}
	return nil
}

// depthOf is a small helper for tests and metrics: the number of node levels on
// the deepest path of the map rooted at root (0 for EmptyRoot).
func (r *Reader) depthOf(root NodeID) (int, error) {
	deepest := 0
	var walk func(n *node) error
	walk = func(n *node) error {
		if n.depth+1 > deepest {
			deepest = n.depth + 1
		}
		for i := range n.children {
			c, err := r.child(n, i)
			if err != nil {
				return err
			}
			if err := walk(c); err != nil {
				return err
			}
		}
		return nil
	}
	n, err := r.root(root)
	if err != nil || n == nil {
		return 0, err
	}
	return deepest, walk(n)
}
