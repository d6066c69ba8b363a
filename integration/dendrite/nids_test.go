package dendrite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/matrix-org/dendrite/roomserver/types"
	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/pgstore"
	"github.com/mtxdb/mtxdb/pgstore/pgtest"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/roomstate/roomstatetest"
	"github.com/mtxdb/mtxdb/testrooms"
)

// TestNIDsStableAcrossReopen assigns NIDs over a real room in a packfile store,
// reopens it and requires every NID to come back the same, fixed NIDs to hold, and
// new NIDs not to reuse old ones.
func TestNIDsStableAcrossReopen(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	eng, st := roomstatetest.Open(t, dir)
	room, err := testrooms.ImportReplayed(eng, filepath.Join(testrooms.Dir(), "real", "room003"))
	require.NoError(t, err)
	roomID := room.ID()

	snapshot := func(st *roomstate.Store) (map[string]types.StateAtEvent, map[string]types.EventTypeNID, types.RoomInfo) {
		s, err := New(st)
		require.NoError(t, err)
		rs, info, err := s.Room(ctx, roomID)
		require.NoError(t, err)
		ids, err := rs.room.EventIDs()
		require.NoError(t, err)
		at, err := rs.StateAtEventIDs(context.Background(), ids)
		require.NoError(t, err)
		out := map[string]types.StateAtEvent{}
		for i, id := range ids {
			out[id] = at[i]
		}
		tn, err := rs.EventTypeNIDs(context.Background(), []string{"m.room.create", "m.room.member", "m.room.message", "m.room.name"})
		require.NoError(t, err)
		return out, tn, types.RoomInfo{RoomNID: info.RoomNID, RoomVersion: info.RoomVersion}
	}
	at1, tn1, info1 := snapshot(st)
	require.Equal(t, types.EventTypeNID(types.MRoomCreateNID), tn1["m.room.create"])
	require.Equal(t, types.EventTypeNID(types.MRoomMemberNID), tn1["m.room.member"])
	require.Greater(t, tn1["m.room.message"], types.EventTypeNID(types.MRoomHistoryVisibilityNID))
	require.NoError(t, eng.Sync())
	require.NoError(t, eng.Close())

	eng, st = roomstatetest.Open(t, dir)
	at2, tn2, info2 := snapshot(st)
	require.Equal(t, at1, at2)
	require.Equal(t, tn1, tn2)
	require.Equal(t, info1.RoomNID, info2.RoomNID)

	s, err := New(st)
	require.NoError(t, err)
	rs, _, err := s.Room(ctx, roomID)
	require.NoError(t, err)
	fresh, err := rs.EventTypeNIDs(context.Background(), []string{"x.new.type"})
	require.NoError(t, err)
	for _, n := range tn1 {
		require.NotEqual(t, n, fresh["x.new.type"])
	}
}

// TestNIDCounterNotReused simulates a batch that kept the forward and reverse
// records but lost the counter: the next assignment must skip the taken NID.
func TestNIDCounterNotReused(t *testing.T) {
	eng := packstore.NewMemStorage()
	tb := newTable(kindStateKey, 2)
	a, err := tb.get(eng, "@a:x")
	require.NoError(t, err)
	require.Equal(t, int64(2), a)
	require.NoError(t, eng.Put(nidCollection, counterID(kindStateKey), encodeNID(recCounter, 2)))

	tb = newTable(kindStateKey, 2)
	b, err := tb.get(eng, "@b:x")
	require.NoError(t, err)
	require.Equal(t, int64(3), b)
	name, err := newTable(kindStateKey, 2).name(eng, 2)
	require.NoError(t, err)
	require.Equal(t, "@a:x", name)
	_, err = newTable(kindStateKey, 2).name(eng, 99)
	require.ErrorIs(t, err, ErrUnknownNID)
}

// TestWrongRoomRefused: event and snapshot NIDs of one room are refused by another.
func TestWrongRoomRefused(t *testing.T) {
	ctx := t.Context()
	st := roomstate.New(packstore.NewMemStorage())
	for _, name := range []string{"room001", "room002"} {
		f, err := os.Open(filepath.Join(testrooms.Dir(), "real", name, "events.jsonl"))
		require.NoError(t, err)
		_, err = st.Import(ctx, f, name, roomstate.ImportOptions{})
		f.Close()
		require.NoError(t, err)
	}
	rooms, err := st.Rooms(ctx)
	require.NoError(t, err)
	require.Len(t, rooms, 2)
	for _, r := range rooms {
		_, err := resolver.Replay(ctx, r, resolver.ReplayOptions{})
		require.NoError(t, err)
	}
	s, err := New(st)
	require.NoError(t, err)
	a, infoA, err := s.Room(ctx, rooms[0].ID())
	require.NoError(t, err)
	b, _, err := s.Room(ctx, rooms[1].ID())
	require.NoError(t, err)
	_, err = b.StateBlockNIDs(context.Background(), []types.StateSnapshotNID{infoA.StateSnapshotNID()})
	require.ErrorIs(t, err, ErrWrongRoom)
	_, err = b.AddState(context.Background(), a.RoomNID(), nil, nil)
	require.ErrorIs(t, err, ErrWrongRoom)
	_, err = b.SnapshotNIDFromEventID(context.Background(), "$not-an-event")
	var missing types.MissingEventError
	require.ErrorAs(t, err, &missing)
}

// TestNIDsTwoProcessesPostgres: two Storages on one PostgreSQL database (two
// server processes) assign NIDs to overlapping names at once; every name gets one
// NID, no NID two names, and each Storage reads the other's (the counter is a
// compare-and-set on an engine several processes write). Without the
// compare-and-set both would hand out the counter's next NID to different names.
func TestNIDsTwoProcessesPostgres(t *testing.T) {
	url := pgtest.NewDatabase(t)
	var storages []*Storage
	for range 2 {
		eng, err := pgstore.Open(pgstore.Options{URL: url})
		require.NoError(t, err)
		t.Cleanup(func() { eng.Close() })
		s, err := New(roomstate.New(eng))
		require.NoError(t, err)
		storages = append(storages, s)
	}
	const names = 150
	got := make([]map[string]int64, 2)
	var wg sync.WaitGroup
	for w, s := range storages {
		got[w] = map[string]int64{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range names {
				if w == 1 {
					i = names - 1 - i // the other order: they meet in the middle
				}
				name := fmt.Sprintf("m.test.%d", i)
				nid, err := s.nid(kindEventType, name)
				if err != nil {
					t.Error(err)
					return
				}
				got[w][name] = nid
			}
		}()
	}
	wg.Wait()
	byNID := map[int64]string{}
	for i := range names {
		name := fmt.Sprintf("m.test.%d", i)
		a, b := got[0][name], got[1][name]
		require.Equal(t, a, b, "name %s has two NIDs", name)
		require.Greater(t, a, int64(types.MRoomHistoryVisibilityNID), "name %s", name)
		if other, ok := byNID[a]; ok {
			t.Fatalf("NID %d given to %s and %s", a, other, name)
		}
		byNID[a] = name
	}
	// A third Storage (a fresh process) reads them all the same and continues above.
	eng, err := pgstore.Open(pgstore.Options{URL: url})
	require.NoError(t, err)
	defer eng.Close()
	s3, err := New(roomstate.New(eng))
	require.NoError(t, err)
	for nid, name := range byNID {
		n, err := s3.nid(kindEventType, name)
		require.NoError(t, err)
		require.Equal(t, nid, n, name)
	}
	n, err := s3.nid(kindEventType, "m.test.new")
	require.NoError(t, err)
	_, taken := byNID[n]
	require.False(t, taken, "new name got the taken NID %d", n)
}
