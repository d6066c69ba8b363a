package packstore

import (
	"math/rand/v2"
	"testing"
)

// TestCollectionStatsSumToStats: per-collection live records and bytes add up to
// the store's, follow a superseding put and a deletion, and an unknown
// collection is not ok.
func TestCollectionStatsSumToStats(t *testing.T) {
	s, err := Open(DefaultOptions(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, b := ID{1}, ID{2}
	for i := range 10 {
		if err := s.Put(a, ID{byte(i)}, make([]byte, 100+i)); err != nil {
			t.Fatal(err)
		}
	}
	noise := make([]byte, 5000) // incompressible: stored at its size
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range noise {
		noise[i] = byte(rng.Uint32())
	}
	if err := s.Put(b, ID{1}, noise); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(a, ID{0}, make([]byte, 7)); err != nil { // supersedes a record
		t.Fatal(err)
	}
	check := func() {
		t.Helper()
		var recs int
		var bytes int64
		for _, c := range s.Collections() {
			n, by, ok := s.CollectionStats(c)
			if !ok {
				t.Fatalf("collection %v listed but not ok", c)
			}
			recs, bytes = recs+n, bytes+by
		}
		st := s.Stats()
		if recs != st.LiveRecords || bytes != st.LiveBytes {
			t.Fatalf("collections sum to %d records, %d bytes; Stats %d, %d", recs, bytes, st.LiveRecords, st.LiveBytes)
		}
	}
	check()
	if n, _, _ := s.CollectionStats(a); n != 10 {
		t.Fatalf("collection a: %d live records, want 10", n)
	}
	if _, by, _ := s.CollectionStats(b); by < 5000 {
		t.Fatalf("collection b: %d live bytes for a 5000-byte record", by)
	}
	if err := s.DeleteCollection(b); err != nil {
		t.Fatal(err)
	}
	check()
	if _, _, ok := s.CollectionStats(ID{9}); ok {
		t.Fatal("unknown collection is ok")
	}
}
