package statetables

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/lib/pq"
	"github.com/matrix-org/dendrite/roomserver/storage/tables"
	"github.com/matrix-org/dendrite/roomserver/types"
	"github.com/mtxdb/mtxdb/internal/testseed"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/pgstore/pgtest"
)

var seedFlag = flag.Uint64("statetables.seed", 0, "seed of the random tests (0: time)")

// seed returns the seed of a random test (-statetables.seed, else the clock),
// logged with how to repeat the test.
func seed(t *testing.T) uint64 {
	t.Helper()
	return testseed.Seed(t, "statetables.seed", *seedFlag, "")
}

var ctx = context.Background()

type state = map[types.StateKeyTuple]types.EventNID

// model is what Dendrite expects of the two tables: a snapshot is its blocks merged in
// the order given, the last entry per key winning (inside a delta: the highest event NID).
type model struct {
	byNID map[types.StateSnapshotNID]state
}

func stateOf(m state) string {
	keys := slices.SortedFunc(maps.Keys(m), func(a, b types.StateKeyTuple) int {
		if a.LessThan(b) {
			return -1
		}
		if b.LessThan(a) {
			return 1
		}
		return 0
	})
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%d/%d=%d;", k.EventTypeNID, k.EventStateKeyNID, m[k])
	}
	return b.String()
}

func randomDelta(rng *rand.Rand, n int) []types.StateEntry {
	out := make([]types.StateEntry, n)
	for i := range out {
		out[i] = types.StateEntry{
			StateKeyTuple: types.StateKeyTuple{EventTypeNID: types.EventTypeNID(1 + rng.IntN(8)), EventStateKeyNID: types.EventStateKeyNID(1 + rng.IntN(60))},
			EventNID:      types.EventNID(1 + rng.IntN(5000)),
		}
	}
	return out
}

func applyDelta(base state, d []types.StateEntry) state {
	out := maps.Clone(base)
	if out == nil {
		out = state{}
	}
	inDelta := map[types.StateKeyTuple]bool{}
	for _, e := range d {
		if !inDelta[e.StateKeyTuple] || e.EventNID > out[e.StateKeyTuple] {
			out[e.StateKeyTuple] = e.EventNID
		}
		inDelta[e.StateKeyTuple] = true
	}
	return out
}

// check compares every snapshot of the model with the store, through Dendrite's
// calls (block lists, then block entries) and through State.
func (m *model) check(t *testing.T, s *Store) {
	t.Helper()
	byState := map[string]types.StateSnapshotNID{}
	for nid, want := range m.byNID {
		key := fmt.Sprintf("%d|%s", nid>>32, stateOf(want))
		if other, ok := byState[key]; ok && other != nid {
			t.Fatalf("equal states of one room have two NIDs: %d and %d", other, nid)
		}
		byState[key] = nid
		lists, err := s.BulkSelectStateBlockNIDs(ctx, nil, []types.StateSnapshotNID{nid})
		if err != nil {
			t.Fatalf("BulkSelectStateBlockNIDs(%d): %v", nid, err)
		}
		var got []types.EventNID
		if len(lists[0].StateBlockNIDs) > 0 {
			blocks, err := s.BulkSelectStateBlockEntries(ctx, nil, lists[0].StateBlockNIDs)
			if err != nil {
				t.Fatalf("BulkSelectStateBlockEntries(%v): %v", lists[0].StateBlockNIDs, err)
			}
			for _, b := range blocks {
				got = append(got, b...)
			}
		}
		wantEv := slices.Sorted(maps.Values(want))
		slices.Sort(got)
		if !slices.Equal(got, wantEv) {
			t.Fatalf("snapshot %d: event NIDs %v, want %v", nid, got, wantEv)
		}
		entries, err := s.State(nid)
		if err != nil {
			t.Fatalf("State(%d): %v", nid, err)
		}
		gotState := state{}
		for _, e := range entries {
			gotState[e.StateKeyTuple] = e.EventNID
		}
		if stateOf(gotState) != stateOf(want) {
			t.Fatalf("snapshot %d: state %s, want %s", nid, stateOf(gotState), stateOf(want))
		}
	}
}

// place is where a test's store keeps its records: open opens it (again: a fresh
// Store over the same records); db is the PostgreSQL database (nil on packstore).
type place struct {
	open func() *Store
	db   *sql.DB
}

// eachPlace runs f on a packstore directory and on a fresh PostgreSQL database of
// the server in MTXDB_TEST_POSTGRES (pgstore/pgtest: skipped, saying why, when it
// is unset; make test sets it), opened with lib/pq as Dendrite opens it.
func eachPlace(t *testing.T, f func(t *testing.T, p place)) {
	t.Run("packstore", func(t *testing.T) {
		dir := t.TempDir()
		f(t, place{open: func() *Store {
			s, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}})
	})
	t.Run("postgres", func(t *testing.T) {
		db := pgDB(t)
		f(t, place{db: db, open: func() *Store {
			s, err := OpenPostgres(ctx, db)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}})
	})
}

func pgDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("postgres", pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestModel drives the tables as Dendrite's AddState does (a snapshot's blocks
// plus a delta, a delta alone, several snapshots and deltas in one list), with
// reopens and a purge, and compares every snapshot with the model after each phase;
// on PostgreSQL also with every AddState in a Dendrite transaction (lib/pq), a
// quarter of them rolled back: a rolled-back new NID must be invisible outside
// (MissingStateError), the transaction must read its own snapshot, and no NID may
// be handed out twice. It runs with chain limits K = 1 (no chained records), 3
// (checkpoints every third snapshot of a chain) and ChainLimit.
func TestModel(t *testing.T) {
	for _, limit := range []uint32{1, 3, ChainLimit} {
		t.Run(fmt.Sprintf("K=%d", limit), func(t *testing.T) {
			eachPlace(t, func(t *testing.T, p place) {
				open := p.open
				p.open = func() *Store {
					s := open()
					s.chainLimit = limit
					return s
				}
				testModel(t, p, false)
				if p.db != nil {
					t.Run("transactions", func(t *testing.T) { testModel(t, p, true) })
				}
			})
		})
	}
}

func testModel(t *testing.T, p place, inTx bool) {
	rng := rand.New(rand.NewPCG(seed(t), 1))
	s := p.open()
	var err error
	m := &model{byNID: map[types.StateSnapshotNID]state{}}
	handed := map[types.StateSnapshotNID]string{} // every NID InsertState returned: its state
	rolledBack := 0
	rooms := []types.RoomNID{1, 2, 7, MaxRoomNID}
	if inTx {
		rooms = []types.RoomNID{11, 12, 17}
	}
	byRoom := map[types.RoomNID][]types.StateSnapshotNID{}
	for phase := 0; phase < 4; phase++ {
		for op := 0; op < 150; op++ {
			room := rooms[rng.IntN(len(rooms))]
			var txn *sql.Tx
			if inTx {
				if txn, err = p.db.BeginTx(ctx, nil); err != nil {
					t.Fatal(err)
				}
			}
			var blocks types.StateBlockNIDs
			want := state{}
			have := byRoom[room]
			nb := rng.IntN(3)
			for i := 0; i < nb && len(have) > 0; i++ {
				b := have[rng.IntN(len(have))]
				blocks = append(blocks, types.StateBlockNID(b))
				for k, v := range m.byNID[b] {
					want[k] = v
				}
			}
			if rng.IntN(5) > 0 {
				d := randomDelta(rng, rng.IntN(6))
				if rng.IntN(10) == 0 && len(want) > 0 {
					// a delta that repeats an entry of the state: no change
					for k, v := range want {
						d = []types.StateEntry{{StateKeyTuple: k, EventNID: v}}
						break
					}
				}
				bn, err := s.BulkInsertStateData(ctx, txn, d)
				if err != nil {
					t.Fatal(err)
				}
				blocks = append(blocks, bn)
				want = applyDelta(want, d)
			}
			if rng.IntN(4) == 0 {
				slices.Reverse(blocks) // order matters: later wins
				want = state{}
				for _, b := range blocks {
					if !isDelta(int64(b)) {
						maps.Copy(want, m.byNID[types.StateSnapshotNID(b)])
					} else {
						d, _ := s.deltas.get(b)
						want = applyDelta(want, d)
					}
				}
			}
			nid, err := s.InsertState(ctx, txn, room, blocks)
			if err != nil {
				t.Fatalf("InsertState(%d, %v): %v", room, blocks, err)
			}
			if r, _ := splitNID(int64(nid)); r != room {
				t.Fatalf("NID %d names room %d, want %d", nid, r, room)
			}
			if old, ok := handed[nid]; ok && old != stateOf(want) {
				t.Fatalf("NID %d handed out for two states: %s and %s", nid, old, stateOf(want))
			}
			handed[nid] = stateOf(want)
			if txn != nil {
				// The transaction reads its own snapshot, as Dendrite's SQL would.
				if _, err := s.BulkSelectStateBlockNIDs(ctx, txn, []types.StateSnapshotNID{nid}); err != nil {
					t.Fatalf("NID %d inside its transaction: %v", nid, err)
				}
				if rng.IntN(4) == 0 {
					if err := txn.Rollback(); err != nil {
						t.Fatal(err)
					}
					rolledBack++
					_, err := s.BulkSelectStateBlockNIDs(ctx, nil, []types.StateSnapshotNID{nid})
					var missing types.MissingStateError
					_, committed := m.byNID[nid]
					if committed && err != nil {
						t.Fatalf("NID %d committed before, rolled back again: %v", nid, err)
					} else if !committed && !errors.As(err, &missing) {
						t.Fatalf("NID %d of a rolled-back transaction: err %v, want MissingStateError", nid, err)
					}
					if !committed {
						handed[nid] = "rolled back" // never to be handed out again
					}
					continue
				}
				if err := txn.Commit(); err != nil {
					t.Fatal(err)
				}
			}
			if old, ok := m.byNID[nid]; ok && stateOf(old) != stateOf(want) {
				t.Fatalf("NID %d given to two states: %s and %s", nid, stateOf(old), stateOf(want))
			}
			if _, ok := m.byNID[nid]; !ok {
				byRoom[room] = append(byRoom[room], nid)
			}
			m.byNID[nid] = want
		}
		m.check(t, s)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = p.open()
		m.check(t, s)
	}
	if inTx {
		t.Logf("%d transactions rolled back", rolledBack)
		if rolledBack == 0 {
			t.Fatal("no transaction rolled back: the test proved nothing")
		}
	}

	// Purge room 2: its NIDs are gone, other rooms intact, new NIDs are higher.
	purgedRoom := rooms[1]
	purged := byRoom[purgedRoom]
	maxOld := slices.Max(purged)
	if err := s.PurgeRoom(ctx, nil, purgedRoom); err != nil {
		t.Fatal(err)
	}
	for _, nid := range purged {
		_, err := s.BulkSelectStateBlockNIDs(ctx, nil, []types.StateSnapshotNID{nid})
		var missing types.MissingStateError
		if !errors.As(err, &missing) {
			t.Fatalf("purged snapshot %d: err %v, want MissingStateError", nid, err)
		}
		delete(m.byNID, nid)
	}
	m.check(t, s)
	for i := 0; i < 2; i++ {
		bn, _ := s.BulkInsertStateData(ctx, nil, randomDelta(rng, 3))
		nid, err := s.InsertState(ctx, nil, purgedRoom, types.StateBlockNIDs{bn})
		if err != nil {
			t.Fatal(err)
		}
		if nid <= maxOld {
			t.Fatalf("after purge: NID %d not above the purged room's %d", nid, maxOld)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = p.open()
	}
	_ = s.Close()
}

// TestSliceOrderMatters: the blocks are merged in the order given. Dendrite's SQL
// sorts them by NID, so a delta reused under an older NID would lose (note dendrite.md).
func TestBlockOrder(t *testing.T) { eachPlace(t, testBlockOrder) }

func testBlockOrder(t *testing.T, p place) {
	s := p.open()
	defer s.Close()
	k := types.StateKeyTuple{EventTypeNID: 1, EventStateKeyNID: 1}
	y, _ := s.BulkInsertStateData(ctx, nil, types.StateEntries{{StateKeyTuple: k, EventNID: 20}})
	sy, err := s.InsertState(ctx, nil, 1, types.StateBlockNIDs{y})
	if err != nil {
		t.Fatal(err)
	}
	x, _ := s.BulkInsertStateData(ctx, nil, types.StateEntries{{StateKeyTuple: k, EventNID: 10}})
	for _, c := range []struct {
		blocks types.StateBlockNIDs
		want   types.EventNID
	}{
		{types.StateBlockNIDs{types.StateBlockNID(sy), x}, 10},
		{types.StateBlockNIDs{x, types.StateBlockNID(sy)}, 20},
	} {
		nid, err := s.InsertState(ctx, nil, 1, c.blocks)
		if err != nil {
			t.Fatal(err)
		}
		st, err := s.State(nid)
		if err != nil {
			t.Fatal(err)
		}
		if len(st) != 1 || st[0].EventNID != c.want {
			t.Fatalf("blocks %v: state %v, want event %d", c.blocks, st, c.want)
		}
	}
}

func TestErrors(t *testing.T) { eachPlace(t, testErrors) }

func testErrors(t *testing.T, p place) {
	s := p.open()
	defer s.Close()
	d, _ := s.BulkInsertStateData(ctx, nil, types.StateEntries{{StateKeyTuple: types.StateKeyTuple{EventTypeNID: 1, EventStateKeyNID: 1}, EventNID: 5}})
	s1, err := s.InsertState(ctx, nil, 1, types.StateBlockNIDs{d})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		room   types.RoomNID
		blocks types.StateBlockNIDs
		want   string
	}{
		{"room 0", 0, nil, "room NID 0 out of range"},
		{"room too large", MaxRoomNID + 1, nil, "out of range"},
		{"unknown delta", 1, types.StateBlockNIDs{d + 999999}, "(#0) unknown"},
		{"unknown migrated NID", 1, types.StateBlockNIDs{999999}, "block 999999 (#0) unknown"},
		{"unknown snapshot", 1, types.StateBlockNIDs{types.StateBlockNID(SnapshotNID(1, 77))}, "unknown"},
		{"other room", 2, types.StateBlockNIDs{types.StateBlockNID(s1)}, "belongs to room NID 1"},
	} {
		_, err := s.InsertState(ctx, nil, c.room, c.blocks)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want %q", c.name, err, c.want)
		}
	}
	for _, nid := range []types.StateSnapshotNID{0, -3, 5, SnapshotNID(1, 99)} {
		_, err := s.BulkSelectStateBlockNIDs(ctx, nil, []types.StateSnapshotNID{s1, nid})
		var missing types.MissingStateError
		if !errors.As(err, &missing) {
			t.Errorf("snapshot %d: err %v, want MissingStateError", nid, err)
		}
	}
	if _, err := s.BulkSelectStateBlockEntries(ctx, nil, types.StateBlockNIDs{types.StateBlockNID(SnapshotNID(3, 1))}); err == nil {
		t.Error("unknown block: no error")
	}
	if _, err := s.BulkSelectStateForHistoryVisibility(ctx, nil, s1, "x"); err != tables.OptimisationNotSupportedError {
		t.Errorf("history visibility: %v", err)
	}
	if _, err := s.BulkSelectMembershipForHistoryVisibility(ctx, nil, 1, &types.RoomInfo{}); err != tables.OptimisationNotSupportedError {
		t.Errorf("membership for history visibility: %v", err)
	}
	// Equal states share a NID, also given in another block order; the empty state has one too.
	s1b, err := s.InsertState(ctx, nil, 1, types.StateBlockNIDs{types.StateBlockNID(s1), d})
	if err != nil || s1b != s1 {
		t.Errorf("same state again: %d, %v; want %d", s1b, err, s1)
	}
	e1, err := s.InsertState(ctx, nil, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Sorted by NID, each once, as Dendrite's SQL answers (callers binary-search it).
	lists, err := s.BulkSelectStateBlockNIDs(ctx, nil, []types.StateSnapshotNID{e1, s1, e1})
	if err != nil || len(lists) != 2 || lists[0].StateSnapshotNID != s1 || lists[0].StateBlockNIDs[0] != types.StateBlockNID(s1) ||
		lists[1].StateSnapshotNID != e1 || len(lists[1].StateBlockNIDs) != 0 {
		t.Errorf("block lists %v, %v", lists, err)
	}
}

// TestCorruptRecords: a damaged snapshot, root or lease record, or a value that is
// no event NID, gives an error naming it, never a panic or a wrong state.
func TestCorruptRecords(t *testing.T) {
	for _, c := range []struct {
		name string
		id   func(s *Store, nid types.StateSnapshotNID) packstore.ID
		data []byte
		want string
	}{
		{"snapshot short", func(s *Store, nid types.StateSnapshotNID) packstore.ID { return snapshotRecordID(uint32(nid)) }, []byte{'S', 1, 2}, "corrupt snapshot record"},
		{"snapshot kind", func(s *Store, nid types.StateSnapshotNID) packstore.ID { return snapshotRecordID(uint32(nid)) }, append([]byte{'X', 1}, make([]byte, 16)...), "corrupt snapshot record"},
		{"snapshot version", func(s *Store, nid types.StateSnapshotNID) packstore.ID { return snapshotRecordID(uint32(nid)) }, append([]byte{'S', 9}, make([]byte, 16)...), "corrupt snapshot record"},
		{"snapshot root missing", func(s *Store, nid types.StateSnapshotNID) packstore.ID { return snapshotRecordID(uint32(nid)) }, append([]byte{'S', 1}, make([]byte, 15)...), "corrupt snapshot record"},
		{"node garbage", nil, []byte("garbage"), "corrupt node"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			d, _ := s.BulkInsertStateData(ctx, nil, randomDelta(rand.New(rand.NewPCG(1, 2)), 40))
			nid, err := s.InsertState(ctx, nil, 1, types.StateBlockNIDs{d})
			if err != nil {
				t.Fatal(err)
			}
			coll := RoomCollection(1)
			var id packstore.ID
			if c.id != nil {
				id = c.id(s, nid)
			} else {
				_, root, _, _ := s.locate(ctx, nil, nid)
				id = packstore.ID(root)
			}
			if err := s.eng.Put(coll, id, c.data); err != nil {
				t.Fatal(err)
			}
			s.roots.Purge()
			s.entries.Purge()
			_, err1 := s.BulkSelectStateBlockNIDs(ctx, nil, []types.StateSnapshotNID{nid})
			_, err2 := s.BulkSelectStateBlockEntries(ctx, nil, types.StateBlockNIDs{types.StateBlockNID(nid)})
			_, err3 := s.State(nid)
			for i, err := range []error{err1, err2, err3} {
				if c.id == nil && i == 0 {
					continue // the block list does not read nodes
				}
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Errorf("call %d: err %v, want %q", i, err, c.want)
				}
			}
		})
	}
}

// TestGroupCommit: concurrent writers in different rooms share syncs, and every
// NID they get back names the state they wrote.
func TestGroupCommit(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const writers, each = 8, 40
	// A sync as slow as a disk's fsync, so that writers queue behind it.
	s.commit.sync = func() error { time.Sleep(3 * time.Millisecond); return s.eng.Sync() }
	before := s.Syncs()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(room types.RoomNID) {
			defer wg.Done()
			var prev types.StateBlockNIDs
			for i := 0; i < each; i++ {
				e := types.StateEntry{StateKeyTuple: types.StateKeyTuple{EventTypeNID: 2, EventStateKeyNID: types.EventStateKeyNID(i + 1)}, EventNID: types.EventNID(i + 1)}
				d, _ := s.BulkInsertStateData(ctx, nil, types.StateEntries{e})
				nid, err := s.InsertState(ctx, nil, room, append(prev, d))
				if err != nil {
					errs <- err
					return
				}
				st, err := s.State(nid)
				if err != nil || len(st) != i+1 {
					errs <- fmt.Errorf("room %d step %d: %d entries, %v", room, i, len(st), err)
					return
				}
				prev = types.StateBlockNIDs{types.StateBlockNID(nid)}
			}
		}(types.RoomNID(w + 1))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	syncs := s.Syncs() - before
	t.Logf("%d snapshots, %d syncs", writers*each, syncs)
	if syncs >= writers*each {
		t.Fatalf("%d syncs for %d snapshots: no group commit", syncs, writers*each)
	}
}

// TestCrashProcess: a child process writes snapshots and prints each NID once
// InsertState returned it; the parent SIGKILLs it at a random moment, reopens the
// store, and every printed NID must name the state the child wrote (durable before
// handed out), and no NID may be handed out twice after the restart.
func TestCrashProcess(t *testing.T) {
	if os.Getenv("STATETABLES_CHILD") != "" {
		crashChild()
		return
	}
	rng := rand.New(rand.NewPCG(seed(t), 3))
	dir := t.TempDir()
	printed := map[types.StateSnapshotNID]int{}
	for round := 0; round < 3; round++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashProcess$")
		cmd.Env = append(os.Environ(), "STATETABLES_CHILD="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		killAfter := 20 + rng.IntN(200)
		sc := bufio.NewScanner(out)
		n := 0
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 3 || f[0] != "nid" {
				continue
			}
			nid, _ := strconv.ParseInt(f[1], 10, 64)
			step, _ := strconv.Atoi(f[2])
			if old, ok := printed[types.StateSnapshotNID(nid)]; ok && old != step {
				t.Fatalf("round %d: NID %d handed out for step %d and step %d", round, nid, old, step)
			}
			printed[types.StateSnapshotNID(nid)] = step
			if n++; n == killAfter {
				_ = cmd.Process.Signal(syscall.SIGKILL)
				break
			}
		}
		_ = cmd.Wait()
		s, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		for nid, step := range printed {
			st, err := s.State(nid)
			if err != nil {
				t.Fatalf("round %d: NID %d (step %d) lost: %v", round, nid, step, err)
			}
			if len(st) != 1 || st[0].EventNID != types.EventNID(step) {
				t.Fatalf("round %d: NID %d: state %v, want event %d", round, nid, st, step)
			}
		}
		_ = s.Close()
		t.Logf("round %d: killed after %d NIDs; %d NIDs checked", round, n, len(printed))
	}
}

func crashChild() {
	s, err := Open(os.Getenv("STATETABLES_CHILD"))
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	base := time.Now().UnixNano() % 1000000 * 1000
	for i := 1; ; i++ {
		step := int(base) + i
		d, _ := s.BulkInsertStateData(ctx, nil, types.StateEntries{{StateKeyTuple: types.StateKeyTuple{EventTypeNID: 1, EventStateKeyNID: 1}, EventNID: types.EventNID(step)}})
		nid, err := s.InsertState(ctx, nil, types.RoomNID(1+i%3), types.StateBlockNIDs{d})
		if err != nil {
			fmt.Println("insert:", err)
			os.Exit(1)
		}
		fmt.Printf("nid %d %d\n", nid, step)
	}
}

func TestDirFor(t *testing.T) {
	t.Setenv(EnvBase, "/base")
	for _, c := range []struct{ got, want string }{
		{postgresDir("127.0.0.1", "5432", "dendrite"), "/base/pg-127.0.0.1-5432-dendrite"},
		{postgresDir("", "", "rs"), "/base/pg-local--rs"},
		{postgresDir("::1", "15000", "a b;c"), "/base/pg-_1-15000-a_b_c"},
	} {
		if c.got != c.want {
			t.Errorf("%q, want %q", c.got, c.want)
		}
	}
	if d, err := sqliteDir("/data/roomserver.db"); err != nil || d != "/data/roomserver.db.mtxdb-state" {
		t.Errorf("sqlite: %q, %v", d, err)
	}
	if _, err := sqliteDir(""); err == nil || !strings.Contains(err.Error(), EnvDir) {
		t.Errorf("in-memory sqlite: %v", err)
	}
	t.Setenv(EnvDir, "/explicit")
	if got, err := DirFor(context.Background(), nil, true); err != nil || got != "/explicit" {
		t.Errorf("%s: %q, %v", EnvDir, got, err)
	}
}

// TestPostgresTwoStores: two Stores on one database (two processes, or Dendrite
// opening it twice) write snapshots of the same rooms, concurrently and with a
// lease taken by the other between a Store's read of the lease record and its
// compare-and-set: every NID is handed out once, and each Store reads the other's.
func TestPostgresTwoStores(t *testing.T) {
	db := pgDB(t)
	a, err := OpenPostgres(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	b, err := OpenPostgres(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	// The first lease of room 1 by a loses to b's, taken in between.
	raced := false
	leaseHook = func() {
		if raced {
			return
		}
		raced = true
		d, _ := b.BulkInsertStateData(ctx, nil, types.StateEntries{{StateKeyTuple: types.StateKeyTuple{EventTypeNID: 1, EventStateKeyNID: 1}, EventNID: 1}})
		if _, err := b.InsertState(ctx, nil, 1, types.StateBlockNIDs{d}); err != nil {
			t.Error(err)
		}
	}
	d, _ := a.BulkInsertStateData(ctx, nil, types.StateEntries{{StateKeyTuple: types.StateKeyTuple{EventTypeNID: 1, EventStateKeyNID: 1}, EventNID: 2}})
	first, err := a.InsertState(ctx, nil, 1, types.StateBlockNIDs{d})
	leaseHook = nil
	if err != nil || !raced {
		t.Fatalf("InsertState after a lost lease race: %d, %v (raced %v)", first, err, raced)
	}
	if _, seq := splitNID(int64(first)); seq != 1+LeaseStep {
		t.Fatalf("the Store that lost the lease race got seq %d, want %d (the range after the winner's)", seq, 1+LeaseStep)
	}
	type result struct {
		nid  types.StateSnapshotNID
		want types.EventNID
	}
	var mu sync.Mutex
	var results []result
	var wg sync.WaitGroup
	for w, s := range []*Store{a, b, a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				ev := types.EventNID(1000*(w+1) + i)
				room := types.RoomNID(1 + i%3)
				d, _ := s.BulkInsertStateData(ctx, nil, types.StateEntries{{StateKeyTuple: types.StateKeyTuple{EventTypeNID: 2, EventStateKeyNID: 2}, EventNID: ev}})
				nid, err := s.InsertState(ctx, nil, room, types.StateBlockNIDs{d})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				results = append(results, result{nid, ev})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	seen := map[types.StateSnapshotNID]bool{}
	for _, r := range results {
		if seen[r.nid] {
			t.Fatalf("NID %d handed out twice", r.nid)
		}
		seen[r.nid] = true
		for _, s := range []*Store{a, b} {
			st, err := s.State(r.nid)
			if err != nil || len(st) != 1 || st[0].EventNID != r.want {
				t.Fatalf("NID %d: state %v, %v; want event %d", r.nid, st, err, r.want)
			}
		}
	}
	if len(results) != 400 {
		t.Fatalf("%d snapshots, want 400", len(results))
	}
}

// TestPostgresPurgeInTransaction: on PostgreSQL a room's purge runs in Dendrite's
// purge transaction: rolled back, the room's snapshots stay; committed, they are
// gone and the room's next NID is above every earlier one.
func TestPostgresPurgeInTransaction(t *testing.T) {
	db := pgDB(t)
	s, err := OpenPostgres(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := s.BulkInsertStateData(ctx, nil, types.StateEntries{{StateKeyTuple: types.StateKeyTuple{EventTypeNID: 1, EventStateKeyNID: 1}, EventNID: 5}})
	nid, err := s.InsertState(ctx, nil, 3, types.StateBlockNIDs{d})
	if err != nil {
		t.Fatal(err)
	}
	for _, commit := range []bool{false, true} {
		txn, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.PurgeRoom(ctx, txn, 3); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = txn.Commit()
		} else {
			err = txn.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.State(nid)
		var missing types.MissingStateError
		if commit != errors.As(err, &missing) {
			t.Fatalf("purge committed=%v: State(%d) err %v", commit, nid, err)
		}
	}
	other := s.at(ctx, nil)
	if b, err := other.Get(RoomCollection(3), leaseRecordID); err != nil || len(b) == 0 {
		t.Fatalf("the purge did not keep the lease record: %v", err)
	}
	again, err := OpenPostgres(ctx, db) // a fresh Store: its NIDs come from the lease record
	if err != nil {
		t.Fatal(err)
	}
	d, _ = again.BulkInsertStateData(ctx, nil, types.StateEntries{{StateKeyTuple: types.StateKeyTuple{EventTypeNID: 1, EventStateKeyNID: 1}, EventNID: 5}})
	nid2, err := again.InsertState(ctx, nil, 3, types.StateBlockNIDs{d})
	if err != nil || nid2 <= nid {
		t.Fatalf("after the purge: NID %d, %v; want above %d", nid2, err, nid)
	}
}

// TestPostgresStoreLeftInDirectory: a PostgreSQL database with no mtxdb state
// whose store directory of earlier versions exists is refused, naming the
// directory and the variable that keeps it; once the database has state, or
// without the directory, it is not.
func TestPostgresStoreLeftInDirectory(t *testing.T) {
	db := pgDB(t)
	t.Setenv(EnvBase, t.TempDir())
	t.Setenv(EnvDir, "")
	s, err := OpenPostgres(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkNoDirectory(ctx, db, s); err != nil {
		t.Fatalf("no directory: %v", err)
	}
	dir, err := DirFor(ctx, db, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	err = checkNoDirectory(ctx, db, s)
	if !errors.Is(err, ErrStoreInDirectory) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), EnvDir) {
		t.Fatalf("directory left: %v", err)
	}
	if _, err := s.InsertState(ctx, nil, 1, nil); err != nil {
		t.Fatal(err)
	}
	if err := checkNoDirectory(ctx, db, s); err != nil {
		t.Fatalf("database with state: %v", err)
	}
}

// TestPostgresRolledBackTransaction: a snapshot written in a Dendrite transaction
// (lib/pq) is visible inside it, invisible outside it until it commits, and gone
// with a rollback; the same state stored afterwards gets another NID (a rolled-back
// NID is never handed out again), and a committed one stays after a reopen.
func TestPostgresRolledBackTransaction(t *testing.T) {
	db := pgDB(t)
	s, err := OpenPostgres(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	entries := types.StateEntries{{StateKeyTuple: types.StateKeyTuple{EventTypeNID: 1, EventStateKeyNID: 1}, EventNID: 42}}
	var missing types.MissingStateError
	insert := func(txn *sql.Tx) types.StateSnapshotNID {
		t.Helper()
		d, err := s.BulkInsertStateData(ctx, txn, entries)
		if err != nil {
			t.Fatal(err)
		}
		nid, err := s.InsertState(ctx, txn, 1, types.StateBlockNIDs{d})
		if err != nil {
			t.Fatal(err)
		}
		return nid
	}
	txn, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	rolled := insert(txn)
	if st, err := s.BulkSelectStateBlockEntries(ctx, txn, types.StateBlockNIDs{types.StateBlockNID(rolled)}); err != nil || len(st[0]) != 1 || st[0][0] != 42 {
		t.Fatalf("inside its transaction: %v, %v", st, err)
	}
	if _, err := s.BulkSelectStateBlockNIDs(ctx, nil, []types.StateSnapshotNID{rolled}); !errors.As(err, &missing) {
		t.Fatalf("outside its open transaction: err %v, want MissingStateError", err)
	}
	if err := txn.Rollback(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.State(rolled); !errors.As(err, &missing) {
		t.Fatalf("after the rollback: err %v, want MissingStateError", err)
	}
	committed := insert(nil)
	if committed == rolled {
		t.Fatalf("the rolled-back NID %d was handed out again", rolled)
	}
	again, err := OpenPostgres(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []*Store{s, again} {
		if got, err := st.State(committed); err != nil || len(got) != 1 || got[0].EventNID != 42 {
			t.Fatalf("committed NID %d: %v, %v", committed, got, err)
		}
		if _, err := st.State(rolled); !errors.As(err, &missing) {
			t.Fatalf("rolled-back NID %d: err %v, want MissingStateError", rolled, err)
		}
	}
}
