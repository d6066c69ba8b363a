package repackplan_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/repackplan"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/roomstate/roomstatetest"
	"github.com/mtxdb/mtxdb/testrooms"
)

func importReplay(t *testing.T, eng packstore.StorageEngine, room string) *roomstate.Room {
	t.Helper()
	r, err := testrooms.ImportReplayed(eng, filepath.Join(testrooms.Dir(), "real", room))
	require.NoError(t, err)
	return r
}

// TestPlanCoversLiveRecordsOnce: for real rooms (a linear one, a v1 one with a fork,
// the union of seven branches), the plan lists every record of the room exactly once,
// places the newest event first, and leaves out a node no snapshot reaches; after the
// repack the room checks clean, the stray node is gone and nothing else is.
func TestPlanCoversLiveRecordsOnce(t *testing.T) {
	ctx := t.Context()
	for _, tc := range []struct {
		room string
		kind repackplan.Kind
	}{
		{"room001", repackplan.ReverseTopological}, {"room003", repackplan.ReverseTopological},
		{"room004_union", repackplan.ReverseTopological}, {"room004_union", repackplan.AuthChain},
		{"room004_union", repackplan.EdgesFirst}, {"room001", repackplan.EdgesFirst},
		{"room004_union", repackplan.Mixed}, {"room001", repackplan.Mixed}, {"room001", repackplan.AuthChain},
	} {
		name, kind := tc.room, tc.kind
		t.Run(name+"/"+string(kind), func(t *testing.T) {
			eng, _ := roomstatetest.Open(t, t.TempDir())
			room := importReplay(t, eng, name)

			// A snapshot nobody references: garbage.
			stray, err := room.StateWriter(false).Apply(ctx, hamtstore.EmptyRoot, map[roomrecord.StatePair]string{{Type: "stray"}: "$stray"}, nil)
			require.NoError(t, err)

			plan, stats, err := repackplan.Plan(t.Context(), room, repackplan.Options{Kind: kind})
			require.NoError(t, err)
			seen := map[packstore.ID]bool{}
			for _, id := range plan.Records {
				require.False(t, seen[id], "record %x twice in the plan", id)
				seen[id] = true
			}
			require.False(t, seen[packstore.ID(stray)], "garbage node in the plan")
			all, err := eng.CollectionRecords(roomrecord.CollectionID(room.ID()))
			require.NoError(t, err)
			require.Len(t, all, len(plan.Records)+1, "plan = every record but the stray node")
			for _, id := range all {
				require.True(t, seen[id] || id == packstore.ID(stray), "live record %x missing from the plan", id)
			}
			ids, err := room.EventIDs()
			require.NoError(t, err)
			require.Equal(t, len(ids), stats.Events)
			// The first event placed is a forward extremity: the walk starts there.
			evIDs := map[packstore.ID]string{}
			for _, id := range ids {
				ev, _, _ := roomrecord.EventRecords(id)
				evIDs[ev] = id
			}
			for _, rec := range plan.Records {
				if id, ok := evIDs[rec]; ok && kind != repackplan.EdgesFirst {
					require.Contains(t, room.Head().ForwardExtremities, id, "first event placed")
					break
				}
			}

			rs, err := eng.Repack(packstore.RepackPlan{Collections: []packstore.CollectionPlan{plan}})
			require.NoError(t, err)
			require.Equal(t, 1, rs.RecordsDropped)
			after, err := eng.CollectionRecords(roomrecord.CollectionID(room.ID()))
			require.NoError(t, err)
			require.Len(t, after, len(plan.Records))
			_, err = room.Check(ctx, nil)
			require.NoError(t, err)
		})
	}
}

// TestWalks runs every walk on a replayed real room with seven branches and checks
// what each must have visited.
func TestWalks(t *testing.T) {
	ctx := t.Context()
	room := importReplay(t, packstore.NewMemStorage(), "room004_union")
	ids, err := room.EventIDs()
	require.NoError(t, err)
	for _, k := range repackplan.WalkKinds {
		ws, err := repackplan.Walk(ctx, room, k, 50, resolver.ResolveForwardExtremities)
		require.NoError(t, err, k)
		switch k {
		case repackplan.WalkCurrentState:
			entries, err := roomstatetest.Entries(ctx, room, room.NewReader(), room.Head().CurrentState)
			require.NoError(t, err)
			require.Equal(t, len(entries), ws.PDUs)
			require.Positive(t, ws.Nodes)
		case repackplan.WalkAuthChain:
			require.Greater(t, ws.Events, 3)
			require.Less(t, ws.Events, len(ids))
		case repackplan.WalkBackfill:
			require.Equal(t, 50, ws.Events)
		case repackplan.WalkResolve:
			require.Greater(t, len(room.Head().ForwardExtremities), 1)
			require.Positive(t, ws.PDUs)
			require.Positive(t, ws.Nodes)
		}
	}
	_, err = repackplan.Walk(ctx, room, "nope", 0, nil)
	require.Error(t, err)
	_, err = repackplan.Walk(ctx, room, repackplan.WalkResolve, 0, nil)
	require.ErrorContains(t, err, "needs a ResolveFunc")
}

// TestPlanWithOutliers: a room imported in backfill order without its oldest events
// replays with outliers; a plan still covers every record and the repack keeps them.
func TestPlanWithOutliers(t *testing.T) {
	ctx := t.Context()
	b, err := os.ReadFile(filepath.Join(testrooms.Dir(), "real", "room002", "events.jsonl"))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	eng, st := roomstatetest.Open(t, t.TempDir())
	res, err := st.Import(ctx, strings.NewReader(strings.Join(lines[40:], "\n")), "partial",
		roomstate.ImportOptions{AnyOrder: true, RoomVersion: "10"})
	require.NoError(t, err)
	room, err := st.Room(ctx, res.Rooms[0])
	require.NoError(t, err)
	rr, err := resolver.Replay(ctx, room, resolver.ReplayOptions{})
	require.NoError(t, err)
	require.Positive(t, rr.Outliers)
	plan, _, err := repackplan.Plan(t.Context(), room, repackplan.Options{Kind: repackplan.ReverseTopological})
	require.NoError(t, err)
	all, err := eng.CollectionRecords(roomrecord.CollectionID(room.ID()))
	require.NoError(t, err)
	require.Len(t, plan.Records, len(all))
	_, err = eng.Repack(packstore.RepackPlan{Collections: []packstore.CollectionPlan{plan}})
	require.NoError(t, err)
	_, err = room.Check(ctx, nil)
	require.NoError(t, err)
}
