package main

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/matrix-org/dendrite/roomserver/storage/sqlite3"
	"github.com/matrix-org/dendrite/roomserver/types"
	"github.com/mtxdb/mtxdb/integration/dendrite/statetables"
)

// stockDB writes a roomserver database with Dendrite's own SQLite state tables: two
// state events of one key (NIDs 10 and 20) in two blocks, and snapshots that list
// them both ways round (Dendrite's SQL sorts the list: the higher block NID wins).
func stockDB(t *testing.T) (path string, snaps map[string]types.StateSnapshotNID) {
	ctx := context.Background()
	path = filepath.Join(t.TempDir(), "roomserver.db")
	db, err := sql.Open("sqlite3", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, create := range []func(*sql.DB) error{sqlite3.CreateEventsTable, sqlite3.CreateStateBlockTable, sqlite3.CreateStateSnapshotTable} {
		if err := create(db); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range []struct{ nid, typ, key int }{{10, 9, 3}, {20, 9, 3}, {30, 1, 1}} {
		if _, err := db.Exec("INSERT INTO roomserver_events (event_nid, room_nid, event_type_nid, event_state_key_nid, depth, event_id) VALUES ($1, 1, $2, $3, 1, $4)",
			e.nid, e.typ, e.key, "$e"+string(rune('a'+e.nid/10))); err != nil {
			t.Fatal(err)
		}
	}
	blocks, err := sqlite3.PrepareStateBlockTable(db)
	if err != nil {
		t.Fatal(err)
	}
	snapTable, err := sqlite3.PrepareStateSnapshotTable(db)
	if err != nil {
		t.Fatal(err)
	}
	entry := func(ev, typ, key int) types.StateEntry {
		return types.StateEntry{StateKeyTuple: types.StateKeyTuple{EventTypeNID: types.EventTypeNID(typ), EventStateKeyNID: types.EventStateKeyNID(key)}, EventNID: types.EventNID(ev)}
	}
	base, _ := blocks.BulkInsertStateData(ctx, nil, types.StateEntries{entry(30, 1, 1)})
	b20, _ := blocks.BulkInsertStateData(ctx, nil, types.StateEntries{entry(20, 9, 3)})
	b10, _ := blocks.BulkInsertStateData(ctx, nil, types.StateEntries{entry(10, 9, 3)})
	snaps = map[string]types.StateSnapshotNID{}
	for name, list := range map[string]types.StateBlockNIDs{"base": {base}, "b20 then b10": {base, b20, b10}, "b10 then b20": {base, b10, b20}} {
		nid, err := snapTable.InsertState(ctx, nil, 1, list)
		if err != nil {
			t.Fatal(err)
		}
		snaps[name] = nid
	}
	return path, snaps
}

func TestMigrate(t *testing.T) {
	path, snaps := stockDB(t)
	store := filepath.Join(t.TempDir(), "state")
	// A plain path, without file:.
	sum, err := migrate(context.Background(), path, store)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(sum)
	if !strings.Contains(sum, "snapshots=2 ") || !strings.Contains(sum, "mismatches=0") {
		t.Errorf("summary %q", sum) // "b20 then b10" and "b10 then b20" are one row: SQL sorts the list
	}
	s, err := statetables.Open(store)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for name, want := range map[string]types.EventNID{"b20 then b10": 10, "b10 then b20": 10} {
		st, err := s.State(snaps[name])
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(st) != 2 || st[1].EventNID != want {
			t.Errorf("%s: state %v, want event %d for (9, 3) as Dendrite's SQL gives", name, st, want)
		}
	}
	if snaps["b20 then b10"] != snaps["b10 then b20"] {
		t.Errorf("Dendrite's SQL gave two NIDs: %v", snaps)
	}
}

func TestMigrateBadInput(t *testing.T) {
	dir := t.TempDir()
	notRS := filepath.Join(dir, "other.db")
	db, err := sql.Open("sqlite3", "file:"+notRS)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE x (y INTEGER)"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	for _, c := range []struct{ db, want string }{
		{filepath.Join(dir, "missing.db"), "no SQLite database file"},
		{"file:" + filepath.Join(dir, "missing.db"), "no SQLite database file"},
		{notRS, "is not a Dendrite roomserver database"},
	} {
		store := filepath.Join(dir, "state-"+filepath.Base(c.db))
		_, err := migrate(context.Background(), c.db, store)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("-db %s: err %v, want %q", c.db, err, c.want)
		}
		if _, err := os.Stat(store); !os.IsNotExist(err) {
			t.Errorf("-db %s: a store directory was left behind (%v)", c.db, err)
		}
	}
}
