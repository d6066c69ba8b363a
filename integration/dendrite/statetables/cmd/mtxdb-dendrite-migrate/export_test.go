package main

import (
	"context"
	"database/sql"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestExportStock: a real stock Dendrite database (the golden fixture of
// server A after the partition scenarios, testrooms/dendrite) is migrated into
// a store, its SQL state rows are deleted (so that, as in a patched Dendrite's
// database, only the store holds its states), and -export-stock writes a copy
// whose SQL state tables give every snapshot its events and rooms name the
// state the original gave, merged as Dendrite merges blocks (buildStates). An
// existing output and a
// PostgreSQL source are refused.
func TestExportStock(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	orig := filepath.Join(dir, "stock.db")
	copyFile(t, "../../../../../testrooms/dendrite/partition-stock-A.db", orig)
	store := filepath.Join(dir, "store")
	if _, err := migrate(ctx, orig, store); err != nil {
		t.Fatal(err)
	}
	patched := filepath.Join(dir, "patched.db")
	copyFile(t, orig, patched)
	db, err := sql.Open("sqlite3", "file:"+patched)
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"roomserver_state_snapshots", "roomserver_state_block"} {
		if _, err := db.Exec("DELETE FROM " + table); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	out := filepath.Join(dir, "out.db")
	sum, err := exportStock(ctx, patched, store, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(sum)
	want, _ := mergedStates(t, orig)
	got, gotN := mergedStates(t, out)
	db, err = sql.Open("sqlite3", "file:"+orig+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	named, err := snapshotRefs(ctx, db)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(named) || gotN == 0 {
		t.Fatalf("%s: %d snapshots (%d entries); the original's events and rooms name %d", out, len(got), gotN, len(named))
	}
	for nid := range named {
		if got[int64(nid)] != want[int64(nid)] {
			t.Fatalf("snapshot %d: exported state %s, original %s", nid, got[int64(nid)], want[int64(nid)])
		}
	}
	if _, err := exportStock(ctx, patched, store, out); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("export onto an existing file: %v", err)
	}
	if _, err := exportStock(ctx, "postgres://nobody@127.0.0.1:1/x", store, filepath.Join(dir, "pg.db")); err == nil {
		t.Error("export from PostgreSQL: no error")
	}
}

// mergedStates returns each snapshot's state in the SQLite database at path,
// as Dendrite merges its blocks, printed, and the number of entries.
func mergedStates(t *testing.T, path string) (map[int64]string, int) {
	ctx := context.Background()
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	keys, err := readStateKeys(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := readBlocks(ctx, db, true)
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := readSnapshots(ctx, db, true)
	if err != nil {
		t.Fatal(err)
	}
	states, err := buildStates(snaps, blocks, keys)
	if err != nil {
		t.Fatal(err)
	}
	out, n := map[int64]string{}, 0
	for i, sn := range snaps {
		var b strings.Builder
		for _, e := range states[i] {
			b.WriteString(strings.Join([]string{itoa(int64(e.EventTypeNID)), itoa(int64(e.EventStateKeyNID)), itoa(int64(e.EventNID))}, ":") + " ")
		}
		out[int64(sn.nid)] = b.String()
		n += len(states[i])
	}
	return out, n
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func copyFile(t *testing.T, from, to string) {
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	f, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, in); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
