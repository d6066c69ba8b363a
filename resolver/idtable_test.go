package resolver

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/mtxdb/mtxdb/packstore"
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

// TestRecordTableModel: recordTable answers as a map from record ID to first
// index does, for random ID sets with repeats, IDs sharing the eight bytes the
// table homes by (so a probe must compare whole IDs), and lookups of absent IDs
// (seed printed).
func TestRecordTableModel(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	randID := func(n int) packstore.ID {
		var id packstore.ID
		binary.LittleEndian.PutUint64(id[:8], uint64(r.IntN(max(1, n/4))))
		id[8+r.IntN(len(id)-8)] = byte(r.IntN(4))
		return id
	}
	for round := range 200 {
		n := r.IntN(3000)
		recs := make([]packstore.ID, n)
		model := map[packstore.ID]int32{}
		for i := range recs {
			recs[i] = randID(n)
			if _, ok := model[recs[i]]; !ok {
				model[recs[i]] = int32(i)
			}
		}
		tab := newRecordTable(recs)
		for rec, want := range model {
			if got, ok := tab.find(rec); !ok || got != want {
				t.Fatalf("seed %d round %d: find(%x) = %d, %v; want %d", seed, round, rec, got, ok, want)
			}
		}
		for range 100 {
			rec := randID(2 * n)
			want, wantOK := model[rec]
			if got, ok := tab.find(rec); ok != wantOK || (ok && got != want) {
				t.Fatalf("seed %d round %d: find(%x) = %d, %v; want %d, %v", seed, round, rec, got, ok, want, wantOK)
			}
		}
	}
	var empty recordTable
	if _, ok := empty.find(packstore.ID{}); ok {
		t.Fatal("zero recordTable found an ID")
	}
}
