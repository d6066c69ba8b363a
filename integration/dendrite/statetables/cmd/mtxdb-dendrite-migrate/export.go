package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/matrix-org/dendrite/roomserver/types"
)

// exportStock writes a copy of the patched Dendrite SQLite database conn to
// out (a new file, SQLite's VACUUM INTO) in which every snapshot its events
// and rooms name is a row of roomserver_state_snapshots again, with one
// roomserver_state_block of the same NID holding the state's event NIDs,
// ascending: the layout of a stock Dendrite v0.13.8 database, which readers of
// stock databases (mtxdb import --from dendrite:) take as it is. A snapshot
// that still has its SQL row (a migrated one) keeps it. The state is read from
// the database's store (storeDir, or where the patched Dendrite looks for it).
// conn is opened read-only; out must not exist.
func exportStock(ctx context.Context, conn, storeDir, out string) (string, error) {
	if _, err := os.Stat(out); err == nil {
		return "", fmt.Errorf("-export-stock %s: the file exists (give a new path)", out)
	}
	db, sqlite, err := openDB(ctx, conn, false)
	if err != nil {
		return "", err
	}
	defer db.Close()
	if !sqlite {
		return "", fmt.Errorf("-export-stock reads a SQLite database; %q is PostgreSQL", conn)
	}
	refs, err := snapshotRefs(ctx, db)
	if err != nil {
		return "", fmt.Errorf("-db %q %w", conn, err)
	}
	s, err := openStore(ctx, db, sqlite, storeDir)
	if err != nil {
		return "", err
	}
	defer s.Close()
	abs, err := filepath.Abs(out)
	if err != nil {
		return "", err
	}
	if _, err := db.ExecContext(ctx, "VACUUM INTO ?", abs); err != nil {
		return "", fmt.Errorf("-export-stock: copy %s to %s: %w", conn, out, err)
	}
	dst, err := sql.Open("sqlite3", "file:"+abs)
	if err != nil {
		return "", err
	}
	defer dst.Close()
	n, entries, err := writeStock(ctx, dst, refs, func(nid types.StateSnapshotNID) ([]types.StateEntry, error) { return s.State(nid) })
	if err != nil {
		os.Remove(abs)
		return "", err
	}
	return fmt.Sprintf("exported snapshots=%d entries=%d kept=%d store=%q out=%q", n, entries, len(refs)-n, s.Where(), out), nil
}

// snapshotRef is where a snapshot NID is named: its room and the first table
// naming it.
type snapshotRef struct {
	room  types.RoomNID
	table string
}

// snapshotRefs returns every snapshot NID roomserver_events and
// roomserver_rooms name. Its error reads after "-db PATH".
func snapshotRefs(ctx context.Context, db *sql.DB) (map[types.StateSnapshotNID]snapshotRef, error) {
	refs := map[types.StateSnapshotNID]snapshotRef{}
	for _, table := range []string{"roomserver_events", "roomserver_rooms"} {
		rows, err := db.QueryContext(ctx, "SELECT DISTINCT state_snapshot_nid, room_nid FROM "+table+" WHERE state_snapshot_nid != 0")
		if err != nil {
			return nil, fmt.Errorf("is not a Dendrite roomserver database (%s.state_snapshot_nid: %v)", table, err)
		}
		for rows.Next() {
			var nid, room int64
			if err := rows.Scan(&nid, &room); err != nil {
				rows.Close()
				return nil, fmt.Errorf("%s: %w", table, err)
			}
			if _, ok := refs[types.StateSnapshotNID(nid)]; !ok {
				refs[types.StateSnapshotNID(nid)] = snapshotRef{types.RoomNID(room), table}
			}
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", table, err)
		}
	}
	return refs, nil
}

// writeStock inserts, in one transaction of dst, a snapshot row and a block
// row for each snapshot of refs that dst's roomserver_state_snapshots lacks,
// its state from state. It returns how many it wrote and their entries.
func writeStock(ctx context.Context, dst *sql.DB, refs map[types.StateSnapshotNID]snapshotRef, state func(types.StateSnapshotNID) ([]types.StateEntry, error)) (int, int, error) {
	tx, err := dst.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, err
	}
	defer tx.Rollback()
	n, entries := 0, 0
	for _, nid := range slices.Sorted(maps.Keys(refs)) {
		var have int
		if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM roomserver_state_snapshots WHERE state_snapshot_nid = ?", int64(nid)).Scan(&have); err != nil {
			return 0, 0, err
		}
		if have > 0 {
			continue
		}
		st, err := state(nid)
		if err != nil {
			return 0, 0, fmt.Errorf("snapshot %d: %w", nid, err)
		}
		evs := make([]int64, len(st))
		for i, e := range st {
			evs[i] = int64(e.EventNID)
		}
		slices.Sort(evs)
		evJSON, _ := json.Marshal(evs)
		if _, err := tx.ExecContext(ctx, "INSERT INTO roomserver_state_block (state_block_nid, event_nids) VALUES (?, ?)", int64(nid), string(evJSON)); err != nil {
			return 0, 0, fmt.Errorf("snapshot %d: block: %w", nid, err)
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO roomserver_state_snapshots (state_snapshot_nid, room_nid, state_block_nids) VALUES (?, ?, ?)",
			int64(nid), int64(refs[nid].room), fmt.Sprintf("[%d]", int64(nid))); err != nil {
			return 0, 0, fmt.Errorf("snapshot %d: %w", nid, err)
		}
		n++
		entries += len(st)
	}
	return n, entries, tx.Commit()
}
