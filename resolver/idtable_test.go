package resolver

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestIDTableModel: idTable answers as a map from ID to first index does, for
// random ID sets with repeats and lookups of absent IDs (seed printed).
func TestIDTableModel(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	for round := range 200 {
		n := r.IntN(3000)
		ids := make([]string, n)
		model := map[string]int32{}
		for i := range ids {
			ids[i] = fmt.Sprintf("$%x", r.IntN(max(1, 2*n)))
			if _, ok := model[ids[i]]; !ok {
				model[ids[i]] = int32(i)
			}
		}
		tab := newIDTable(ids)
		for id, want := range model {
			if got, ok := tab.find(ids, id); !ok || got != want {
				t.Fatalf("seed %d round %d: find(%q) = %d, %v; want %d", seed, round, id, got, ok, want)
			}
		}
		for range 100 {
			id := fmt.Sprintf("$%x", r.IntN(4*n+1))
			want, wantOK := model[id]
			if got, ok := tab.find(ids, id); ok != wantOK || (ok && got != want) {
				t.Fatalf("seed %d round %d: find(%q) = %d, %v; want %d, %v", seed, round, id, got, ok, want, wantOK)
			}
		}
	}
	var empty idTable
	if _, ok := empty.find(nil, "$x"); ok {
		t.Fatal("zero idTable found an ID")
	}
}
