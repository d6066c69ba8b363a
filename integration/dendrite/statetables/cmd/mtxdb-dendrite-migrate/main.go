// Command mtxdb-dendrite-migrate moves a Dendrite v0.13.8 roomserver database's state
// snapshots and blocks from its SQL (SQLite or PostgreSQL) into an mtxdb state store
// (statetables), keeping every snapshot NID, and then checks every snapshot: the
// state read back from the store must equal the state Dendrite's SQL tables give
// (blocks merged in their stored order, the last entry per state key winning).
//
//	mtxdb-dendrite-migrate -db CONNECTION [-store DIR]
//	mtxdb-dendrite-migrate -check -db CONNECTION [-store DIR]
//	mtxdb-dendrite-migrate -export-stock OUT.db -db PATH [-store DIR]
//
// CONNECTION: file:PATH or a plain PATH (SQLite; the file must exist), or a
// PostgreSQL URL (postgres://...) or key=value string. Without -store the store is
// where the patched Dendrite looks for it (statetables.Swap): a SQLite database's
// directory (statetables.DirFor), a PostgreSQL database's own tables (pgstore's
// mtxdb_records, created there). Stop Dendrite first. The SQL rows are left in
// place; the store must hold no migrated NID of another database.
//
// With -check nothing is migrated: the database of a patched Dendrite is checked
// against its store. Every snapshot NID its SQL names (roomserver_events and
// roomserver_rooms state_snapshot_nid) must be in the store, and every event NID
// in those states must be a row of roomserver_events. It prints a summary line
// and exits 1 naming the first snapshots that fail. On SQLite, stop Dendrite
// first (the store directory is locked while it runs); the database is opened
// read-write, so that SQLite can roll back the journal a killed server left.
//
// With -export-stock a patched Dendrite's SQLite database is copied to OUT.db
// with every snapshot back in roomserver_state_snapshots and
// roomserver_state_block (one block per snapshot), as a stock Dendrite
// database holds its state: mtxdb import --from dendrite:OUT.db reads the copy
// (it refuses the patched database itself, whose state those tables lack).
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/lib/pq"
	"github.com/matrix-org/dendrite/roomserver/types"
	_ "github.com/mattn/go-sqlite3"
	"github.com/mtxdb/mtxdb/integration/dendrite/statetables"
)

func main() {
	dbFlag := flag.String("db", "", "roomserver database: file:PATH or PATH (SQLite), or a PostgreSQL connection string")
	storeFlag := flag.String("store", "", "mtxdb state store directory (default: where the patched Dendrite looks for it: beside a SQLite database, inside a PostgreSQL one)")
	checkFlag := flag.Bool("check", false, "check a patched Dendrite's database against its store instead of migrating")
	exportFlag := flag.String("export-stock", "", "write a copy of a patched Dendrite's SQLite database to this new file with its state in stock Dendrite's tables, instead of migrating")
	flag.Parse()
	if *dbFlag == "" || flag.NArg() != 0 || (*checkFlag && *exportFlag != "") {
		fmt.Fprintln(os.Stderr, "usage: mtxdb-dendrite-migrate [-check | -export-stock OUT.db] -db CONNECTION [-store DIR]")
		os.Exit(2)
	}
	run := migrate
	switch {
	case *checkFlag:
		run = check
	case *exportFlag != "":
		run = func(ctx context.Context, conn, store string) (string, error) {
			return exportStock(ctx, conn, store, *exportFlag)
		}
	}
	sum, err := run(context.Background(), *dbFlag, *storeFlag)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mtxdb-dendrite-migrate:", err)
		os.Exit(1)
	}
	fmt.Println(sum)
}

// openDB opens CONNECTION, reaches it once, and says whether it is SQLite. A
// SQLite database is opened read-only unless writable: SQLite itself must write
// to roll back the hot journal a killed server leaves (-check).
func openDB(ctx context.Context, conn string, writable bool) (*sql.DB, bool, error) {
	db, sqlite, err := openConn(conn, writable)
	if err != nil {
		return nil, sqlite, err
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, sqlite, fmt.Errorf("-db: %w", err)
	}
	return db, sqlite, nil
}

func openConn(conn string, writable bool) (*sql.DB, bool, error) {
	switch {
	case strings.HasPrefix(conn, "postgres://"), strings.HasPrefix(conn, "postgresql://"), strings.Contains(conn, "="):
		db, err := sql.Open("postgres", conn)
		return db, false, err
	}
	path := strings.TrimPrefix(conn, "file:")
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	if fi, err := os.Stat(path); err != nil || !fi.Mode().IsRegular() {
		return nil, true, fmt.Errorf("-db %q: no SQLite database file at %s (a PostgreSQL database needs a postgres:// URL or key=value string)", conn, path)
	}
	mode := "?mode=ro"
	if writable {
		mode = ""
	}
	db, err := sql.Open("sqlite3", "file:"+path+mode)
	return db, true, err
}

// snapshot is one row of roomserver_state_snapshots.
type snapshot struct {
	nid    types.StateSnapshotNID
	room   types.RoomNID
	blocks []int64
}

// migrate moves the snapshots of the roomserver database conn into the store at
// storeDir in phases: read (the events' state keys, the state blocks and the
// snapshots), build (each snapshot's state), write (into the store) and check
// (every snapshot read back from a fresh open). It returns the summary line.
func migrate(ctx context.Context, conn, storeDir string) (string, error) {
	db, sqlite, err := openDB(ctx, conn, false)
	if err != nil {
		return "", err
	}
	defer db.Close()
	for _, table := range []string{"roomserver_state_snapshots", "roomserver_state_block", "roomserver_events"} {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&n); err != nil {
			return "", fmt.Errorf("-db %q is not a Dendrite roomserver database (table %s: %v)", conn, table, err)
		}
	}
	keys, err := readStateKeys(ctx, db)
	if err != nil {
		return "", err
	}
	blocks, err := readBlocks(ctx, db, sqlite)
	if err != nil {
		return "", err
	}
	snaps, err := readSnapshots(ctx, db, sqlite)
	if err != nil {
		return "", err
	}
	states, err := buildStates(snaps, blocks, keys)
	if err != nil {
		return "", err
	}
	// Only now, with the input read and understood, the store.
	open, err := storeOpener(ctx, db, sqlite, storeDir)
	if err != nil {
		return "", err
	}
	if err := writeSnapshots(open, snaps, states); err != nil {
		return "", err
	}
	entries, where, err := checkSnapshots(open, snaps, states)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("migrated snapshots=%d blocks=%d entries=%d store=%q checked=%d mismatches=0", len(snaps), len(blocks), entries, where, len(snaps)), nil
}

// nids returns an array of NIDs as a row holds it: JSON text in SQLite (raw), a
// PostgreSQL array otherwise (arr).
func nids(sqlite bool, raw []byte, arr pq.Int64Array) ([]int64, error) {
	if !sqlite {
		return arr, nil
	}
	var v []int64
	err := json.Unmarshal(raw, &v)
	return v, err
}

// readStateKeys returns the state key tuple of every state event, by event NID
// (roomserver_events).
func readStateKeys(ctx context.Context, db *sql.DB) (map[types.EventNID]types.StateKeyTuple, error) {
	keys := map[types.EventNID]types.StateKeyTuple{}
	rows, err := db.QueryContext(ctx, "SELECT event_nid, event_type_nid, event_state_key_nid FROM roomserver_events WHERE event_state_key_nid <> 0")
	if err != nil {
		return nil, fmt.Errorf("read roomserver_events: %w", err)
	}
	for rows.Next() {
		var e, t, k int64
		if err := rows.Scan(&e, &t, &k); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read roomserver_events: %w", err)
		}
		keys[types.EventNID(e)] = types.StateKeyTuple{EventTypeNID: types.EventTypeNID(t), EventStateKeyNID: types.EventStateKeyNID(k)}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read roomserver_events: %w", err)
	}
	return keys, nil
}

// readBlocks returns the event NIDs of every state block, by block NID
// (roomserver_state_block), in their stored order.
func readBlocks(ctx context.Context, db *sql.DB, sqlite bool) (map[int64][]int64, error) {
	blocks := map[int64][]int64{}
	rows, err := db.QueryContext(ctx, "SELECT state_block_nid, event_nids FROM roomserver_state_block")
	if err != nil {
		return nil, fmt.Errorf("read roomserver_state_block: %w", err)
	}
	for rows.Next() {
		var nid int64
		var raw []byte
		var arr pq.Int64Array
		dst := any(&raw)
		if !sqlite {
			dst = &arr
		}
		if err := rows.Scan(&nid, dst); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read roomserver_state_block: %w", err)
		}
		ev, err := nids(sqlite, raw, arr)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("state block %d: event NIDs %q: %w", nid, raw, err)
		}
		blocks[nid] = ev
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read roomserver_state_block: %w", err)
	}
	return blocks, nil
}

// readSnapshots returns every state snapshot (roomserver_state_snapshots) by
// ascending NID.
func readSnapshots(ctx context.Context, db *sql.DB, sqlite bool) ([]snapshot, error) {
	var snaps []snapshot
	rows, err := db.QueryContext(ctx, "SELECT state_snapshot_nid, room_nid, state_block_nids FROM roomserver_state_snapshots ORDER BY state_snapshot_nid")
	if err != nil {
		return nil, fmt.Errorf("read roomserver_state_snapshots: %w", err)
	}
	for rows.Next() {
		var nid, room int64
		var raw []byte
		var arr pq.Int64Array
		dst := any(&raw)
		if !sqlite {
			dst = &arr
		}
		if err := rows.Scan(&nid, &room, dst); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read roomserver_state_snapshots: %w", err)
		}
		b, err := nids(sqlite, raw, arr)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("state snapshot %d: block NIDs %q: %w", nid, raw, err)
		}
		snaps = append(snaps, snapshot{types.StateSnapshotNID(nid), types.RoomNID(room), b})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read roomserver_state_snapshots: %w", err)
	}
	return snaps, nil
}

// buildStates returns every snapshot's state as Dendrite's LoadStateAtSnapshot
// builds it: its blocks merged in order, each block's events by ascending NID,
// the last entry per state key winning; sorted by state key tuple.
func buildStates(snaps []snapshot, blocks map[int64][]int64, keys map[types.EventNID]types.StateKeyTuple) ([][]types.StateEntry, error) {
	states := make([][]types.StateEntry, len(snaps))
	for i, sn := range snaps {
		st := map[types.StateKeyTuple]types.EventNID{}
		for _, b := range sn.blocks {
			ev, ok := blocks[b]
			if !ok {
				return nil, fmt.Errorf("state snapshot %d (room NID %d) names state block %d, which is not in roomserver_state_block", sn.nid, sn.room, b)
			}
			sorted := append([]int64(nil), ev...)
			sort.Slice(sorted, func(a, b int) bool { return sorted[a] < sorted[b] })
			for _, e := range sorted {
				k, ok := keys[types.EventNID(e)]
				if !ok {
					return nil, fmt.Errorf("state block %d names event NID %d, which is no state event in roomserver_events", b, e)
				}
				st[k] = types.EventNID(e)
			}
		}
		for k, e := range st {
			states[i] = append(states[i], types.StateEntry{StateKeyTuple: k, EventNID: e})
		}
		sort.Slice(states[i], func(a, b int) bool { return states[i][a].StateKeyTuple.LessThan(states[i][b].StateKeyTuple) })
	}
	return states, nil
}

// writeSnapshots imports every snapshot with its state into the store open
// opens, under its NID, and syncs and closes it.
func writeSnapshots(open func() (*statetables.Store, error), snaps []snapshot, states [][]types.StateEntry) error {
	store, err := open()
	if err != nil {
		return err
	}
	for i, sn := range snaps {
		if err := store.ImportSnapshot(sn.room, sn.nid, states[i]); err != nil {
			_ = store.Close()
			return err
		}
	}
	if err := store.Sync(); err != nil {
		_ = store.Close()
		return err
	}
	return store.Close()
}

// checkSnapshots reads every snapshot back from a fresh open of the store and
// compares it with its state; it returns the entries read and where the store is.
func checkSnapshots(open func() (*statetables.Store, error), snaps []snapshot, states [][]types.StateEntry) (int, string, error) {
	store, err := open()
	if err != nil {
		return 0, "", err
	}
	defer store.Close()
	entries := 0
	for i, sn := range snaps {
		got, err := store.State(sn.nid)
		if err != nil {
			return 0, "", fmt.Errorf("check snapshot %d: %w", sn.nid, err)
		}
		if !equal(got, states[i]) {
			return 0, "", fmt.Errorf("check snapshot %d (room NID %d): the store holds %d entries, SQL gives %d (or they differ)", sn.nid, sn.room, len(got), len(states[i]))
		}
		entries += len(got)
	}
	return entries, store.Where(), nil
}

// equal reports whether two sorted states hold the same entries.
func equal(a, b []types.StateEntry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// openStore opens the store of database db (storeOpener).
func openStore(ctx context.Context, db *sql.DB, sqlite bool, storeDir string) (*statetables.Store, error) {
	open, err := storeOpener(ctx, db, sqlite, storeDir)
	if err != nil {
		return nil, err
	}
	return open()
}

// storeOpener returns how to open the store of database db: the directory
// storeDir, or without one where the patched Dendrite looks for it (inside a
// PostgreSQL database unless statetables.EnvDir is set, else the directory
// statetables.DirFor names).
func storeOpener(ctx context.Context, db *sql.DB, sqlite bool, storeDir string) (func() (*statetables.Store, error), error) {
	if storeDir == "" && !sqlite && os.Getenv(statetables.EnvDir) == "" {
		return func() (*statetables.Store, error) { return statetables.OpenPostgres(ctx, db) }, nil
	}
	if storeDir == "" {
		var err error
		if storeDir, err = statetables.DirFor(ctx, db, sqlite); err != nil {
			return nil, err
		}
	}
	return func() (*statetables.Store, error) { return statetables.Open(storeDir) }, nil
}
