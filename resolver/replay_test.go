package resolver_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomrecord"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/roomstate/roomstatetest"
	"github.com/mtxdb/mtxdb/testrooms"
)

// importLines returns a function importing PDU lines of one room into st and
// returning the room.
func importLines(t *testing.T, st *roomstate.Store) func([]string) *roomstate.Room {
	return func(ls []string) *roomstate.Room {
		t.Helper()
		res, err := st.Import(t.Context(), strings.NewReader(strings.Join(ls, "\n")), "part", roomstate.ImportOptions{})
		require.NoError(t, err)
		room, err := st.Room(t.Context(), res.Rooms[0])
		require.NoError(t, err)
		return room
	}
}

// TestReplayIncremental: replay after a partial import computes those events; a second
// replay writes nothing; importing the rest and replaying computes only the new
// events, with the same final state as one replay of the whole room; Force
// recomputes all and changes no snapshot.
func TestReplayIncremental(t *testing.T) {
	ctx := t.Context()
	dir := filepath.Join(testrooms.Dir(), "real", "room004_union")
	lines, exp := realRoomLines(t, "room004_union")
	require.Greater(t, len(lines), 150)

	eng, st := roomstatetest.Open(t, t.TempDir())
	imp := importLines(t, st)
	room := imp(lines[:100])
	res, err := resolver.Replay(ctx, room, resolver.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, 100, res.Computed)

	require.NoError(t, eng.Sync())
	bytes := eng.Stats().DiskBytes
	res, err = resolver.Replay(ctx, room, resolver.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, 0, res.Computed)
	require.NoError(t, eng.Sync())
	require.Equal(t, bytes, eng.Stats().DiskBytes, "a second replay wrote something")

	room = imp(lines)
	res, err = resolver.Replay(ctx, room, resolver.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, len(lines)-100, res.Computed)
	incremental := room.Head()

	whole := replayedRoom(t, dir)
	require.Equal(t, whole.Head().CurrentState, incremental.CurrentState)
	require.Equal(t, whole.Head().ForwardExtremities, incremental.ForwardExtremities)

	res, err = resolver.Replay(ctx, room, resolver.ReplayOptions{Force: true})
	require.NoError(t, err)
	require.Equal(t, len(lines), res.Computed)
	require.Equal(t, incremental.CurrentState, room.Head().CurrentState)
	cr, err := recorded.Compare(ctx, room, exp, func(m recorded.Mismatch) { t.Error(m) })
	require.NoError(t, err)
	require.Equal(t, len(exp.After), cr.Events)
}

// TestReplayBackfillOrder imports a real room newest first (as a backfilling server
// stores it; AnyOrder, room version given), replays in topological order and matches
// the recorded state; with its oldest events never imported, the rest are outliers.
func TestReplayBackfillOrder(t *testing.T) {
	ctx := t.Context()
	dir := filepath.Join(testrooms.Dir(), "real", "room004_union")
	b, err := os.ReadFile(filepath.Join(dir, "events.jsonl"))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	rev := make([]string, len(lines))
	for i, l := range lines {
		rev[len(lines)-1-i] = l
	}
	exp, err := recorded.Load(dir)
	require.NoError(t, err)

	st := roomstate.New(packstore.NewMemStorage())
	_, err = st.Import(ctx, strings.NewReader(strings.Join(rev, "\n")), "reversed", roomstate.ImportOptions{})
	require.ErrorIs(t, err, roomstate.ErrNoCreateEvent, "without AnyOrder a backfill is refused")
	res, err := st.Import(ctx, strings.NewReader(strings.Join(rev, "\n")), "reversed",
		roomstate.ImportOptions{AnyOrder: true, RoomVersion: "5"})
	require.NoError(t, err)
	room, err := st.Room(ctx, res.Rooms[0])
	require.NoError(t, err)
	rr, err := resolver.Replay(ctx, room, resolver.ReplayOptions{})
	require.NoError(t, err)
	require.Zero(t, rr.Outliers)
	cr, err := recorded.Compare(ctx, room, exp, func(m recorded.Mismatch) { t.Error(m) })
	require.NoError(t, err)
	require.Equal(t, len(exp.After), cr.Events)
	_, err = room.Check(ctx, nil)
	require.NoError(t, err)

	// Without the first 3 events nothing can be replayed: everything descends from them.
	st = roomstate.New(packstore.NewMemStorage())
	res, err = st.Import(ctx, strings.NewReader(strings.Join(rev[:len(rev)-3], "\n")), "partial",
		roomstate.ImportOptions{AnyOrder: true, RoomVersion: "5"})
	require.NoError(t, err)
	room, err = st.Room(ctx, res.Rooms[0])
	require.NoError(t, err)
	rr, err = resolver.Replay(ctx, room, resolver.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, len(rev)-3, rr.Outliers)
	ck, err := room.Check(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, len(rev)-3, ck.Dangling)
}

// TestReplayCorruptMeta: replay does not read metadata records, so a damaged one
// (that does not decode, or that names other prev_events than the graph record)
// changes nothing it computes; Room.Check (mtxdb verify) reports it, naming the
// event.
func TestReplayCorruptMeta(t *testing.T) {
	ctx := t.Context()
	lines, _ := realRoomLines(t, "room003")
	require.Len(t, lines, 212)
	eng := packstore.NewMemStorage()
	st := roomstate.New(eng)
	room := importLines(t, st)(lines)
	ids, err := room.EventIDs()
	require.NoError(t, err)
	_, err = resolver.Replay(ctx, room, resolver.ReplayOptions{})
	require.NoError(t, err)
	clean := room.Head().CurrentState
	coll := roomrecord.CollectionID(room.ID())
	rid := roomrecord.MetaRecordID(roomrecord.EventRecordID(ids[100]))
	good, err := eng.Get(coll, rid)
	require.NoError(t, err)
	otherPrev := func() []byte {
		m, err := roomrecord.DecodeMeta(good)
		require.NoError(t, err)
		require.NotEmpty(t, m.PrevEvents)
		m.PrevEvents = []string{ids[0]}
		return roomrecord.EncodeMeta(&m)
	}
	for _, bad := range [][]byte{good[:len(good)/2], otherPrev()} {
		require.NoError(t, eng.PutMany(coll, []packstore.Record{{ID: rid, Data: bad}}))
		res, err := resolver.Replay(ctx, room, resolver.ReplayOptions{Force: true})
		require.NoError(t, err)
		require.Equal(t, len(lines), res.Computed)
		require.Equal(t, clean, room.Head().CurrentState)
		_, err = room.Check(ctx, nil)
		require.ErrorIs(t, err, roomrecord.ErrCorruptRecord)
		require.Contains(t, err.Error(), "event "+ids[100])
	}
}

// syncCounter counts the engine's syncs.
type syncCounter struct {
	packstore.StorageEngine
	syncs int
}

func (s *syncCounter) Sync() error { s.syncs++; return s.StorageEngine.Sync() }

// TestReplayCommitsAlongTheWay: a replay commits (syncs the store) every
// replayCommitEvery state records, not only at its end.
func TestReplayCommitsAlongTheWay(t *testing.T) {
	defer resolver.SetReplayCommitEvery(50)()
	lines, _ := realRoomLines(t, "room003")
	eng := &syncCounter{StorageEngine: packstore.NewMemStorage()}
	room := importLines(t, roomstate.New(eng))(lines)
	before := eng.syncs
	res, err := resolver.Replay(t.Context(), room, resolver.WithBatchSize(resolver.ReplayOptions{}, 10))
	require.NoError(t, err)
	require.Equal(t, len(lines), res.Computed)
	// 212 records in batches of 10: commits after 50, 100, 150 and 200, then the
	// final one.
	require.Equal(t, 5, eng.syncs-before, "syncs of a 212-event replay")
}
