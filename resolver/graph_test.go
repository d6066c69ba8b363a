package resolver

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/mtxdb/mtxdb/internal/testseed"
)

var graphSeed = flag.Uint64("graph.seed", 0, "seed of TestSameKeyAncestorModel (0: time-based)")

// TestSameKeyAncestorModel (and lineageMeet, the lowest common same-key ancestor)
// builds random rooms of same-key lineages (each state
// event's auth events name an earlier event of its key, or none, and a few other
// earlier events) and checks graph.sameKeyAncestor against walking the same-key
// parents, for every pair of events of one key, asked in random order, both by
// the depth-first numbering and by jump pointers alone (filled on use).
func TestSameKeyAncestorModel(t *testing.T) {
	seed := testseed.Seed(t, "graph.seed", *graphSeed, "")
	rng := rand.New(rand.NewPCG(seed, 1))
	for room := range 20 {
		n := 50 + rng.IntN(400)
		nkeys := 1 + rng.IntN(8)
		metas := make([]roomrecord.EventMeta, n)
		for i := range metas {
			m := roomrecord.EventMeta{Seq: uint32(i), EventID: fmt.Sprintf("$e%d", i)}
			if i > 0 && rng.IntN(5) > 0 {
				m.IsState, m.Type, m.StateKey = true, "k", fmt.Sprint(rng.IntN(nkeys))
			}
			for range rng.IntN(3) {
				if i > 0 {
					m.AuthEvents = append(m.AuthEvents, metas[rng.IntN(i)].EventID)
				}
			}
			if m.IsState && i > 0 && rng.IntN(4) > 0 { // a same-key auth event
				for try := 0; try < 10; try++ {
					a := rng.IntN(i)
					if metas[a].IsState && metas[a].StateKey == m.StateKey {
						m.AuthEvents = append(m.AuthEvents, metas[a].EventID)
						break
					}
				}
			}
			metas[i] = m
		}
		rg, err := roomrecord.GraphOf(metas)
		if err != nil {
			t.Fatal(err)
		}
		g := indexGraph(rg)
		// climbOnly answers by jump pointers alone: no event numbered.
		climbOnly := indexGraph(rg)
		climbOnly.pre, climbOnly.size = make([]int32, n), make([]int32, n)
		for i := range climbOnly.pre {
			climbOnly.pre[i] = -1
		}
		naive := func(z, u int32) bool {
			for cur := u; cur >= 0; cur = g.sameKeyParent(cur) {
				if cur == z {
					return true
				}
			}
			return false
		}
		pairs, yes := 0, 0
		for _, p := range rng.Perm(n * n) {
			z, u := int32(p/n), int32(p%n)
			if g.keyOf(z) < 0 || g.keyOf(z) != g.keyOf(u) {
				continue
			}
			want := naive(z, u)
			if got := g.sameKeyAncestor(z, u); got != want {
				t.Fatalf("seed %d room %d: sameKeyAncestor(%d, %d) = %v, want %v", seed, room, z, u, got, want)
			}
			if got := climbOnly.sameKeyAncestor(z, u); got != want {
				t.Fatalf("seed %d room %d: by jump pointers, sameKeyAncestor(%d, %d) = %v, want %v", seed, room, z, u, got, want)
			}
			meet := int32(-1) // the first of z's same-key ancestors that is one of u's
			for cur := z; cur >= 0 && meet < 0; cur = g.sameKeyParent(cur) {
				if naive(cur, u) {
					meet = cur
				}
			}
			if got := g.lineageMeet(z, u); got != meet {
				t.Fatalf("seed %d room %d: lineageMeet(%d, %d) = %d, want %d", seed, room, z, u, got, meet)
			}
			pairs++
			if want {
				yes++
			}
		}
		if yes == 0 || yes == pairs {
			t.Fatalf("seed %d room %d: %d pairs, %d ancestors: the rooms test nothing", seed, room, pairs, yes)
		}
	}
}
