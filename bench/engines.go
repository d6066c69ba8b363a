package main

import (
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2"
	badger "github.com/dgraph-io/badger/v4"
	"github.com/erigontech/mdbx-go/mdbx"
	_ "github.com/mattn/go-sqlite3"
	"github.com/mtxdb/mtxdb/packstore"
	bolt "go.etcd.io/bbolt"
)

// Engine is the harness's view of a store. Write must be durable (fsynced)
// when it returns: that is the one durability point of the workload. Each
// engine maps a collection the natural way (its own collection, bucket,
// table or DBI; a key prefix for single-keyspace LSMs).
type Engine interface {
	Open(dir string, colls int) error
	Write(batch []rec) error
	Get(coll int, id [16]byte) ([]byte, error)
	// GetMany reads ids (sorted by ID) of one collection and returns them.
	GetMany(coll int, ids [][16]byte) ([][]byte, error)
	Close() error
}

// engineNames is the run order of a forward pass.
var engineNames = []string{
	"packstore-none", "packstore-writeonly", "packstore-full", "packstore-full-putmany", "packstore-full-raw",
	"bbolt", "pebble", "badger", "sqlite", "mdbx", "postgres",
}

// engineSettings says, per engine, what the harness changed from its
// defaults; it is written into the JSON and the Markdown.
var engineSettings = map[string]string{
	"packstore-none":         "DefaultOptions (zstd on, 64 MiB node cache), Checksum=none; one PutBatch (every collection's records) then Sync per batch",
	"packstore-writeonly":    "DefaultOptions, Checksum=writeonly; one PutBatch then Sync per batch",
	"packstore-full":         "DefaultOptions, Checksum=full (the default; batches under 64 records, the steady appends, are written uncompressed until a repack: Options.InlineCompressMin); one PutBatch then Sync per batch",
	"packstore-full-putmany": "as packstore-full, but one PutMany per collection then Sync per batch (each collection's part compressed on its own)",
	"packstore-full-raw":     "DefaultOptions, Checksum=full, Compress=false (no zstd: separates the format from the compression CPU; bbolt, SQLite and mdbx do not compress either); one PutBatch then Sync per batch",
	"bbolt":                  "v1.5.0 defaults (fsync per Update); one bucket per collection",
	"pebble":                 "v2.1.7 defaults (Snappy blocks, 8 MiB block cache); key = 16 B collection prefix + ID; Batch.Commit(pebble.Sync)",
	"badger":                 "v4.9.6 defaults (Snappy, 256 MiB block cache, values in LSM below 1 MiB) + SyncWrites=true; key = prefix + ID; one Txn per batch",
	"sqlite":                 "mattn/go-sqlite3 v1.14.53, journal_mode=WAL, synchronous=FULL (fsync of the WAL per commit); one table (k BLOB PRIMARY KEY, v BLOB) per collection; one transaction per batch",
	"mdbx":                   "mdbx-go v0.39.0 (libmdbx), default SYNC_DURABLE (fsync per commit), geometry upper 64 GiB grow 32 MiB; one DBI per collection",
	"postgres":               "pgstore over PostgreSQL 15 (Debian, scripts/pgserver.sh: defaults, fsync and synchronous_commit on, loopback TCP); one transaction per batch (PutCollections); cold reads restart the server and evict its files; disk = pg_total_relation_size of the records table (WAL not counted); storage read bytes are the server's, not counted",
}

func newEngine(name string) (Engine, error) {
	switch name {
	case "packstore-none":
		return &packEngine{mode: packstore.ChecksumNone}, nil
	case "packstore-writeonly":
		return &packEngine{mode: packstore.ChecksumWriteOnly}, nil
	case "packstore-full":
		return &packEngine{mode: packstore.ChecksumFull}, nil
	case "packstore-full-putmany":
		return &packEngine{mode: packstore.ChecksumFull, perCollection: true}, nil
	case "packstore-full-raw":
		return &packEngine{mode: packstore.ChecksumFull, raw: true}, nil
	case "bbolt":
		return &boltEngine{}, nil
	case "pebble":
		return &pebbleEngine{}, nil
	case "badger":
		return &badgerEngine{}, nil
	case "sqlite":
		return &sqliteEngine{}, nil
	case "mdbx":
		return &mdbxEngine{}, nil
	case "postgres":
		return &pgEngine{}, nil
	}
	return nil, fmt.Errorf("unknown engine %q", name)
}

// ---- packstore

type packEngine struct {
	mode packstore.ChecksumMode
	raw  bool // Compress off
	// perCollection writes a batch as one PutMany per collection instead of
	// one PutBatch.
	perCollection bool
	s             *packstore.PackfileStorage
}

func (e *packEngine) Open(dir string, colls int) error {
	o := packstore.DefaultOptions(dir)
	o.Checksum = e.mode
	o.Compress = !e.raw
	s, err := packstore.Open(o)
	e.s = s
	return err
}

func (e *packEngine) Write(batch []rec) error {
	// Group by collection, keeping each collection's order.
	groups := map[int][]packstore.Record{}
	var order []int
	for _, r := range batch {
		if _, ok := groups[r.Coll]; !ok {
			order = append(order, r.Coll)
		}
		groups[r.Coll] = append(groups[r.Coll], packstore.Record{ID: r.ID, Data: r.Data})
	}
	parts := make([]packstore.CollectionRecords, len(order))
	for i, c := range order {
		parts[i] = packstore.CollectionRecords{Coll: packstore.ID(collID(c)), Recs: groups[c]}
	}
	if e.perCollection {
		for _, p := range parts {
			if err := e.s.PutMany(p.Coll, p.Recs); err != nil {
				return err
			}
		}
	} else if err := e.s.PutBatch(parts); err != nil {
		return err
	}
	return e.s.Sync()
}

func (e *packEngine) Get(coll int, id [16]byte) ([]byte, error) {
	return e.s.Get(packstore.ID(collID(coll)), packstore.ID(id))
}

func (e *packEngine) GetMany(coll int, ids [][16]byte) ([][]byte, error) {
	return storeGetMany(e.s, coll, ids)
}

// storeGetMany is GetMany of a packstore.StorageEngine (packstore, pgstore).
func storeGetMany(s packstore.StorageEngine, coll int, ids [][16]byte) ([][]byte, error) {
	pids := make([]packstore.ID, len(ids))
	for i, id := range ids {
		pids[i] = packstore.ID(id)
	}
	return s.GetMany(packstore.ID(collID(coll)), pids)
}

func (e *packEngine) Close() error { return e.s.Close() }

// Report says how the last Open rebuilt its index (checkpoint, delta, scan).
func (e *packEngine) Report() string {
	r := e.s.OpenReport()
	return fmt.Sprintf("open: %s, delta entries %d, scanned %d frames / %d bytes", r.Source, r.DeltaEntries, r.ScannedFrames, r.ScannedBytes)
}

// ---- bbolt

type boltEngine struct {
	db    *bolt.DB
	names [][]byte
}

func bucketName(c int) []byte { return []byte(fmt.Sprintf("c%02d", c)) }

func (e *boltEngine) Open(dir string, colls int) error {
	db, err := bolt.Open(filepath.Join(dir, "bolt.db"), 0o600, nil)
	if err != nil {
		return err
	}
	e.db = db
	e.names = nil
	for c := 0; c < colls; c++ {
		e.names = append(e.names, bucketName(c))
	}
	return db.Update(func(tx *bolt.Tx) error {
		for _, n := range e.names {
			if _, err := tx.CreateBucketIfNotExists(n); err != nil {
				return err
			}
		}
		return nil
	})
}

func (e *boltEngine) Write(batch []rec) error {
	return e.db.Update(func(tx *bolt.Tx) error {
		for i := range batch {
			if err := tx.Bucket(e.names[batch[i].Coll]).Put(batch[i].ID[:], batch[i].Data); err != nil {
				return err
			}
		}
		return nil
	})
}

func (e *boltEngine) Get(coll int, id [16]byte) (v []byte, err error) {
	err = e.db.View(func(tx *bolt.Tx) error {
		v = bytes.Clone(tx.Bucket(e.names[coll]).Get(id[:]))
		return nil
	})
	if v == nil && err == nil {
		err = errNotFound
	}
	return
}

func (e *boltEngine) GetMany(coll int, ids [][16]byte) (out [][]byte, err error) {
	out = make([][]byte, len(ids))
	err = e.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(e.names[coll])
		for i, id := range ids {
			out[i] = bytes.Clone(b.Get(id[:]))
		}
		return nil
	})
	return
}

func (e *boltEngine) Close() error { return e.db.Close() }

var errNotFound = errors.New("not found")

// ---- pebble v2

type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(f string, a ...any) {
	panic(fmt.Sprintf(f, a...))
}

type pebbleEngine struct{ db *pebble.DB }

func (e *pebbleEngine) Open(dir string, colls int) error {
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietLogger{}})
	e.db = db
	return err
}

func (e *pebbleEngine) Write(batch []rec) error {
	b := e.db.NewBatch()
	defer b.Close()
	for i := range batch {
		if err := b.Set(prefixedKey(batch[i].Coll, batch[i].ID), batch[i].Data, nil); err != nil {
			return err
		}
	}
	return b.Commit(pebble.Sync)
}

func (e *pebbleEngine) Get(coll int, id [16]byte) ([]byte, error) {
	v, c, err := e.db.Get(prefixedKey(coll, id))
	if err != nil {
		return nil, err
	}
	out := bytes.Clone(v)
	return out, c.Close()
}

func (e *pebbleEngine) GetMany(coll int, ids [][16]byte) ([][]byte, error) {
	out := make([][]byte, len(ids))
	for i, id := range ids {
		v, err := e.Get(coll, id)
		if err != nil && !errors.Is(err, pebble.ErrNotFound) {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func (e *pebbleEngine) Close() error { return e.db.Close() }

// ---- badger v4

type badgerEngine struct{ db *badger.DB }

func (e *badgerEngine) Open(dir string, colls int) error {
	db, err := badger.Open(badger.DefaultOptions(dir).WithSyncWrites(true).WithLogger(nil))
	e.db = db
	return err
}

func (e *badgerEngine) Write(batch []rec) error {
	txn := e.db.NewTransaction(true)
	defer txn.Discard()
	for i := range batch {
		if err := txn.Set(prefixedKey(batch[i].Coll, batch[i].ID), batch[i].Data); err != nil {
			return err
		}
	}
	return txn.Commit()
}

func (e *badgerEngine) Get(coll int, id [16]byte) (v []byte, err error) {
	err = e.db.View(func(txn *badger.Txn) error {
		it, err := txn.Get(prefixedKey(coll, id))
		if err != nil {
			return err
		}
		v, err = it.ValueCopy(nil)
		return err
	})
	return
}

func (e *badgerEngine) GetMany(coll int, ids [][16]byte) (out [][]byte, err error) {
	out = make([][]byte, len(ids))
	err = e.db.View(func(txn *badger.Txn) error {
		for i, id := range ids {
			it, err := txn.Get(prefixedKey(coll, id))
			if errors.Is(err, badger.ErrKeyNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if out[i], err = it.ValueCopy(nil); err != nil {
				return err
			}
		}
		return nil
	})
	return
}

func (e *badgerEngine) Close() error { return e.db.Close() }

// ---- SQLite (mattn/go-sqlite3)

type sqliteEngine struct {
	db  *sql.DB
	ins []*sql.Stmt
	sel []*sql.Stmt
}

func (e *sqliteEngine) Open(dir string, colls int) error {
	dsn := "file:" + filepath.Join(dir, "bench.sqlite") + "?_journal_mode=WAL&_synchronous=FULL&_txlock=immediate"
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return err
	}
	db.SetMaxOpenConns(1)
	e.db = db
	e.ins, e.sel = nil, nil
	for c := 0; c < colls; c++ {
		t := fmt.Sprintf("c%02d", c)
		if _, err := db.Exec("CREATE TABLE IF NOT EXISTS " + t + " (k BLOB PRIMARY KEY, v BLOB NOT NULL)"); err != nil {
			return err
		}
		ins, err := db.Prepare("INSERT OR REPLACE INTO " + t + " (k, v) VALUES (?, ?)")
		if err != nil {
			return err
		}
		sel, err := db.Prepare("SELECT v FROM " + t + " WHERE k = ?")
		if err != nil {
			return err
		}
		e.ins, e.sel = append(e.ins, ins), append(e.sel, sel)
	}
	var mode string
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		return fmt.Errorf("sqlite journal_mode %q (%v), want wal", mode, err)
	}
	var sync int
	if err := db.QueryRow("PRAGMA synchronous").Scan(&sync); err != nil || sync != 2 {
		return fmt.Errorf("sqlite synchronous %d (%v), want 2 (FULL)", sync, err)
	}
	return nil
}

func (e *sqliteEngine) Write(batch []rec) error {
	tx, err := e.db.Begin()
	if err != nil {
		return err
	}
	stmts := map[int]*sql.Stmt{}
	for i := range batch {
		st, ok := stmts[batch[i].Coll]
		if !ok {
			st = tx.Stmt(e.ins[batch[i].Coll])
			stmts[batch[i].Coll] = st
		}
		if _, err := st.Exec(batch[i].ID[:], batch[i].Data); err != nil {
			tx.Rollback()
			return err
		}
	}
	return tx.Commit()
}

func (e *sqliteEngine) Get(coll int, id [16]byte) (v []byte, err error) {
	err = e.sel[coll].QueryRow(id[:]).Scan(&v)
	return
}

func (e *sqliteEngine) GetMany(coll int, ids [][16]byte) ([][]byte, error) {
	tx, err := e.db.Begin()
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	st := tx.Stmt(e.sel[coll])
	out := make([][]byte, len(ids))
	for i, id := range ids {
		if err := st.QueryRow(id[:]).Scan(&out[i]); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return nil, err
		}
	}
	return out, nil
}

func (e *sqliteEngine) Close() error {
	for _, s := range append(e.ins, e.sel...) {
		s.Close()
	}
	return e.db.Close()
}

// ---- libmdbx (erigontech/mdbx-go)

type mdbxEngine struct {
	env  *mdbx.Env
	dbis []mdbx.DBI
}

func (e *mdbxEngine) Open(dir string, colls int) error {
	env, err := mdbx.NewEnv(mdbx.Default)
	if err != nil {
		return err
	}
	e.env = env
	if err := env.SetOption(mdbx.OptMaxDB, 64); err != nil {
		return err
	}
	if err := env.SetGeometry(-1, -1, 64<<30, 32<<20, -1, -1); err != nil {
		return err
	}
	if err := env.Open(dir, 0, 0o644); err != nil {
		return err
	}
	e.dbis = nil
	return env.Update(func(txn *mdbx.Txn) error {
		for c := 0; c < colls; c++ {
			dbi, err := txn.OpenDBISimple(fmt.Sprintf("c%02d", c), mdbx.Create)
			if err != nil {
				return err
			}
			e.dbis = append(e.dbis, dbi)
		}
		return nil
	})
}

func (e *mdbxEngine) Write(batch []rec) error {
	return e.env.Update(func(txn *mdbx.Txn) error {
		for i := range batch {
			if err := txn.Put(e.dbis[batch[i].Coll], batch[i].ID[:], batch[i].Data, 0); err != nil {
				return err
			}
		}
		return nil
	})
}

func (e *mdbxEngine) Get(coll int, id [16]byte) (v []byte, err error) {
	err = e.env.View(func(txn *mdbx.Txn) error {
		b, err := txn.Get(e.dbis[coll], id[:])
		v = bytes.Clone(b) // b points into the map: copy inside the txn
		return err
	})
	return
}

func (e *mdbxEngine) GetMany(coll int, ids [][16]byte) (out [][]byte, err error) {
	out = make([][]byte, len(ids))
	err = e.env.View(func(txn *mdbx.Txn) error {
		for i, id := range ids {
			b, err := txn.Get(e.dbis[coll], id[:])
			if mdbx.IsNotFound(err) {
				continue
			}
			if err != nil {
				return err
			}
			out[i] = bytes.Clone(b)
		}
		return nil
	})
	return
}

func (e *mdbxEngine) Close() error { e.env.Close(); return nil }
