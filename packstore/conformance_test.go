package packstore

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

// engine is what the conformance suite drives: the StorageEngine plus the
// repack and listing operations both implementations offer.
type engine interface {
	StorageEngine
	Repack(RepackPlan) (RepackStats, error)
	CollectionRecords(ID) ([]ID, error)
}

var (
	_ engine = (*PackfileStorage)(nil)
	_ engine = (*MemStorage)(nil)
)

func TestConformancePackfile(t *testing.T) {
	runConformance(t, func(t *testing.T) engine {
		o := DefaultOptions(t.TempDir())
		o.MaxShardBytes = 64 << 10
		s := openStore(t, o)
		t.Cleanup(func() {
			if !s.closed.Load() {
				mustCheck(t, s)
				s.Close()
			}
		})
		return s
	})
}

func TestConformanceMem(t *testing.T) {
	runConformance(t, func(t *testing.T) engine { return NewMemStorage() })
}

func runConformance(t *testing.T, open func(t *testing.T) engine) {
	r := rand.New(rand.NewPCG(1, 2))
	c1, c2 := idN(1, 1), idN(1, 2)

	t.Run("PutGet", func(t *testing.T) {
		e := open(t)
		small, big, empty := payload(r, 10, false), payload(r, 5000, true), []byte{}
		for i, d := range [][]byte{small, big, empty} {
			if err := e.Put(c1, idN(2, i), d); err != nil {
				t.Fatal(err)
			}
		}
		mustGet(t, e, c1, idN(2, 0), small)
		mustGet(t, e, c1, idN(2, 1), big)
		got, err := e.Get(c1, idN(2, 2))
		if err != nil || got == nil || len(got) != 0 {
			t.Fatalf("empty payload: got %v, %v; want non-nil empty", got, err)
		}
		// Owned copy: mutating the result does not change the store.
		got, _ = e.Get(c1, idN(2, 0))
		got[0] ^= 0xff
		mustGet(t, e, c1, idN(2, 0), small)
		// Mutating the caller's buffer after Put does not either.
		buf := []byte("abc")
		e.Put(c1, idN(2, 9), buf)
		buf[0] = 'x'
		mustGet(t, e, c1, idN(2, 9), []byte("abc"))
	})

	t.Run("NotFound", func(t *testing.T) {
		e := open(t)
		mustNotFound(t, e, c1, idN(2, 0))
		e.Put(c1, idN(2, 0), []byte("x"))
		mustNotFound(t, e, c1, idN(2, 1))
		mustNotFound(t, e, c2, idN(2, 0))
	})

	t.Run("GetMany", func(t *testing.T) {
		e := open(t)
		var recs []Record
		for i := range 200 {
			recs = append(recs, Record{ID: idN(3, i), Data: payload(r, r.IntN(300), i%2 == 0)})
		}
		if err := e.PutMany(c1, recs); err != nil {
			t.Fatal(err)
		}
		ids := []ID{idN(3, 5), idN(9, 9), idN(3, 199), idN(3, 5), idN(3, 0)}
		got, err := e.GetMany(c1, ids)
		if err != nil {
			t.Fatal(err)
		}
		want := [][]byte{recs[5].Data, nil, recs[199].Data, recs[5].Data, recs[0].Data}
		for i := range want {
			if (got[i] == nil) != (want[i] == nil) || !bytes.Equal(got[i], want[i]) {
				t.Fatalf("GetMany[%d] = %d bytes (nil %v), want %d bytes (nil %v)", i, len(got[i]), got[i] == nil, len(want[i]), want[i] == nil)
			}
		}
		got, err = e.GetMany(c2, ids)
		if err != nil || len(got) != len(ids) || slices.ContainsFunc(got, func(b []byte) bool { return b != nil }) {
			t.Fatalf("GetMany on unknown collection = %v, %v", got, err)
		}
	})

	t.Run("Supersede", func(t *testing.T) {
		e := open(t)
		id := idN(4, 0)
		e.Put(c1, id, []byte("v1"))
		e.Put(c1, id, []byte("v2"))
		mustGet(t, e, c1, id, []byte("v2"))
		e.PutMany(c1, []Record{{ID: id, Data: []byte("v3")}, {ID: idN(4, 1), Data: []byte("a")}, {ID: id, Data: []byte("v4")}})
		mustGet(t, e, c1, id, []byte("v4"))
		ids, _ := e.CollectionRecords(c1)
		if len(ids) != 2 {
			t.Fatalf("CollectionRecords = %d ids, want 2", len(ids))
		}
		// Same record ID in another collection is independent.
		e.Put(c2, id, []byte("other"))
		mustGet(t, e, c1, id, []byte("v4"))
		mustGet(t, e, c2, id, []byte("other"))
	})

	t.Run("DeleteCollection", func(t *testing.T) {
		e := open(t)
		e.Put(c1, idN(5, 0), []byte("a"))
		e.Put(c2, idN(5, 0), []byte("b"))
		if got := e.Collections(); !slices.Equal(got, sortedIDs(c1, c2)) {
			t.Fatalf("Collections = %v", got)
		}
		if err := e.DeleteCollection(c1); err != nil {
			t.Fatal(err)
		}
		if err := e.DeleteCollection(idN(9, 9)); err != nil {
			t.Fatalf("deleting an unknown collection: %v", err)
		}
		mustNotFound(t, e, c1, idN(5, 0))
		mustGet(t, e, c2, idN(5, 0), []byte("b"))
		if got := e.Collections(); !slices.Equal(got, []ID{c2}) {
			t.Fatalf("Collections after delete = %v", got)
		}
		e.Put(c1, idN(5, 1), []byte("new"))
		mustNotFound(t, e, c1, idN(5, 0))
		mustGet(t, e, c1, idN(5, 1), []byte("new"))
	})

	t.Run("Repack", func(t *testing.T) {
		e := open(t)
		for i := range 50 {
			e.Put(c1, idN(6, i), []byte{byte(i)})
			e.Put(c2, idN(6, i), []byte{byte(i), 2})
		}
		e.Put(c1, idN(6, 3), []byte("v2"))
		keep := []ID{idN(6, 10), idN(6, 3), idN(6, 7)}
		st, err := e.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: c1, Records: keep}}})
		if err != nil {
			t.Fatal(err)
		}
		if st.CollectionsRepacked != 1 || st.RecordsCopied != 3 || st.RecordsDropped != 47 {
			t.Fatalf("stats %+v", st)
		}
		mustGet(t, e, c1, idN(6, 3), []byte("v2"))
		mustGet(t, e, c1, idN(6, 10), []byte{10})
		mustNotFound(t, e, c1, idN(6, 11))
		mustGet(t, e, c2, idN(6, 11), []byte{11, 2})
		ids, _ := e.CollectionRecords(c1)
		if len(ids) != 3 {
			t.Fatalf("after repack %d records, want 3", len(ids))
		}
		// A listed record that does not exist fails before anything changes.
		_, err = e.Repack(RepackPlan{Collections: []CollectionPlan{
			{Collection: c2, Records: []ID{idN(6, 1)}},
			{Collection: c1, Records: []ID{idN(6, 3), idN(6, 11)}},
		}})
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("repack with missing record: %v, want ErrNotFound", err)
		}
		if ids, _ := e.CollectionRecords(c2); len(ids) != 50 {
			t.Fatalf("failed repack changed c2: %d records", len(ids))
		}
		if _, err := e.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: c1, Records: []ID{idN(6, 3), idN(6, 3)}}}}); err == nil {
			t.Fatal("repack listing a record twice succeeded")
		}
		// An empty list empties the collection.
		if _, err := e.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: c1}}}); err != nil {
			t.Fatal(err)
		}
		mustNotFound(t, e, c1, idN(6, 3))
		if got := e.Collections(); !slices.Equal(got, []ID{c2}) {
			t.Fatalf("Collections after emptying repack = %v", got)
		}
	})

	t.Run("Closed", func(t *testing.T) {
		e := open(t)
		e.Put(c1, idN(7, 0), []byte("x"))
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Get(c1, idN(7, 0)); !errors.Is(err, ErrClosed) {
			t.Fatalf("Get after Close: %v", err)
		}
		if err := e.Put(c1, idN(7, 1), nil); !errors.Is(err, ErrClosed) {
			t.Fatalf("Put after Close: %v", err)
		}
		if err := e.Sync(); !errors.Is(err, ErrClosed) {
			t.Fatalf("Sync after Close: %v", err)
		}
	})
}

func sortedIDs(ids ...ID) []ID {
	slices.SortFunc(ids, ID.Compare)
	return ids
}
