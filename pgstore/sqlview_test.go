package pgstore_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for SQLView's tests

	"github.com/mtxdb/mtxdb/internal/storage"
	"github.com/mtxdb/mtxdb/pgstore"
	"github.com/mtxdb/mtxdb/pgstore/pgtest"
)

func sqlDB(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestSQLViewModel: random transactions of SQLView writes (PutMany with
// repeated IDs and batches above one statement's limit, DeleteCollection) over
// database/sql, each committed or rolled back at random; after each, the pgx
// Store and a view outside the transaction must read exactly the model of the
// committed writes, and inside a transaction the view reads its own writes.
func TestSQLViewModel(t *testing.T) {
	u := pgtest.NewDatabase(t)
	db := sqlDB(t, u)
	ctx := context.Background()
	if err := pgstore.PrepareSQL(ctx, db, true); !errors.Is(err, pgstore.ErrNoSchema) {
		t.Fatalf("PrepareSQL(noCreate) of an empty database: %v, want ErrNoSchema", err)
	}
	if err := pgstore.PrepareSQL(ctx, db, false); err != nil {
		t.Fatal(err)
	}
	s := open(t, u, true) // the schema PrepareSQL made is the one Open reads
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	colls := []storage.ID{{1}, {2}, {3}}
	id := func() storage.ID { return storage.ID{9, byte(rng.IntN(2500) >> 8), byte(rng.IntN(256))} }
	model := map[storage.ID]map[storage.ID][]byte{}
	for _, c := range colls {
		model[c] = map[storage.ID][]byte{}
	}
	if empty, err := pgstore.OverSQL(ctx, db).Empty(); err != nil || !empty {
		t.Fatalf("Empty() of a fresh store = %v, %v", empty, err)
	}
	for round := range 40 {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		v := pgstore.OverSQL(ctx, tx)
		pending := map[storage.ID]map[storage.ID][]byte{}
		for _, c := range colls {
			pending[c] = map[storage.ID][]byte{}
			for k, d := range model[c] {
				pending[c][k] = d
			}
		}
		for range 1 + rng.IntN(3) {
			c := colls[rng.IntN(len(colls))]
			if rng.IntN(8) == 0 {
				if err := v.DeleteCollection(c); err != nil {
					t.Fatal(err)
				}
				pending[c] = map[storage.ID][]byte{}
				continue
			}
			n := 1 + rng.IntN(50)
			if rng.IntN(6) == 0 {
				n = 1000 + rng.IntN(1500) // more than one statement
			}
			recs := make([]storage.Record, n)
			for i := range recs {
				recs[i] = storage.Record{ID: id(), Data: fmt.Appendf(nil, "r%d-%d", round, rng.IntN(1<<20))}
				if rng.IntN(10) == 0 {
					recs[i].Data = nil
				}
				pending[c][recs[i].ID] = bytes.Clone(recs[i].Data)
			}
			if err := v.PutMany(c, recs); err != nil {
				t.Fatal(err)
			}
		}
		check(t, fmt.Sprintf("round %d, inside the transaction", round), v, pending)
		if rng.IntN(3) == 0 {
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
		} else {
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			model = pending
		}
		check(t, fmt.Sprintf("round %d, the pgx store", round), s, model)
		check(t, fmt.Sprintf("round %d, a view outside transactions", round), pgstore.OverSQL(ctx, db), model)
	}
	// A view over the *sql.DB writes in a transaction of its own.
	v := pgstore.OverSQL(ctx, db)
	if err := v.Put(colls[0], storage.ID{7}, []byte("own")); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(colls[0], storage.ID{7}); err != nil || string(got) != "own" {
		t.Fatalf("after a view Put outside transactions: %q, %v", got, err)
	}
	if _, err := v.Get(colls[0], storage.ID{8}); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Get of an absent record: %v, want ErrNotFound", err)
	}
}

type reader interface {
	GetMany(storage.ID, []storage.ID) ([][]byte, error)
}

// check reads every model record (and two absent IDs, one asked twice) with
// one GetMany per collection and compares; CollectionRecords of the pgx Store
// must list exactly the model's IDs.
func check(t *testing.T, what string, r reader, model map[storage.ID]map[storage.ID][]byte) {
	t.Helper()
	for c, recs := range model {
		ids := []storage.ID{{8, 1}, {8, 1}}
		for k := range recs {
			ids = append(ids, k, k)
		}
		got, err := r.GetMany(c, ids)
		if err != nil {
			t.Fatalf("%s: GetMany(%s): %v", what, c, err)
		}
		for i, k := range ids {
			want, ok := recs[k]
			switch {
			case !ok && got[i] != nil:
				t.Fatalf("%s: %s/%s = %q, want absent", what, c, k, got[i])
			case ok && (got[i] == nil || !bytes.Equal(got[i], want)):
				t.Fatalf("%s: %s/%s = %q, want %q", what, c, k, got[i], want)
			}
		}
		if s, ok := r.(*pgstore.Store); ok {
			all, err := s.CollectionRecords(c)
			if err != nil || len(all) != len(recs) {
				t.Fatalf("%s: CollectionRecords(%s) = %d IDs, %v; want %d", what, c, len(all), err, len(recs))
			}
		}
	}
}

// TestSQLViewSchema: PrepareSQL refuses a newer schema as Open does.
func TestSQLViewSchema(t *testing.T) {
	u := pgtest.NewDatabase(t)
	s := open(t, u, false)
	if err := pgstore.SetVersion(s, pgstore.SchemaVersion+1); err != nil {
		t.Fatal(err)
	}
	if err := pgstore.PrepareSQL(context.Background(), sqlDB(t, u), false); !errors.Is(err, pgstore.ErrSchemaVersion) {
		t.Fatalf("PrepareSQL of a newer schema: %v, want ErrSchemaVersion", err)
	}
}

// TestSQLViewPutIfAndExcept: PutIf writes only over the expected bytes (or an
// absent record) and otherwise reports ErrConflict and changes nothing;
// DeleteCollectionExcept keeps exactly the named records of that collection.
func TestSQLViewPutIfAndExcept(t *testing.T) {
	u := pgtest.NewDatabase(t)
	db := sqlDB(t, u)
	ctx := context.Background()
	if err := pgstore.PrepareSQL(ctx, db, false); err != nil {
		t.Fatal(err)
	}
	v := pgstore.OverSQL(ctx, db)
	c, other, a, b := storage.ID{1}, storage.ID{2}, storage.ID{3}, storage.ID{4}
	steps := []struct {
		data, old string
		absent    bool
		conflict  bool
		want      string
	}{
		{data: "1", absent: true, want: "1"},
		{data: "2", absent: true, conflict: true, want: "1"},
		{data: "3", old: "2", conflict: true, want: "1"},
		{data: "4", old: "1", want: "4"},
	}
	for i, st := range steps {
		old := []byte(st.old)
		if st.absent {
			old = nil
		}
		err := v.PutIf(c, a, []byte(st.data), old)
		if st.conflict != errors.Is(err, storage.ErrConflict) || !st.conflict && err != nil {
			t.Fatalf("step %d: PutIf = %v, conflict expected %v", i, err, st.conflict)
		}
		if got, err := v.Get(c, a); err != nil || string(got) != st.want {
			t.Fatalf("step %d: record %q, %v; want %q", i, got, err, st.want)
		}
	}
	for _, coll := range []storage.ID{c, other} {
		if err := v.PutMany(coll, []storage.Record{{ID: b, Data: []byte("b")}, {ID: storage.ID{5}, Data: []byte("5")}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := v.DeleteCollectionExcept(c, a, storage.ID{5}); err != nil {
		t.Fatal(err)
	}
	got, err := v.GetMany(c, []storage.ID{a, b, {5}})
	if err != nil || string(got[0]) != "4" || got[1] != nil || string(got[2]) != "5" {
		t.Fatalf("after DeleteCollectionExcept: %q, %v", got, err)
	}
	if got, err := v.GetMany(other, []storage.ID{b, {5}}); err != nil || got[0] == nil || got[1] == nil {
		t.Fatalf("DeleteCollectionExcept touched another collection: %q, %v", got, err)
	}
}

// TestSchemaRace: stores opening a fresh database at once, through pgx (Open)
// and database/sql (PrepareSQL), all succeed: the catalog collisions of
// concurrent CREATE TABLE IF NOT EXISTS are retried (TestCLIPostgresSameRoom
// once failed on "type mtxdb_records already exists", SQLSTATE 42710).
func TestSchemaRace(t *testing.T) {
	for range 4 {
		u := pgtest.NewDatabase(t)
		db := sqlDB(t, u)
		errs := make(chan error, 8)
		for i := range 8 {
			go func() {
				if i%2 == 0 {
					errs <- pgstore.PrepareSQL(context.Background(), db, false)
					return
				}
				s, err := pgstore.Open(pgstore.Options{URL: u})
				if err == nil {
					s.Close()
				}
				errs <- err
			}()
		}
		for range 8 {
			if err := <-errs; err != nil {
				t.Fatalf("concurrent schema creation: %v", err)
			}
		}
	}
}
