package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/pgstore"
)

// ---- PostgreSQL (pgstore)
//
// The server is the one `make bench` starts with scripts/pgserver.sh (fsync and
// synchronous_commit on: a commit is durable when it returns). Its directory is
// MTXDB_BENCH_PGDIR and the script MTXDB_BENCH_PGSERVER. Each cell gets its own
// database, named after the cell's data directory. Cold reads restart the
// server (its shared buffers are the engine's cache) and drop the cluster's
// files from the page cache; storage read bytes are the server's, not the
// harness's (/proc/self/io), so the cold_*_storage_read_bytes columns are 0.

type pgEngine struct {
	dir, url string // cell directory; database URL
	s        *pgstore.Store
}

func pgEnv() (pgdir, script string, err error) {
	pgdir, script = os.Getenv("MTXDB_BENCH_PGDIR"), os.Getenv("MTXDB_BENCH_PGSERVER")
	if pgdir == "" || script == "" {
		return "", "", fmt.Errorf("postgres engine: MTXDB_BENCH_PGDIR and MTXDB_BENCH_PGSERVER must name a scripts/pgserver.sh server (make bench sets them)")
	}
	return pgdir, script, nil
}

func pgserver(script, cmd, pgdir string) (string, error) {
	out, err := exec.Command(script, cmd, pgdir).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return "", fmt.Errorf("pgserver.sh %s: %v: %s", cmd, err, ee.Stderr)
		}
		return "", fmt.Errorf("pgserver.sh %s: %w", cmd, err)
	}
	return strings.TrimSpace(string(out)), nil
}

func (e *pgEngine) Open(dir string, colls int) error {
	pgdir, script, err := pgEnv()
	if err != nil {
		return err
	}
	if e.url == "" {
		admin, err := pgserver(script, "url", pgdir)
		if err != nil {
			return err
		}
		abs, _ := filepath.Abs(dir)
		sum := sha256.Sum256([]byte(abs))
		name := "bench_" + hex.EncodeToString(sum[:6])
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
			return err
		}
		u, err := url.Parse(admin)
		if err != nil {
			return err
		}
		u.Path = "/" + name
		e.dir, e.url = dir, u.String()
	}
	s, err := pgstore.Open(pgstore.Options{URL: e.url})
	e.s = s
	return err
}

// Write is one transaction for the whole batch (pgstore.PutCollections): one
// durable commit, as the other engines' one fsync per batch.
func (e *pgEngine) Write(batch []rec) error {
	idx := map[int]int{}
	var bs []pgstore.CollectionBatch
	for _, r := range batch {
		i, ok := idx[r.Coll]
		if !ok {
			i = len(bs)
			idx[r.Coll] = i
			bs = append(bs, pgstore.CollectionBatch{Collection: packstore.ID(collID(r.Coll))})
		}
		bs[i].Records = append(bs[i].Records, packstore.Record{ID: r.ID, Data: r.Data})
	}
	return e.s.PutCollections(bs)
}

func (e *pgEngine) Get(coll int, id [16]byte) ([]byte, error) {
	return e.s.Get(packstore.ID(collID(coll)), packstore.ID(id))
}

func (e *pgEngine) GetMany(coll int, ids [][16]byte) ([][]byte, error) {
	return storeGetMany(e.s, coll, ids)
}

func (e *pgEngine) Close() error { return e.s.Close() }

// Disk is the records table's size with its indexes and TOAST
// (pg_total_relation_size), for both columns; the WAL is the cluster's and
// not counted.
func (e *pgEngine) Disk() (alloc, apparent int64, err error) {
	s, err := pgstore.Open(pgstore.Options{URL: e.url, ReadOnly: true})
	if err != nil {
		return 0, 0, err
	}
	defer s.Close()
	st, err := s.Stats()
	return st.TableBytes, st.TableBytes, err
}

// Evict restarts the server and drops the cluster's files from the page
// cache; an open store is reconnected (outside any timing) and its connection
// warmed with a query that reads no table.
func (e *pgEngine) Evict() error {
	pgdir, script, err := pgEnv()
	if err != nil {
		return err
	}
	open := e.s != nil && e.s.Ping() == nil
	if open {
		e.s.Close()
	}
	if _, err := pgserver(script, "stop", pgdir); err != nil {
		return err
	}
	if err := evictDir(filepath.Join(pgdir, "data")); err != nil {
		return err
	}
	if _, err := pgserver(script, "start", pgdir); err != nil {
		return err
	}
	if !open {
		return nil
	}
	if err := e.Open(e.dir, 0); err != nil {
		return err
	}
	return e.s.Ping()
}
