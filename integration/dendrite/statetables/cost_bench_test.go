package statetables

import (
	"database/sql"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/matrix-org/dendrite/roomserver/storage/postgres"
	"github.com/matrix-org/dendrite/roomserver/storage/sqlite3"
	"github.com/matrix-org/dendrite/roomserver/storage/tables"
	"github.com/matrix-org/dendrite/roomserver/types"
	"github.com/mtxdb/mtxdb/pgstore/pgtest"
)

// stateTables is the part of Dendrite's roomserver storage a state change goes
// through: stock's SQL tables or this package's Store.
type stateTables interface {
	tables.StateBlock
	tables.StateSnapshot
}

// BenchmarkStateChangeBytes stores the state of a room of N members and then
// b.N membership changes, each the way Dendrite v0.13.8's roomserver stores the
// state after a state event with one prev event (roomserver/state/state.go,
// CalculateAndStoreStateBeforeEvent and shared.Database.AddState): the previous
// snapshot's blocks plus a block of the one changed entry, or, once a snapshot
// lists 64 blocks, a block of the whole state. It reports the bytes the change
// added on disk per change (B/change): stock's SQLite state tables (the database
// file after a WAL checkpoint) against the mtxdb store (its directory, shards
// and index, after Close). Run: make bench-state-cost.
func BenchmarkStateChangeBytes(b *testing.B) {
	for _, members := range []int{100, 1000, 10000} {
		for _, build := range []string{"stock", "mtxdb"} {
			b.Run(fmt.Sprintf("members=%d/%s", members, build), func(b *testing.B) {
				open, size := openStock, stockBytes
				if build == "mtxdb" {
					open, size = openMtxdb(ChainLimit), dirBytes
				}
				stateChanges(b, members, open, size)
			})
		}
	}
}

// BenchmarkChainLimit is BenchmarkStateChangeBytes's mtxdb store with other
// chain limits (K): B/change counts the checkpoints only once b.N reaches K, so
// run it with -benchtime of a few times the largest K, e.g. 33000x.
func BenchmarkChainLimit(b *testing.B) {
	for _, members := range []int{1000, 10000} {
		for _, limit := range []uint32{1024, 4096, 16384} {
			b.Run(fmt.Sprintf("members=%d/K=%d", members, limit), func(b *testing.B) {
				stateChanges(b, members, openMtxdb(limit), dirBytes)
			})
		}
	}
}

// stateChanges stores a room of members and then b.N membership changes the way
// Dendrite's roomserver does (BenchmarkStateChangeBytes) and reports B/change.
func stateChanges(b *testing.B, members int, open func(*testing.B, string) (stateTables, func()), size func(*testing.B, string) int64) {
	dir := b.TempDir()
	st, done := open(b, dir)
	state := memberState(members)
	snap := addState(b, st, 1, nil, state)
	done()
	before := size(b, dir)
	st, done = open(b, dir)
	next := types.EventNID(members + 1)
	b.ResetTimer()
	for i := range b.N {
		k := changeMember(i, members)
		state[k] = memberEntry(k, next)
		next++
		lists, err := st.BulkSelectStateBlockNIDs(ctx, nil, []types.StateSnapshotNID{snap})
		if err != nil {
			b.Fatal(err)
		}
		if blocks := lists[0].StateBlockNIDs; len(blocks) < 64 {
			snap = addState(b, st, 1, blocks, []types.StateEntry{state[k]})
		} else {
			snap = addState(b, st, 1, nil, state)
		}
	}
	b.StopTimer()
	done()
	b.ReportMetric(float64(size(b, dir)-before)/float64(b.N), "B/change")
}

// changeMember is the member whose entry change i of a benchmark sets: a
// stride through the room.
func changeMember(i, members int) int { return (i * 7919) % members }

// memberState is the state of a room of members: member i set to event i+1.
func memberState(members int) []types.StateEntry {
	state := make([]types.StateEntry, members)
	for i := range state {
		state[i] = memberEntry(i, types.EventNID(1+i))
	}
	return state
}

// memberEntry is the m.room.member entry of member i, set to event ev.
func memberEntry(i int, ev types.EventNID) types.StateEntry {
	return types.StateEntry{StateKeyTuple: types.StateKeyTuple{EventTypeNID: types.MRoomMemberNID,
		EventStateKeyNID: types.EventStateKeyNID(100 + i)}, EventNID: ev}
}

// addState is shared.Database.AddState: the entries as a new block after blocks,
// stored as one snapshot.
func addState(b *testing.B, st stateTables, room types.RoomNID, blocks []types.StateBlockNID, entries []types.StateEntry) types.StateSnapshotNID {
	blocks = append([]types.StateBlockNID(nil), blocks...)
	if len(entries) > 0 {
		nid, err := st.BulkInsertStateData(ctx, nil, entries)
		if err != nil {
			b.Fatal(err)
		}
		blocks = append(blocks, nid)
	}
	snap, err := st.InsertState(ctx, nil, room, blocks)
	if err != nil {
		b.Fatal(err)
	}
	return snap
}

func openStock(b *testing.B, dir string) (stateTables, func()) {
	st, _, done := openStockDB(b, dir)
	return st, done
}

// openStockDB is openStock that also returns the database.
func openStockDB(b *testing.B, dir string) (stateTables, *sql.DB, func()) {
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, "roomserver.db")+"?_journal_mode=WAL")
	if err != nil {
		b.Fatal(err)
	}
	st := stockTables(b, db, []func(*sql.DB) error{sqlite3.CreateStateBlockTable, sqlite3.CreateStateSnapshotTable},
		sqlite3.PrepareStateBlockTable, sqlite3.PrepareStateSnapshotTable)
	return st, db, func() {
		if _, err := db.Exec("PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
			b.Fatal(err)
		}
		db.Close()
	}
}

// openMtxdb opens the store with chain limit K.
func openMtxdb(limit uint32) func(*testing.B, string) (stateTables, func()) {
	return func(b *testing.B, dir string) (stateTables, func()) {
		s, err := Open(filepath.Join(dir, "state"))
		if err != nil {
			b.Fatal(err)
		}
		s.chainLimit = limit
		return s, func() {
			if err := s.Close(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// stockBytes is the SQLite database file's size.
func stockBytes(b *testing.B, dir string) int64 {
	fi, err := os.Stat(filepath.Join(dir, "roomserver.db"))
	if err != nil {
		b.Fatal(err)
	}
	return fi.Size()
}

// dirBytes is the size of every file under dir/state.
func dirBytes(b *testing.B, dir string) int64 {
	var n int64
	err := filepath.WalkDir(filepath.Join(dir, "state"), func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkColdRead reads, with every cache empty, the state of the snapshot at
// the last position of a chain (K-1: the most records and the most changes to
// materialise) in a room of 10,000 members; ms/read and records/read report it.
func BenchmarkColdRead(b *testing.B) {
	const members = 10000
	dir := b.TempDir()
	st, done := openMtxdb(ChainLimit)(b, dir)
	s := st.(*Store)
	state := memberState(members)
	snap := addState(b, st, 1, nil, state)
	next := types.EventNID(members + 1)
	for i := range ChainLimit - 1 {
		k := (i * 7919) % members
		snap = addState(b, st, 1, []types.StateBlockNID{types.StateBlockNID(snap)}, []types.StateEntry{memberEntry(k, next)})
		next++
	}
	if ref, _, err := s.ref(ctx, nil, snap); err != nil || ref.pos != ChainLimit-1 {
		b.Fatalf("last snapshot at position %d, %v; want %d", ref.pos, err, ChainLimit-1)
	}
	b.ResetTimer()
	for range b.N {
		s.roots.Purge()
		s.entries.Purge()
		s.layers.purge()
		if got, err := s.State(snap); err != nil || len(got) != members {
			b.Fatalf("%d entries, %v", len(got), err)
		}
	}
	b.StopTimer()
	records := 0
	for pos := uint32(ChainLimit - 1); pos != 0; pos = chainBase(pos) {
		records++
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/read")
	b.ReportMetric(float64(records), "records/read")
	done()
}

// BenchmarkStateChangeLatency times one state change the way Dendrite v0.13.8's
// input path makes it inside the room updater's transaction
// (roomserver/internal/input and shared.Database.addState): the previous
// snapshot's block list, its blocks' event NIDs (addState's duplicate check), a
// delta block of the changed entry, the new snapshot, commit; then the event NIDs
// of the new snapshot, as the next event's auth check reads them. Stock's SQL
// tables against the mtxdb store, on SQLite (mtxdb: packstore) and on the
// PostgreSQL server in MTXDB_TEST_POSTGRES (skipped when unset), in rooms of 1,000
// and 10,000 members. ns/op is one change. Run: make bench-state-latency.
func BenchmarkStateChangeLatency(b *testing.B) {
	for _, members := range []int{1000, 10000} {
		for _, database := range []string{"sqlite", "postgres"} {
			for _, build := range []string{"stock", "mtxdb"} {
				b.Run(fmt.Sprintf("members=%d/%s/%s", members, database, build), func(b *testing.B) {
					st, db := openLatency(b, database, build)
					latencyChanges(b, st, db, members)
				})
			}
		}
	}
}

// openLatency opens the state tables of one cell of BenchmarkStateChangeLatency
// and the database whose transactions they are handed (nil: none).
func openLatency(b *testing.B, database, build string) (stateTables, *sql.DB) {
	switch {
	case database == "sqlite" && build == "stock":
		st, db, done := openStockDB(b, b.TempDir())
		b.Cleanup(done)
		return st, db
	case database == "sqlite":
		st, done := openMtxdb(ChainLimit)(b, b.TempDir())
		b.Cleanup(done)
		return st, nil
	}
	db, err := sql.Open("postgres", pgtest.NewDatabase(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	if build == "mtxdb" {
		s, err := OpenPostgres(ctx, db)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s, db
	}
	// The snapshot table's statements name the events, event JSON and state key tables.
	return stockTables(b, db, []func(*sql.DB) error{postgres.CreateEventsTable, postgres.CreateEventStateKeysTable,
		postgres.CreateEventJSONTable, postgres.CreateStateBlockTable, postgres.CreateStateSnapshotTable},
		postgres.PrepareStateBlockTable, postgres.PrepareStateSnapshotTable), db
}

// stockTables creates Dendrite's tables in db and prepares its state tables.
func stockTables[B tables.StateBlock, S tables.StateSnapshot](b *testing.B, db *sql.DB, create []func(*sql.DB) error,
	blocks func(*sql.DB) (B, error), snaps func(*sql.DB) (S, error)) stateTables {
	for _, c := range create {
		if err := c(db); err != nil {
			b.Fatal(err)
		}
	}
	bl, err := blocks(db)
	if err != nil {
		b.Fatal(err)
	}
	sn, err := snaps(db)
	if err != nil {
		b.Fatal(err)
	}
	return struct {
		tables.StateBlock
		tables.StateSnapshot
	}{bl, sn}
}

// latencyChanges stores a room of members, then times b.N state changes
// (BenchmarkStateChangeLatency), each in a transaction of db when db is not nil.
func latencyChanges(b *testing.B, st stateTables, db *sql.DB, members int) {
	state := memberState(members)
	snap := addState(b, st, 1, nil, state)
	next := types.EventNID(members + 1)
	b.ResetTimer()
	for i := range b.N {
		k := changeMember(i, members)
		state[k] = memberEntry(k, next)
		next++
		var txn *sql.Tx
		if db != nil {
			var err error
			if txn, err = db.Begin(); err != nil {
				b.Fatal(err)
			}
		}
		snap = latencyChange(b, st, txn, snap, state, state[k])
		if txn != nil {
			if err := txn.Commit(); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := st.BulkSelectStateBlockEntries(ctx, nil, []types.StateBlockNID{types.StateBlockNID(snap)}); err != nil {
			b.Fatal(err)
		}
	}
}

// latencyChange is one change of latencyChanges inside txn: the new snapshot of
// snap's state with entry changed (state: the whole new state, stored as one
// block once snap lists 64, as Dendrite does).
func latencyChange(b *testing.B, st stateTables, txn *sql.Tx, snap types.StateSnapshotNID, state []types.StateEntry, entry types.StateEntry) types.StateSnapshotNID {
	lists, err := st.BulkSelectStateBlockNIDs(ctx, txn, []types.StateSnapshotNID{snap})
	if err != nil {
		b.Fatal(err)
	}
	blocks := slices.Clone(lists[0].StateBlockNIDs)
	entries := []types.StateEntry{entry}
	if len(blocks) >= 64 {
		blocks, entries = nil, state
	} else if _, err := st.BulkSelectStateBlockEntries(ctx, txn, blocks); err != nil {
		b.Fatal(err)
	}
	delta, err := st.BulkInsertStateData(ctx, txn, entries)
	if err != nil {
		b.Fatal(err)
	}
	nid, err := st.InsertState(ctx, txn, 1, append(blocks, delta))
	if err != nil {
		b.Fatal(err)
	}
	return nid
}
