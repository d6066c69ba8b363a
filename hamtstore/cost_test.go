package hamtstore

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestCostSetGet: in a map of 10k keys, one Set writes at most depth+1 nodes in
// one PutNodes call, and a Get through a fresh Reader reads at most depth nodes.
func TestCostSetGet(t *testing.T) {
	store := NewMemNodeStore()
	root := buildMap(t, store, 10000)
	depth, err := NewReader(store).depthOf(root)
	noErr(t, err)
	t.Logf("10k keys: depth %d, %d nodes", depth, store.Len())
	isTrue(t, depth >= 3 && depth <= 6, "depth %d", depth)

	rng := rand.New(rand.NewPCG(testSeed(t), 2))
	for i := range 200 {
		store.ResetCounters()
		var key []byte
		if i%2 == 0 {
			key = fmt.Appendf(nil, "key %d", rng.IntN(10000)) // update
		} else {
			key = fmt.Appendf(nil, "new key %d", i) // insert
		}
		next, err := Set(store, NewReader(store), root, key, Value{0xAB, byte(i)})
		noErr(t, err)
		path := pathLen(t, NewReader(store), next, key)
		isTrue(t, path <= depth+1, "path %d, depth %d", path, depth)
		isTrue(t, store.PutCalls() == 1, "PutCalls %d", store.PutCalls())
		isTrue(t, store.Puts() <= int64(path), "Set of %q wrote %d nodes, path %d", key, store.Puts(), path)

		r := NewReader(store)
		v, ok, err := r.Get(next, key)
		noErr(t, err)
		isTrue(t, ok && v == Value{0xAB, byte(i)})
		isTrue(t, r.NodesRead() <= path, "Get read %d nodes, path %d", r.NodesRead(), path)
		// A second Get of the same key through the same Reader reads nothing.
		before := r.NodesRead()
		_, _, err = r.Get(next, key)
		noErr(t, err)
		equal(t, before, r.NodesRead())
	}
}

// TestCostDiff: Diff and DiffN between roots that differ in k keys read
// O(k x depth) nodes, not the whole map.
func TestCostDiff(t *testing.T) {
	store := NewMemNodeStore()
	root := buildMap(t, store, 10000)
	total := store.Len()
	depth, err := NewReader(store).depthOf(root)
	noErr(t, err)
	rng := rand.New(rand.NewPCG(testSeed(t), 3))
	for _, k := range []int{1, 2, 5, 20} {
		var changes []Change
		for i := range k {
			switch i % 3 {
			case 0:
				changes = append(changes, Change{Key: fmt.Appendf(nil, "key %d", rng.IntN(10000)), Value: Value{0xCD}})
			case 1:
				changes = append(changes, Change{Key: fmt.Appendf(nil, "key %d", rng.IntN(10000)), Delete: true})
			default:
				changes = append(changes, Change{Key: fmt.Appendf(nil, "fresh %d", i), Value: Value{0xEF}})
			}
		}
		other, err := Apply(store, nil, root, changes)
		noErr(t, err)
		r := NewReader(store)
		reported := 0
		noErr(t, r.Diff(root, other, func([]byte, *Value, *Value) error { reported++; return nil }))
		isTrue(t, reported <= k && reported >= 1, "k=%d reported %d", k, reported)
		limit := 2 * k * depth
		isTrue(t, r.NodesRead() <= limit, "k=%d: Diff read %d nodes, limit %d (map has %d)", k, r.NodesRead(), limit, total)
		t.Logf("k=%d: Diff read %d nodes of %d (depth %d)", k, r.NodesRead(), total, depth)

		r = NewReader(store)
		noErr(t, r.DiffN([]NodeID{root, other, root}, func([]byte, []*Value) error { return nil }))
		isTrue(t, r.NodesRead() <= limit, "k=%d: DiffN read %d nodes, limit %d", k, r.NodesRead(), limit)
	}
	r := NewReader(store)
	noErr(t, r.Diff(root, root, func([]byte, *Value, *Value) error { t.Fatal("reported"); return nil }))
	isTrue(t, r.NodesRead() <= 1, "Diff of equal roots read %d", r.NodesRead())
}

// TestWalk checks that Walk visits every node once, parents first, and that
// declining to descend skips a subtree without reading it.
func TestWalk(t *testing.T) {
	store := NewMemNodeStore()
	root := buildMap(t, store, 3000)
	r := NewReader(store)
	seen := map[NodeID]bool{}
	noErr(t, r.Walk(root, func(id NodeID) (bool, error) {
		isTrue(t, !seen[id], "visited twice")
		seen[id] = true
		return true, nil
	}))
	equal(t, store.Len(), len(seen)) // one batch: every stored node is reachable
	equal(t, store.Len(), r.NodesRead())

	// Pre-order: every node's children come after it.
	order := map[NodeID]int{}
	var ids []NodeID
	noErr(t, NewReader(store).Walk(root, func(id NodeID) (bool, error) {
		order[id] = len(ids)
		ids = append(ids, id)
		return true, nil
	}))
	r2 := NewReader(store)
	for _, id := range ids {
		n, err := r2.load(id, depthIn(t, r, id))
		noErr(t, err)
		for _, c := range n.children {
			isTrue(t, order[c.id] > order[id], "child before parent")
		}
	}

	// Only the root: one visit, nothing read.
	r3 := NewReader(store)
	visits := 0
	noErr(t, r3.Walk(root, func(NodeID) (bool, error) { visits++; return false, nil }))
	equal(t, 1, visits)
	equal(t, 0, r3.NodesRead())
}

func depthIn(t *testing.T, r *Reader, id NodeID) int {
	n, ok := r.nodes[id]
	isTrue(t, ok)
	return n.depth
}

// pathLen returns the number of nodes on key's path from root.
func pathLen(t *testing.T, r *Reader, root NodeID, key []byte) int {
	n, err := r.root(root)
	noErr(t, err)
	h := keyHash(key)
	count := 1
	for !n.collision {
		bit := uint32(1) << fragment(&h, n.depth)
		if n.nodemap&bit == 0 {
			break
		}
		n, err = r.child(n, index(n.nodemap, bit))
		noErr(t, err)
		count++
	}
	return count
}
