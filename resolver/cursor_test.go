package resolver_test

import (
	"math/rand/v2"
	"testing"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/resolver"
)

// TestStateCursorMatchesHAMT: the state cursor answers every key of the auth
// index (and a key no event has) as a lookup in the snapshot's HAMT does, while
// it moves between the snapshots before and after every event of a forked
// generated room in random order: neighbours, far jumps, back to the empty
// state, the same snapshot twice. The seed is printed.
func TestStateCursorMatchesHAMT(t *testing.T) {
	room, r, ids := replayedResolver(t, generatedRoom(t, 5, 400, 4, "12"))
	keys, err := r.GraphKeys()
	if err != nil {
		t.Fatal(err)
	}
	keys = append(keys, resolver.Key{Type: "m.room.member", StateKey: "@nobody:x.test"})
	roots := []hamtstore.NodeID{hamtstore.EmptyRoot}
	for _, id := range ids {
		for _, f := range []func(string) (hamtstore.NodeID, error){room.StateBefore, room.StateAfter} {
			if root, err := f(id); err == nil {
				roots = append(roots, root)
			}
		}
	}
	seed := rand.Uint64()
	t.Logf("seed %d, %d snapshots, %d keys", seed, len(roots), len(keys))
	rng := rand.New(rand.NewPCG(seed, 2))
	at, found := 0, 0
	for move := 0; move < 300; move++ {
		switch rng.IntN(4) {
		case 0:
			at = rng.IntN(len(roots)) // anywhere
		case 1:
			at = 0 // the empty state
		case 2:
			// stay: the same snapshot again
		default:
			at = min(len(roots)-1, at+1+rng.IntN(3)) // a neighbour
		}
		for _, k := range keys {
			got, gotOK, err := r.Lookup(roots[at], k)
			if err != nil {
				t.Fatal(err)
			}
			want, wantOK, err := r.LookupHAMT(roots[at], k)
			if err != nil {
				t.Fatal(err)
			}
			if got != want || gotOK != wantOK {
				t.Fatalf("seed %d move %d snapshot %d key %v: cursor %q %v, HAMT %q %v", seed, move, at, k, got, gotOK, want, wantOK)
			}
			if gotOK {
				found++
			}
		}
	}
	if found < 1000 {
		t.Fatalf("seed %d: only %d keys found in the snapshots visited", seed, found)
	}
}
