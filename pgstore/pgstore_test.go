package pgstore_test

import (
	"errors"
	"testing"

	"github.com/mtxdb/mtxdb/internal/storage"
	"github.com/mtxdb/mtxdb/internal/storage/enginetest"
	"github.com/mtxdb/mtxdb/pgstore"
	"github.com/mtxdb/mtxdb/pgstore/pgtest"
)

func open(t *testing.T, url string, noCreate bool) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(pgstore.Options{URL: url, NoCreate: noCreate})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestConformance runs the engine conformance suite (enginetest) on
// PostgreSQL, a fresh database per subtest.
func TestConformance(t *testing.T) {
	urls := map[enginetest.Engine]string{}
	enginetest.Run(t, func(t *testing.T) enginetest.Engine {
		u := pgtest.NewDatabase(t)
		s := open(t, u, false)
		urls[s] = u
		return s
	}, func(t *testing.T, e enginetest.Engine) enginetest.Engine {
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		s := open(t, urls[e], true)
		urls[s] = urls[e]
		return s
	})
}

// TestSchema: a read-only open of an empty database creates nothing and says
// why it fails; a writing open creates version 1 and a second one (another
// process) finds it; a newer recorded version is refused.
func TestSchema(t *testing.T) {
	u := pgtest.NewDatabase(t)
	if _, err := pgstore.Open(pgstore.Options{URL: u, NoCreate: true}); !errors.Is(err, pgstore.ErrNoSchema) {
		t.Fatalf("NoCreate open of an empty database: %v, want ErrNoSchema", err)
	}
	if _, err := pgstore.Open(pgstore.Options{URL: u, NoCreate: true}); !errors.Is(err, pgstore.ErrNoSchema) {
		t.Fatalf("the NoCreate open created the schema: second open %v", err)
	}
	a := open(t, u, false)
	b := open(t, u, false)
	c1, id := storage.ID{1}, storage.ID{2}
	if err := a.Put(c1, id, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Get(c1, id); err != nil || string(got) != "x" {
		t.Fatalf("second store reads %q, %v", got, err)
	}
	ro := open(t, u, true)
	if got, err := ro.Get(c1, id); err != nil || string(got) != "x" {
		t.Fatalf("NoCreate store reads %q, %v", got, err)
	}
	ro2, err := pgstore.Open(pgstore.Options{URL: u, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro2.Close()
	if err := ro2.Put(c1, id, []byte("y")); !errors.Is(err, storage.ErrReadOnly) {
		t.Fatalf("Put on a ReadOnly store: %v, want ErrReadOnly", err)
	}
	if err := ro2.DeleteCollection(c1); !errors.Is(err, storage.ErrReadOnly) {
		t.Fatalf("DeleteCollection on a ReadOnly store: %v, want ErrReadOnly", err)
	}
	if _, err := ro2.Repack(storage.RepackPlan{Collections: []storage.CollectionPlan{{Collection: c1}}}); !errors.Is(err, storage.ErrReadOnly) {
		t.Fatalf("Repack on a ReadOnly store: %v, want ErrReadOnly", err)
	}
	if got, err := ro2.Get(c1, id); err != nil || string(got) != "x" {
		t.Fatalf("after refused writes: %q, %v", got, err)
	}
	st, err := ro.Stats()
	if err != nil || st.Collections != 1 || st.LiveRecords != 1 || st.LiveBytes != 1 || st.TableBytes <= 0 {
		t.Fatalf("Stats = %+v, %v", st, err)
	}
	if err := pgstore.SetVersion(a, pgstore.SchemaVersion+1); err != nil {
		t.Fatal(err)
	}
	if _, err := pgstore.Open(pgstore.Options{URL: u}); !errors.Is(err, pgstore.ErrSchemaVersion) {
		t.Fatalf("open of a newer schema: %v, want ErrSchemaVersion", err)
	}
}

// TestBadURL: a malformed URL and an unreachable server fail Open with an
// error, not a hang or a panic.
func TestBadURL(t *testing.T) {
	if _, err := pgstore.Open(pgstore.Options{URL: "postgres://%zz"}); err == nil {
		t.Fatal("malformed URL accepted")
	}
	if _, err := pgstore.Open(pgstore.Options{URL: "postgres://u:p@127.0.0.1:1/db?sslmode=disable&connect_timeout=5"}); err == nil {
		t.Fatal("unreachable server accepted")
	}
}

// TestPutCollections: several collections in one transaction, last occurrence
// of an ID winning within each.
func TestPutCollections(t *testing.T) {
	s := open(t, pgtest.NewDatabase(t), false)
	a, b, id, id2 := storage.ID{1}, storage.ID{2}, storage.ID{3}, storage.ID{4}
	err := s.PutCollections([]pgstore.CollectionBatch{
		{Collection: a, Records: []storage.Record{{ID: id, Data: []byte("a1")}, {ID: id2, Data: nil}, {ID: id, Data: []byte("a2")}}},
		{Collection: b, Records: []storage.Record{{ID: id, Data: []byte("b1")}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		coll, id storage.ID
		want     string
	}{{a, id, "a2"}, {a, id2, ""}, {b, id, "b1"}} {
		if got, err := s.Get(c.coll, c.id); err != nil || string(got) != c.want {
			t.Fatalf("Get(%s, %s) = %q, %v; want %q", c.coll, c.id, got, err, c.want)
		}
	}
}
