package repackplan_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
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
	"github.com/mtxdb/mtxdb/testrooms/gen"
)

// Tests of the every-k liveness policy. The room is generated (forks from
// delivery delays, rejected events), imported in topological order and replayed.

const everyK = 4

// genLines generates a room and returns its PDU lines in topological order.
func genLines(t *testing.T, seed uint64, events int) []string {
	t.Helper()
	opts := gen.DefaultOptions()
	opts.Seed, opts.Events, opts.Servers, opts.RoomVersion = seed, events, 4, "10"
	opts.BadRate = 0.1 // rejected messages: the rule must keep their state records
	dir := filepath.Join(t.TempDir(), "room")
	_, err := gen.Generate(opts, dir, nil)
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(dir, "events.jsonl"))
	require.NoError(t, err)
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// importLines imports PDU lines into the store and replays the room.
func importLines(t *testing.T, st *roomstate.Store, lines []string) (*roomstate.Room, resolver.ReplayResult) {
	ctx := t.Context()
	t.Helper()
	res, err := st.Import(ctx, strings.NewReader(strings.Join(lines, "\n")), "generated", roomstate.ImportOptions{})
	require.NoError(t, err)
	require.Len(t, res.Rooms, 1)
	room, err := st.Room(ctx, res.Rooms[0])
	require.NoError(t, err)
	rr, err := resolver.Replay(ctx, room, resolver.ReplayOptions{})
	require.NoError(t, err)
	return room, rr
}

func openDir(t *testing.T, dir string) *packstore.PackfileStorage {
	t.Helper()
	eng, _ := roomstatetest.Open(t, dir)
	return eng
}

// repackReopen repacks one room with a plan of opts, closes the store and opens it
// again (closed at cleanup).
func repackReopen(t *testing.T, eng *packstore.PackfileStorage, dir string, room *roomstate.Room, opts repackplan.Options) (*packstore.PackfileStorage, repackplan.Stats) {
	t.Helper()
	plan, stats, err := repackplan.Plan(t.Context(), room, opts)
	require.NoError(t, err)
	_, err = eng.Repack(packstore.RepackPlan{Collections: []packstore.CollectionPlan{plan}})
	require.NoError(t, err)
	require.NoError(t, eng.Close())
	eng = openDir(t, dir)
	t.Cleanup(func() { eng.Close() })
	return eng, stats
}

// keptByRule is the every-k rule written out independently of roomstate: forward
// extremities, state events, rejected events and arrival index % k == 0.
func keptByRule(m roomrecord.EventMeta, st roomrecord.EventState, fwd []string, k uint32) bool {
	return m.IsState || st.Rejected || m.Seq%k == 0 || slices.Contains(fwd, m.EventID)
}

// eventAnswer renders what a room answers about one event: metadata, PDU, and
// either its state record with the entries of both snapshots (read through
// StateBefore and StateAfter) or which named errors those queries returned.
func eventAnswer(t *testing.T, room *roomstate.Room, rd *hamtstore.Reader, id string) string {
	ctx := t.Context()
	t.Helper()
	m, err := room.Meta(id)
	require.NoError(t, err)
	js, err := room.EventJSON(id)
	require.NoError(t, err)
	head := fmt.Sprintf("%s %+v %x", id, m, js)
	st, ok, err := room.EventState(id)
	require.NoError(t, err)
	before, errB := room.StateBefore(id)
	after, errA := room.StateAfter(id)
	if !ok {
		return fmt.Sprintf("%s no state: before not kept %t, after not kept %t", head,
			errors.Is(errB, roomstate.ErrStateNotKept), errors.Is(errA, roomstate.ErrStateNotKept))
	}
	require.NoError(t, errB)
	require.NoError(t, errA)
	require.Equal(t, st.Before, before)
	require.Equal(t, st.After, after)
	entries := func(root hamtstore.NodeID) string {
		es, err := roomstatetest.Entries(ctx, room, rd, root)
		require.NoError(t, err)
		keys := make([]string, 0, len(es))
		for k, v := range es {
			keys = append(keys, k+"="+v)
		}
		sort.Strings(keys)
		return strings.Join(keys, ",")
	}
	return fmt.Sprintf("%s %t %q %x %x before[%s] after[%s]", head, st.Rejected, st.Reason, st.Before, st.After, entries(st.Before), entries(st.After))
}

func allAnswers(t *testing.T, room *roomstate.Room) map[string]string {
	t.Helper()
	ids, err := room.EventIDs()
	require.NoError(t, err)
	rd := room.NewReader()
	out := make(map[string]string, len(ids))
	for _, id := range ids {
		out[id] = eventAnswer(t, room, rd, id)
	}
	return out
}

// expectedLive computes the live set of an every-k plan from the room's records:
// room records, every PDU and metadata record, the state records the rule keeps, and
// every node reachable from their snapshots or the current state. It also returns
// the state records the rule drops and how many it keeps only because the event was
// rejected.
func expectedLive(t *testing.T, room *roomstate.Room, k uint32) (live, droppedStates map[packstore.ID]bool, keptRejected int) {
	t.Helper()
	live, droppedStates = map[packstore.ID]bool{}, map[packstore.ID]bool{}
	for _, id := range room.RoomRecords() {
		live[id] = true
	}
	rd := room.NewReader()
	reach := func(root hamtstore.NodeID) {
		if root == hamtstore.EmptyRoot {
			return
		}
		require.NoError(t, rd.Walk(root, func(n hamtstore.NodeID) (bool, error) {
			seen := live[packstore.ID(n)]
			live[packstore.ID(n)] = true
			return !seen, nil
		}))
	}
	reach(room.Head().CurrentState)
	fwd := room.Head().ForwardExtremities
	ids, err := room.EventIDs()
	require.NoError(t, err)
	for _, id := range ids {
		ev, meta, state := roomrecord.EventRecords(id)
		live[ev], live[meta] = true, true
		m, err := room.Meta(id)
		require.NoError(t, err)
		st, ok, err := room.EventState(id)
		require.NoError(t, err)
		require.True(t, ok, "generated room without outliers: %s has a state", id)
		if !keptByRule(m, st, fwd, k) {
			droppedStates[state] = true
			continue
		}
		if !keptByRule(m, roomrecord.EventState{}, fwd, k) {
			keptRejected++
		}
		live[state] = true
		reach(st.Before)
		reach(st.After)
	}
	return live, droppedStates, keptRejected
}

// TestEveryKPlanIsLiveSet: under every-k the plan holds every record of the
// independently computed live set exactly once and nothing else; what it leaves out
// are the dropped state records and nodes only dropped snapshots reach.
func TestEveryKPlanIsLiveSet(t *testing.T) {
	eng := packstore.NewMemStorage()
	room, _ := importLines(t, roomstate.New(eng), genLines(t, 7, 300))
	for _, kind := range repackplan.Kinds {
		t.Run(string(kind), func(t *testing.T) {
			plan, stats, err := repackplan.Plan(t.Context(), room, repackplan.Options{Kind: kind, Liveness: repackplan.EveryK, Every: everyK})
			require.NoError(t, err)
			require.Equal(t, uint32(everyK), room.Head().StateEvery, "Plan sets the keep rule on the head")
			live, dropped, keptRejected := expectedLive(t, room, everyK)
			require.Positive(t, keptRejected, "the room has rejected events the rule keeps only as rejected")
			seen := map[packstore.ID]bool{}
			for _, id := range plan.Records {
				require.False(t, seen[id], "record %x twice in the plan", id)
				require.True(t, live[id], "garbage record %x in the plan", id)
				seen[id] = true
			}
			require.Len(t, seen, len(live), "plan = live set")
			require.Equal(t, len(dropped), stats.StatesDropped)
			require.Greater(t, len(dropped), 100, "most of 300 events are dropped at k=%d", everyK)

			all, err := eng.CollectionRecords(roomrecord.CollectionID(room.ID()))
			require.NoError(t, err)
			nodesDropped := 0
			for _, id := range all {
				if !live[id] && !dropped[id] {
					nodesDropped++ // nothing else is stored: the room has no stray records
				}
			}
			require.Equal(t, len(all), len(live)+len(dropped)+nodesDropped)
			require.Positive(t, nodesDropped, "some snapshots (merges at dropped events) are garbage")
			t.Logf("%s: %d records live, %d state records and %d nodes garbage", kind, len(live), len(dropped), nodesDropped)
		})
	}
	// The rule may only grow to a multiple of its K.
	_, _, err := repackplan.Plan(t.Context(), room, repackplan.Options{Liveness: repackplan.EveryK, Every: everyK + 2})
	require.Error(t, err)
	_, _, err = repackplan.Plan(t.Context(), room, repackplan.Options{Liveness: repackplan.EveryK})
	require.ErrorIs(t, err, repackplan.ErrBadOptions)
	_, _, err = repackplan.Plan(t.Context(), room, repackplan.Options{Liveness: "some"})
	require.ErrorIs(t, err, repackplan.ErrBadOptions)
}

// TestEveryKRepackAnswers: after an every-k repack and a reopen, every kept event
// answers exactly as before the repack, every dropped one answers ErrStateNotKept to StateBefore
// and StateAfter, Check passes counting them, an incremental replay writes nothing,
// and the live bytes are fewer than after an all-snapshots repack of the same room.
func TestEveryKRepackAnswers(t *testing.T) {
	ctx := t.Context()
	lines := genLines(t, 11, 300)
	live := map[repackplan.Liveness]int64{}
	for _, lv := range repackplan.Livenesses {
		t.Run(string(lv), func(t *testing.T) {
			dir := t.TempDir()
			eng := openDir(t, dir)
			room, _ := importLines(t, roomstate.New(eng), lines)
			before := allAnswers(t, room)
			fwd := room.Head().ForwardExtremities
			keep := map[string]bool{}
			for id := range before {
				m, err := room.Meta(id)
				require.NoError(t, err)
				st, _, err := room.EventState(id)
				require.NoError(t, err)
				keep[id] = lv == repackplan.AllSnapshots || keptByRule(m, st, fwd, everyK)
			}
			current, err := roomstatetest.Entries(ctx, room, room.NewReader(), room.Head().CurrentState)
			require.NoError(t, err)

			eng, stats := repackReopen(t, eng, dir, room, repackplan.Options{Kind: repackplan.Mixed, Liveness: lv, Every: everyK})
			live[lv] = eng.Stats().LiveBytes
			room, err = roomstate.New(eng).Room(ctx, room.ID())
			require.NoError(t, err)
			after := allAnswers(t, room)
			notKept := 0
			for id, want := range before {
				if keep[id] {
					require.Equal(t, want, after[id], "kept event %s", id)
					continue
				}
				notKept++
				require.True(t, strings.HasSuffix(after[id], "no state: before not kept true, after not kept true"), after[id])
				require.Equal(t, strings.SplitN(want, " ", 2)[0], strings.SplitN(after[id], " ", 2)[0])
			}
			require.Equal(t, stats.StatesDropped, notKept)
			cur, err := roomstatetest.Entries(ctx, room, room.NewReader(), room.Head().CurrentState)
			require.NoError(t, err)
			require.Equal(t, current, cur)
			cr, err := room.Check(ctx, nil)
			require.NoError(t, err)
			require.Equal(t, notKept, cr.NotKept)
			rr, err := resolver.Replay(ctx, room, resolver.ReplayOptions{})
			require.NoError(t, err)
			require.Zero(t, rr.Computed)
			require.Equal(t, notKept, rr.NotKept)
			for _, w := range repackplan.WalkKinds {
				_, err := repackplan.Walk(ctx, room, w, 100, resolver.ResolveForwardExtremities)
				require.NoError(t, err, w)
			}
		})
	}
	t.Logf("live bytes after repack: all-snapshots %d, every-%d %d", live[repackplan.AllSnapshots], everyK, live[repackplan.EveryK])
	require.Less(t, live[repackplan.EveryK], live[repackplan.AllSnapshots])
}

// TestEveryKAppendAndForceReplay: a room repacked every-k at two thirds of its
// history takes the remaining events (some naming dropped events in prev_events) and
// replays to the same states as a room replayed whole; a forced replay writes every
// state record again and clears the keep rule.
func TestEveryKAppendAndForceReplay(t *testing.T) {
	ctx := t.Context()
	lines := genLines(t, 7, 300)
	whole, _ := importLines(t, roomstate.New(packstore.NewMemStorage()), lines)
	want := allAnswers(t, whole)

	dir := t.TempDir()
	eng := openDir(t, dir)
	room, _ := importLines(t, roomstate.New(eng), lines[:200])
	eng, stats := repackReopen(t, eng, dir, room, repackplan.Options{Liveness: repackplan.EveryK, Every: everyK})
	room, rr := importLines(t, roomstate.New(eng), lines[200:])
	require.Equal(t, stats.StatesDropped, rr.NotKept)
	require.Positive(t, rr.Rederived, "some new event names a dropped event in prev_events")

	got := allAnswers(t, room)
	for id, w := range want {
		if strings.Contains(got[id], " no state: ") {
			require.True(t, strings.HasSuffix(got[id], "before not kept true, after not kept true"), got[id])
			continue
		}
		require.Equal(t, w, got[id])
	}
	require.Equal(t, whole.Head().ForwardExtremities, room.Head().ForwardExtremities)
	require.Equal(t, whole.Head().CurrentState, room.Head().CurrentState)
	cr, err := room.Check(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, stats.StatesDropped, cr.NotKept)

	_, err = resolver.Replay(ctx, room, resolver.ReplayOptions{Force: true})
	require.NoError(t, err)
	require.Zero(t, room.Head().StateEvery)
	require.Equal(t, want, allAnswers(t, room))
	cr, err = room.Check(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, cr.NotKept)
}
