package packstore

import (
	"math/rand/v2"
	"testing"
)

// frameFlagsOnDisk reads every shard file of dir in stream order and returns,
// per record ID, the flags of its last frame (the one Get serves).
func frameFlagsOnDisk(t *testing.T, dir string) map[ID]byte {
	t.Helper()
	ids, flags := frameOrderOnDisk(t, dir)
	out := map[ID]byte{}
	for i, id := range ids {
		out[id] = flags[i]
	}
	return out
}

// A commit-sized batch (below InlineCompressMin records) is written without
// zstd except its Dense records, a bulk batch with it, and Repack compresses
// the raw copies; every record reads back before and after, and after a
// reopen (Options.InlineCompressMin).
func TestInlineCompressMin(t *testing.T) {
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 17))
	dir := t.TempDir()
	s := openStore(t, DefaultOptions(dir))
	coll := idN(1, 1)
	want := map[ID][]byte{}
	var small, bulk []Record
	for i := range 16 {
		rec := Record{ID: idN(2, i), Data: payload(r, 300+r.IntN(700), true)}
		small = append(small, rec)
	}
	dense := Record{ID: idN(3, 0), Data: payload(r, 600, true), Dense: true}
	small = append(small, dense)
	for i := range DefaultInlineCompressMin {
		bulk = append(bulk, Record{ID: idN(4, i), Data: payload(r, 300+r.IntN(700), true)})
	}
	var ids []ID
	for _, batch := range [][]Record{small, bulk} {
		if err := s.PutMany(coll, batch); err != nil {
			t.Fatal(err)
		}
		for _, rec := range batch {
			want[rec.ID] = rec.Data
			ids = append(ids, rec.ID)
		}
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	flags := frameFlagsOnDisk(t, dir)
	for _, rec := range small[:16] {
		if flags[rec.ID] != 0 {
			t.Fatalf("record %s of a 17-record batch: flags %#x, want 0 (raw until repack)", rec.ID, flags[rec.ID])
		}
	}
	if flags[dense.ID] != FlagZstd {
		t.Fatalf("Dense record of a small batch: flags %#x, want FlagZstd", flags[dense.ID])
	}
	for _, rec := range bulk {
		if flags[rec.ID] != FlagZstd {
			t.Fatalf("record %s of a %d-record batch: flags %#x, want FlagZstd", rec.ID, len(bulk), flags[rec.ID])
		}
	}
	for id, data := range want {
		mustGet(t, s, coll, id, data)
	}
	_, before, _ := s.CollectionStats(coll)
	st, err := s.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: coll, Records: ids}}})
	if err != nil {
		t.Fatal(err)
	}
	_, after, _ := s.CollectionStats(coll)
	if after >= before || st.BytesCopied != after {
		t.Fatalf("live bytes %d before repack, %d after (copied %d): the raw frames were not compressed", before, after, st.BytesCopied)
	}
	for id, f := range frameFlagsOnDisk(t, dir) {
		if f != FlagZstd {
			t.Fatalf("after repack record %s has flags %#x, want FlagZstd", id, f)
		}
	}
	for id, data := range want {
		mustGet(t, s, coll, id, data)
	}
	mustCheck(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, DefaultOptions(dir))
	defer s.Close()
	for id, data := range want {
		mustGet(t, s, coll, id, data)
	}

	// InlineCompressMin 1 compresses every batch.
	dir2 := t.TempDir()
	o := DefaultOptions(dir2)
	o.InlineCompressMin = 1
	s2 := openStore(t, o)
	defer s2.Close()
	if err := s2.PutMany(coll, small[:16]); err != nil {
		t.Fatal(err)
	}
	if err := s2.Sync(); err != nil {
		t.Fatal(err)
	}
	for id, f := range frameFlagsOnDisk(t, dir2) {
		if f != FlagZstd {
			t.Fatalf("InlineCompressMin 1: record %s has flags %#x, want FlagZstd", id, f)
		}
	}
}

// A bulk writer that spreads each commit over many collections in PutMany
// calls below InlineCompressMin records still gets its records compressed:
// a PutMany compresses once the commit (the records since the last Sync)
// reaches InlineCompressMin, or when the previous commit did. A commit of
// a few records after a small commit stays raw.
func TestInlineCompressPerCommit(t *testing.T) {
	r := rand.New(rand.NewPCG(testSeed(t), 19))
	dir := t.TempDir()
	s := openStore(t, DefaultOptions(dir))
	defer s.Close()
	n := 0
	put := func(calls, per int) [][]ID {
		t.Helper()
		out := make([][]ID, calls)
		for c := range calls {
			var recs []Record
			for range per {
				recs = append(recs, Record{ID: idN(5, n), Data: payload(r, 300+r.IntN(700), true)})
				out[c] = append(out[c], idN(5, n))
				n++
			}
			if err := s.PutMany(idN(1, c), recs); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	first := put(4, 20)  // 20, 40, 60 records: raw; 80 >= 64: compressed
	second := put(4, 20) // the previous commit had 80
	small1 := put(2, 8)  // 16 records after an 80-record commit: compressed
	small2 := put(2, 8)  // 16 records after a 16-record commit: raw
	flags := frameFlagsOnDisk(t, dir)
	for _, tc := range []struct {
		name string
		ids  [][]ID
		want []byte // per PutMany call
	}{
		{"first commit", first, []byte{0, 0, 0, FlagZstd}},
		{"second commit", second, []byte{FlagZstd, FlagZstd, FlagZstd, FlagZstd}},
		{"small commit after a large one", small1, []byte{FlagZstd, FlagZstd}},
		{"small commit after a small one", small2, []byte{0, 0}},
	} {
		for c, ids := range tc.ids {
			for _, id := range ids {
				if flags[id] != tc.want[c] {
					t.Fatalf("%s, PutMany %d: record %s has flags %#x, want %#x", tc.name, c, id, flags[id], tc.want[c])
				}
			}
		}
	}
	mustCheck(t, s)
}
