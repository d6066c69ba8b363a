package resolver

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"slices"

	"github.com/mtxdb/mtxdb/internal/strtab"

	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomstate"
)

// graph is the dense in-memory auth index of one room: every event numbered by its
// arrival index, its auth_events as numbers and as IDs, its state key interned,
// the state events citing it (auth children), and, per state event, its same-key
// lineage (the auth event with its own key: previous power levels, a member's
// previous membership) with skew-binary jump pointers, so that "is z a same-key
// ancestor of u" costs O(log lineage) instead of a walk of the key's history.
//
// It is built once per roomResolver from the room's graph records (roomstate
// Room.Graph: the persisted CSR of edges written at import), holds about 250 bytes
// per event (measured at 300k events; 1M events: ~250 MB), and answers every question the auth difference,
// the v2.1 conflicted subgraph and replay's ordering ask without reading or
// decoding a metadata record or a PDU.
type graph struct {
	ids      []string          // event ID by index
	index    idTable           // event ID -> index
	byRecord recordTable       // event record ID (HAMT value) -> index
	g        *roomrecord.Graph // edges by index (missing edges are -1)
	keys     []Key             // interned keys; g.Key[i] indexes it
	keyBuf   []byte            // keys[k] as a HAMT key (roomrecord.StateKey) is keyBuf[keyOff[k]:keyOff[k+1]]
	keyOff   []int
	kidsOff  []int32            // auth children CSR: kids of i are kids[kidsOff[i]:kidsOff[i+1]]
	kids     []int32            // state events only, in index order (re-sorted by replay)
	lin      []lineageLink      // same-key lineage, filled on use
	depth    []int32            // auth depth (AuthOrder), -1 until computed
	keyIndex *strtab.Index[Key] // Key -> interned index (over keys)
	pos      []int32            // during Replay: position in the replay order (-1: not replayed)
	// pre and size number the same-key lineage forest depth first (built on the
	// first sameKeyAncestor): u is in z's subtree iff pre[z] <= pre[u] <
	// pre[z]+size[z]. -1 for an event no walk from a lineage root reaches (on a
	// same-key cycle: bad data) and for events that are not state events.
	pre, size []int32
	// spares keeps the marks of the last walks over the graph when keepMarks
	// (set by Replay; sparesOf).
	spares    markSpares
	keepMarks bool
}

// markSpares returns the graph's spare marks, nil unless it keeps them.
func (g *graph) markSpares() *markSpares {
	if g.keepMarks {
		return &g.spares
	}
	return nil
}

// lineageLink is one event's place in its key's lineage.
type lineageLink struct {
	parent int32 // the auth event with the same key, -1 for none, -2 not computed
	jump   int32 // skew-binary jump pointer (itself at the lineage's root), -1 not computed
	sdepth int32 // lineage depth (0 at the root)
}

const linUnknown = -2

// newGraph loads the room's graph records and builds the index.
func newGraph(room *roomstate.Room) (*graph, error) {
	rg, err := room.Graph()
	if err != nil {
		return nil, err
	}
	return indexGraph(rg), nil
}

// indexGraph builds the index over a room's dense DAG.
func indexGraph(rg *roomrecord.Graph) *graph {
	n := len(rg.IDs)
	g := &graph{ids: rg.IDs, g: rg, keys: rg.Keys, keyIndex: strtab.IndexOf(rg.Keys, hashKey),
		index: newIDTable(rg.IDs), keyOff: make([]int, len(rg.Keys)+1)}
	size := 0
	for _, k := range rg.Keys {
		size += len(k.Type) + len(k.StateKey) + 2 // a type of up to 16,383 bytes
	}
	g.keyBuf = make([]byte, 0, size)
	for i, k := range rg.Keys {
		g.keyBuf = roomrecord.AppendStateKey(g.keyBuf, k.Type, k.StateKey)
		g.keyOff[i+1] = len(g.keyBuf)
	}
	recs := make([]packstore.ID, n)
	for i, id := range rg.IDs {
		recs[i] = roomrecord.EventRecordID(id)
	}
	g.byRecord = newRecordTable(recs)
	nkids := make([]int32, n+1)
	for i := range n {
		if rg.Key[i] >= 0 {
			for _, a := range rg.Auth(i) {
				if a >= 0 {
					nkids[a+1]++
				}
			}
		}
	}
	g.kidsOff = make([]int32, n+1)
	for i := range n {
		g.kidsOff[i+1] = g.kidsOff[i] + nkids[i+1]
	}
	g.kids = make([]int32, g.kidsOff[n])
	fill := make([]int32, n)
	for i := range n {
		if rg.Key[i] < 0 {
			continue
		}
		for _, a := range rg.Auth(i) {
			if a >= 0 {
				g.kids[g.kidsOff[a]+fill[a]] = int32(i)
				fill[a]++
			}
		}
	}
	g.lin = make([]lineageLink, n)
	g.depth = make([]int32, n)
	for i := range g.lin {
		g.lin[i] = lineageLink{parent: linUnknown, jump: -1}
		g.depth[i] = -1
	}
	return g
}

// hashKey hashes a Key for the graph's key index.
func hashKey(seed maphash.Seed, k Key) uint64 {
	return maphash.String(seed, k.Type)*0x9e3779b97f4a7c15 ^ maphash.String(seed, k.StateKey)
}

// keyIdx returns the interned index of k, false for a key no state event of the
// room has.
func (g *graph) keyIdx(k Key) (int32, bool) { return g.keyIndex.Find(k) }

// keyBytes returns key k as a HAMT key (roomrecord.StateKey), capped at its
// length.
func (g *graph) keyBytes(k int32) []byte { return g.keyBuf[g.keyOff[k]:g.keyOff[k+1]:g.keyOff[k+1]] }

// idx returns the index of an event of the room.
func (g *graph) idx(id string) (int32, error) {
	if i, ok := g.index.find(g.ids, id); ok {
		return i, nil
	}
	return 0, fmt.Errorf("%w: event %s is not in the room", errNoEvent, id)
}

// keyOf returns the interned key of a state event, -1 for other events.
func (g *graph) keyOf(i int32) int32 { return g.g.Key[i] }

// children returns the auth children of i (state events citing it), restricted
// during a replay to those already replayed (g.pos set, kids sorted by position).
func (g *graph) children(i int32, upTo int32) []string {
	hs := g.childHandles(i, upTo)
	ids := make([]string, len(hs))
	for j, h := range hs {
		ids[j] = g.ids[h]
	}
	return ids
}

// authIDs returns the auth_events of i as IDs, as the PDU lists them (those
// not in the room by the ID the PDU gives).
func (g *graph) authIDs(i int32) []string { return g.edgeIDs(i, g.g.Auth(int(i)), g.g.MissingAuth) }

// prevIDs returns the prev_events of i as IDs, as the PDU lists them.
func (g *graph) prevIDs(i int32) []string { return g.edgeIDs(i, g.g.Prev(int(i)), g.g.MissingPrev) }

// edgeIDs names the events of i's edges (indexes, -1 for an event not in the
// room, named by missing(i, position)).
func (g *graph) edgeIDs(i int32, edges []int32, missing func(i, j int) string) []string {
	ids := make([]string, len(edges))
	for j, a := range edges {
		if a >= 0 {
			ids[j] = g.ids[a]
		} else {
			ids[j] = missing(int(i), j)
		}
	}
	return ids
}

// childHandles is children by handle.
func (g *graph) childHandles(i int32, upTo int32) []int32 {
	lo, hi := g.kidsOff[i], g.kidsOff[i+1]
	if g.pos == nil {
		return g.kids[lo:hi]
	}
	// Kids are sorted by replay position, those never replayed (-1) last: the
	// ones replayed so far are a prefix, found by binary search (the create
	// event and each power levels event have most of the room as kids).
	ks := g.kids[lo:hi]
	n, _ := slices.BinarySearchFunc(ks, upTo, func(k int32, upTo int32) int {
		if p := g.pos[k]; p >= 0 && p <= upTo {
			return -1
		}
		return 1
	})
	return ks[:n]
}

// sortKidsByPosition orders each event's auth children by replay position (those
// never replayed last), so that children() can return a prefix.
func (g *graph) sortKidsByPosition() {
	n := len(g.ids)
	for i := range n {
		lo, hi := g.kidsOff[i], g.kidsOff[i+1]
		ks := g.kids[lo:hi]
		posOf := func(k int32) int64 {
			if p := g.pos[k]; p >= 0 {
				return int64(p)
			}
			return 1 << 40
		}
		slices.SortStableFunc(ks, func(a, b int32) int { return cmp.Compare(posOf(a), posOf(b)) })
	}
}

// sameKeyParent returns the auth event of i that has i's key, or -1.
func (g *graph) sameKeyParent(i int32) int32 {
	if p := g.lin[i].parent; p != linUnknown {
		return p
	}
	k := g.g.Key[i]
	p := int32(-1)
	if k >= 0 {
		for _, a := range g.g.Auth(int(i)) {
			if a >= 0 && g.g.Key[a] == k {
				p = a
				break
			}
		}
	}
	g.lin[i].parent = p
	return p
}

// link fills the lineage link of i (and of its same-key ancestors that lack it).
func (g *graph) link(i int32) lineageLink {
	if g.lin[i].jump >= 0 {
		return g.lin[i]
	}
	// Walk down to a linked ancestor (or the root), then fill upwards.
	var path []int32
	for cur := i; ; {
		p := g.sameKeyParent(cur)
		path = append(path, cur)
		if p < 0 {
			break
		}
		if len(path) > len(g.ids) { // a same-key cycle (bad data): cut it here
			g.lin[cur].parent = -1
			break
		}
		if g.lin[p].jump >= 0 {
			break
		}
		cur = p
	}
	for j := len(path) - 1; j >= 0; j-- {
		v := path[j]
		p := g.lin[v].parent
		if p < 0 {
			g.lin[v].jump, g.lin[v].sdepth = v, 0
			continue
		}
		l := &g.lin[v]
		l.sdepth = g.lin[p].sdepth + 1
		jp := g.lin[p].jump
		if g.lin[p].sdepth-g.lin[jp].sdepth == g.lin[jp].sdepth-g.lin[g.lin[jp].jump].sdepth {
			l.jump = g.lin[jp].jump
		} else {
			l.jump = p
		}
	}
	return g.lin[i]
}

// sameKeyAncestor reports whether z is u or reached from u through same-key auth
// events (u's previous power levels, a member's previous membership, ...): by
// the lineage forest's depth-first numbering, O(1), else by jump pointers.
func (g *graph) sameKeyAncestor(z, u int32) bool {
	if z == u {
		return true
	}
	if g.g.Key[z] != g.g.Key[u] || g.g.Key[z] < 0 {
		return false
	}
	if g.pre == nil {
		g.numberLineages()
	}
	if pz, pu := g.pre[z], g.pre[u]; pz >= 0 && pu >= 0 {
		return pz <= pu && pu < pz+g.size[z]
	}
	return g.climb(u, g.link(z).sdepth) == z
}

// numberLineages fills pre and size: a depth-first walk of the forest whose
// edges go from each state event's same-key auth event (sameKeyParent) to it,
// from every root (a state event with no same-key auth event).
func (g *graph) numberLineages() {
	n := int32(len(g.ids))
	g.pre, g.size = make([]int32, n), make([]int32, n)
	off := make([]int32, n+1) // children of p: kids[off[p]:off[p+1]]
	for i := range n {
		g.pre[i] = -1
		if g.g.Key[i] >= 0 {
			if p := g.sameKeyParent(i); p >= 0 {
				off[p+1]++
			}
		}
	}
	for i := range n {
		off[i+1] += off[i]
	}
	kids, fill := make([]int32, off[n]), make([]int32, n)
	for i := range n {
		if g.g.Key[i] >= 0 {
			if p := g.sameKeyParent(i); p >= 0 {
				kids[off[p]+fill[p]] = i
				fill[p]++
			}
		}
	}
	next := int32(0)
	var stack []int32 // entered events whose subtree is open
	for root := range n {
		if g.g.Key[root] < 0 || g.sameKeyParent(root) >= 0 {
			continue
		}
		g.pre[root], next = next, next+1
		stack = append(stack[:0], root)
		fill[root] = 0 // children of root entered so far
		for len(stack) > 0 {
			v := stack[len(stack)-1]
			if c := off[v] + fill[v]; c < off[v+1] {
				fill[v]++
				k := kids[c]
				g.pre[k], next = next, next+1
				fill[k] = 0
				stack = append(stack, k)
				continue
			}
			g.size[v] = next - g.pre[v]
			stack = stack[:len(stack)-1]
		}
	}
}

// climb returns the same-key ancestor of a at lineage depth d (a itself when it is
// not deeper), by jump pointer where the jump does not overshoot, else one link.
func (g *graph) climb(a int32, d int32) int32 {
	for la := g.link(a); la.sdepth > d; la = g.link(a) {
		if j := la.jump; g.link(j).sdepth >= d {
			a = j
		} else {
			a = la.parent
		}
	}
	return a
}

// lineageMeet returns the lowest common same-key ancestor of a and b (both of one
// key), -1 when they share none: both are brought to one lineage depth, then
// moved up together, by jump pointer where the jumps land on different events
// (jump pointers of equal depths land on equal depths), else one link. O(log).
func (g *graph) lineageMeet(a, b int32) int32 {
	d := min(g.link(a).sdepth, g.link(b).sdepth)
	a, b = g.climb(a, d), g.climb(b, d)
	for a != b {
		la, lb := g.link(a), g.link(b)
		if la.parent < 0 || lb.parent < 0 {
			return -1 // two lineage roots
		}
		if la.jump != lb.jump {
			a, b = la.jump, lb.jump
		} else {
			a, b = la.parent, lb.parent
		}
	}
	return a
}

// authDepth returns the auth depth of i: 0 without auth events, else one more than
// the deepest auth event. Errors on a cycle.
func (g *graph) authDepth(i int32) (int64, error) {
	if d := g.depth[i]; d >= 0 {
		return int64(d), nil
	}
	const expanded = -2
	stack := []int32{i}
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		if g.depth[x] >= 0 {
			stack = stack[:len(stack)-1]
			continue
		}
		if g.depth[x] != expanded {
			g.depth[x] = expanded
			pushed := false
			for _, a := range g.g.Auth(int(x)) {
				if a < 0 || g.depth[a] >= 0 {
					continue
				}
				if g.depth[a] == expanded {
					return 0, fmt.Errorf("%w: auth_events cycle at %s", ErrResolution, g.ids[a])
				}
				stack = append(stack, a)
				pushed = true
			}
			if pushed {
				continue
			}
		}
		d := int32(0)
		for _, a := range g.g.Auth(int(x)) {
			if a >= 0 {
				d = max(d, g.depth[a]+1)
			}
		}
		g.depth[x] = d
		stack = stack[:len(stack)-1]
	}
	return int64(g.depth[i]), nil
}
