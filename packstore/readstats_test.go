package packstore

import (
	"bytes"
	"sync"
	"testing"
)

func readStatsStore(t *testing.T, cache int64) *PackfileStorage {
	t.Helper()
	s := openStore(t, Options{Dir: t.TempDir(), CacheBytes: cache})
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func mustGetKind(t *testing.T, s KindGetter, coll, id ID, k ReadKind, want []byte) {
	t.Helper()
	got, err := s.GetKind(coll, id, k)
	if err != nil {
		t.Fatalf("GetKind %s: %v", id, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("GetKind %s: got %d bytes, want %d", id, len(got), len(want))
	}
}

func wantCounters(t *testing.T, what string, got, want ReadCounters) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: counters %+v, want %+v", what, got, want)
	}
}

// Two records written back to back sit in one page: reading both is one
// seek and one page; a record 100 KiB further on is a second seek and page.
func TestReadStatsSeeksAndPages(t *testing.T) {
	s := readStatsStore(t, 0)
	coll := idN(1, 0)
	small := []byte("0123456789")
	a, b, far := idN(2, 1), idN(2, 2), idN(2, 3)
	if err := s.PutMany(coll, []Record{{ID: a, Data: small}, {ID: b, Data: small}}); err != nil {
		t.Fatal(err)
	}
	var filler []Record
	for i := range 100 {
		filler = append(filler, Record{ID: idN(3, i), Data: make([]byte, 1024)})
	}
	if err := s.PutMany(coll, filler); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(coll, far, small); err != nil {
		t.Fatal(err)
	}
	frame := int64(FrameOverhead + len(small))

	s.ResetReadStats()
	mustGetKind(t, s, coll, a, 1, small)
	mustGetKind(t, s, coll, b, 1, small)
	wantCounters(t, "adjacent", s.ReadStats()[1], ReadCounters{Reads: 2, Bytes: 2 * frame, Pages: 1, Seeks: 1})

	s.ResetReadStats()
	mustGetKind(t, s, coll, a, 1, small)
	mustGetKind(t, s, coll, far, 1, small)
	wantCounters(t, "far apart", s.ReadStats()[1], ReadCounters{Reads: 2, Bytes: 2 * frame, Pages: 2, Seeks: 2})

	// Backwards within the previous read's page: no seek. Far, then back: a seek.
	s.ResetReadStats()
	mustGetKind(t, s, coll, b, 1, small)
	mustGetKind(t, s, coll, a, 1, small)
	mustGetKind(t, s, coll, far, 2, small)
	mustGetKind(t, s, coll, a, 2, small)
	st := s.ReadStats()
	wantCounters(t, "kind 1", st[1], ReadCounters{Reads: 2, Bytes: 2 * frame, Pages: 1, Seeks: 1})
	wantCounters(t, "kind 2", st[2], ReadCounters{Reads: 2, Bytes: 2 * frame, Pages: 2, Seeks: 2})
	if len(st) != 2 {
		t.Fatalf("kinds %v, want 1 and 2 only", st)
	}
	// The total counts a page two kinds touched once; seeks and reads add up.
	wantCounters(t, "total", s.ReadStatsTotal(), ReadCounters{Reads: 4, Bytes: 4 * frame, Pages: 2, Seeks: 3})

	// Uncached repeated reads: each is a physical read, the page counts once.
	s.ResetReadStats()
	for range 3 {
		mustGetKind(t, s, coll, far, 1, small)
	}
	wantCounters(t, "repeat uncached", s.ReadStats()[1], ReadCounters{Reads: 3, Bytes: 3 * frame, Pages: 1, Seeks: 1})

	// Untagged reads count under ReadUntagged.
	s.ResetReadStats()
	mustGet(t, s, coll, a, small)
	wantCounters(t, "untagged", s.ReadStats()[ReadUntagged], ReadCounters{Reads: 1, Bytes: frame, Pages: 1, Seeks: 1})
}

// Sequential reads through consecutive pages: one seek; a frame spanning
// pages counts every page it covers.
func TestReadStatsSequentialAndSpanning(t *testing.T) {
	s := readStatsStore(t, 0)
	coll := idN(1, 0)
	var recs []Record
	for i := range 64 {
		recs = append(recs, Record{ID: idN(2, i), Data: make([]byte, 1000)})
	}
	big := Record{ID: idN(4, 0), Data: make([]byte, 3*ReadPageSize)}
	if err := s.PutMany(coll, append(recs, big)); err != nil {
		t.Fatal(err)
	}
	s.ResetReadStats()
	for _, r := range recs {
		mustGetKind(t, s, coll, r.ID, 3, r.Data)
	}
	c := s.ReadStats()[3]
	wantBytes := int64(64 * (FrameOverhead + 1000))
	wantPages := (HeaderSize+wantBytes-1)/ReadPageSize - HeaderSize/ReadPageSize + 1
	wantCounters(t, "sequential", c, ReadCounters{Reads: 64, Bytes: wantBytes, Pages: wantPages, Seeks: 1})

	s.ResetReadStats()
	mustGetKind(t, s, coll, big.ID, 3, big.Data)
	c = s.ReadStats()[3]
	if c.Pages < 4 || c.Pages > 5 || c.Seeks != 1 || c.Reads != 1 {
		t.Fatalf("spanning frame of %d bytes: %+v, want 4 or 5 pages, 1 seek", FrameOverhead+len(big.Data), c)
	}
}

// A repeated read of a cached record is a cache hit: no read, page or seek.
func TestReadStatsCacheHit(t *testing.T) {
	s := readStatsStore(t, 1<<20)
	coll, id := idN(1, 0), idN(2, 0)
	data := []byte("cached payload")
	if err := s.Put(coll, id, data); err != nil {
		t.Fatal(err)
	}
	s.ResetReadStats()
	mustGetKind(t, s, coll, id, 5, data)
	s.cache.c.Wait()
	for range 4 {
		mustGetKind(t, s, coll, id, 5, data)
	}
	wantCounters(t, "cached", s.ReadStats()[5], ReadCounters{Reads: 1, Bytes: int64(FrameOverhead + len(data)), Pages: 1, Seeks: 1, CacheHits: 4})
}

func TestReadStatsConcurrent(t *testing.T) {
	s := readStatsStore(t, 0)
	coll := idN(1, 0)
	var recs []Record
	for i := range 50 {
		recs = append(recs, Record{ID: idN(2, i), Data: []byte("x")})
	}
	if err := s.PutMany(coll, recs); err != nil {
		t.Fatal(err)
	}
	s.ResetReadStats()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for _, r := range recs {
				if _, err := s.GetKind(coll, r.ID, ReadKind(g%2+1)); err != nil {
					t.Error(err)
				}
			}
			_ = s.ReadStats()
		})
	}
	wg.Wait()
	st := s.ReadStats()
	if st[1].Reads+st[2].Reads != 8*50 || st[1].Pages != 1 || st[2].Pages != 1 {
		t.Fatalf("concurrent: %+v", st)
	}
}

func TestReadStatsMem(t *testing.T) {
	m := NewMemStorage()
	coll, id := idN(1, 0), idN(2, 0)
	if err := m.Put(coll, id, []byte("abc")); err != nil {
		t.Fatal(err)
	}
	mustGetKind(t, m, coll, id, 7, []byte("abc"))
	mustGetKind(t, m, coll, id, 7, []byte("abc"))
	wantCounters(t, "mem", m.ReadStats()[7], ReadCounters{Reads: 2, Bytes: 6})
	m.ResetReadStats()
	if len(m.ReadStats()) != 0 {
		t.Fatal("reset left counters")
	}
}
