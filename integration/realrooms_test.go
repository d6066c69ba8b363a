package integration

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/repackplan"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/roomstate/roomstatetest"
	"github.com/mtxdb/mtxdb/testrooms"
)

// TestRealRoomsReplay imports every real room into one shared packfile store (as a
// server holds many rooms in one pool), replays each through state resolution and
// requires the state after every event, the forward extremities and the current state
// to equal what the origin server recorded. Then it repacks all rooms through one
// output stream, reopens the store and checks everything again from disk.
func TestRealRoomsReplay(t *testing.T) {
	ctx := t.Context()
	dirs, err := recorded.RoomDirs(filepath.Join(testrooms.Dir(), "real"))
	require.NoError(t, err)
	require.Len(t, dirs, 190, "bundled real rooms")

	storeDir := t.TempDir()
	eng, st := roomstatetest.Open(t, storeDir)

	exps := map[string][]*recorded.Expected{}
	events := 0
	for _, d := range dirs {
		exp, err := recorded.Load(d)
		require.NoError(t, err, d)
		exps[exp.RoomID] = append(exps[exp.RoomID], exp)
		f, err := os.Open(filepath.Join(d, "events.jsonl"))
		require.NoError(t, err)
		res, err := st.Import(ctx, f, d, roomstate.ImportOptions{})
		f.Close()
		require.NoError(t, err, d)
		events += res.Read
	}
	require.Equal(t, 3639, events, "PDUs in the bundled rooms")

	rooms, err := st.Rooms(ctx)
	require.NoError(t, err)
	for _, r := range rooms {
		_, err := resolver.Replay(ctx, r, resolver.ReplayOptions{})
		require.NoError(t, err, r.ID())
	}

	compareAll := func(stage string, rooms []*roomstate.Room) {
		t.Helper()
		compared := 0
		for _, r := range rooms {
			_, err := r.Check(ctx, nil)
			require.NoError(t, err, "%s: check %s", stage, r.ID())
			for _, exp := range exps[r.ID()] {
				res, err := recorded.Compare(ctx, r, exp, func(m recorded.Mismatch) {
					t.Errorf("%s: %s (%s)", stage, m, filepath.Base(exp.Dir))
				})
				require.NoError(t, err, exp.Dir)
				compared += res.Events
			}
		}
		require.Equal(t, 3639, compared, "%s: events compared", stage)
	}
	compareAll("after replay", rooms)

	var plan packstore.RepackPlan
	for _, r := range rooms {
		cp, _, err := repackplan.Plan(t.Context(), r, repackplan.Options{Kind: repackplan.ReverseTopological})
		require.NoError(t, err, r.ID())
		plan.Collections = append(plan.Collections, cp)
	}
	_, err = eng.Repack(plan)
	require.NoError(t, err)
	require.NoError(t, eng.Close())

	_, st = roomstatetest.Open(t, storeDir)
	rooms, err = st.Rooms(ctx)
	require.NoError(t, err)
	compareAll("after repack and reopen", rooms)
}
