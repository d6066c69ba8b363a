package main

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	"github.com/matrix-org/dendrite/roomserver/storage/sqlite3"
)

// TestCheck: after a migration, a database whose events and room name the
// migrated snapshots checks clean; a snapshot NID the store lacks, and a state
// naming an event NID that roomserver_events lacks, each fail naming the
// snapshot.
func TestCheck(t *testing.T) {
	ctx := context.Background()
	path, snaps := stockDB(t)
	store := filepath.Join(t.TempDir(), "state")
	if _, err := migrate(ctx, path, store); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite3", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := sqlite3.CreateRoomsTable(db); err != nil {
		t.Fatal(err)
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Exec(q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec("INSERT INTO roomserver_rooms (room_nid, room_id, room_version, state_snapshot_nid) VALUES (1, '!r:s', '10', $1)", snaps["b20 then b10"])
	exec("UPDATE roomserver_events SET state_snapshot_nid = $1 WHERE event_nid = 20", snaps["base"])
	sum, err := check(ctx, path, store)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sum, "checked snapshots=2 ") || !strings.Contains(sum, "failures=0") {
		t.Errorf("summary %q", sum)
	}

	exec("UPDATE roomserver_events SET state_snapshot_nid = $1 WHERE event_nid = 30", int64(snaps["base"])+1000)
	if _, err := check(ctx, path, store); err == nil || !strings.Contains(err.Error(), "named in roomserver_events") || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a snapshot NID the store lacks: %v", err)
	}
	exec("UPDATE roomserver_events SET state_snapshot_nid = 0 WHERE event_nid = 30")
	exec("DELETE FROM roomserver_events WHERE event_nid = 10")
	if _, err := check(ctx, path, store); err == nil || !strings.Contains(err.Error(), "event NID 10 ") {
		t.Errorf("a state naming an event the database lacks: %v", err)
	}
}
