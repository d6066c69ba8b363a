package repackplan_test

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/repackplan"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/roomstate/roomstatetest"
	"github.com/mtxdb/mtxdb/testrooms"
	"github.com/mtxdb/mtxdb/testrooms/gen"
)

// answers renders everything a room answers (events, edges, PDUs, states before and
// after every event, head) as text, so two stores can be compared whole.
func answers(t *testing.T, room *roomstate.Room) string {
	ctx := t.Context()
	t.Helper()
	var b strings.Builder
	h := room.Head()
	fmt.Fprintf(&b, "head %s %s %d %t %x %v\n", h.RoomID, h.RoomVersion, h.Events, h.Replayed, h.CurrentState, h.ForwardExtremities)
	ids, err := room.EventIDs()
	require.NoError(t, err)
	rd := room.NewReader()
	for _, id := range ids {
		m, err := room.Meta(id)
		require.NoError(t, err)
		js, err := room.EventJSON(id)
		require.NoError(t, err)
		st, ok, err := room.EventState(id)
		require.NoError(t, err)
		require.True(t, ok)
		after, err := roomstatetest.Entries(ctx, room, rd, st.After)
		require.NoError(t, err)
		keys := make([]string, 0, len(after))
		for k, v := range after {
			keys = append(keys, k+"="+v)
		}
		sort.Strings(keys)
		fmt.Fprintf(&b, "%s %+v %d %t %x %x %s\n", id, m, len(js), st.Rejected, st.Before, st.After, strings.Join(keys, ","))
	}
	return b.String()
}

// TestRepackAnswersUnchanged: generated rooms (forks, rejections; versions 10 and 12)
// answer every query the same after a repack with each plan kind and a reopen.
func TestRepackAnswersUnchanged(t *testing.T) {
	ctx := t.Context()
	for _, rv := range []string{"10", "12"} {
		opts := gen.DefaultOptions()
		opts.Seed, opts.Events, opts.Servers, opts.RoomVersion = 7, 300, 4, rv
		dir := filepath.Join(t.TempDir(), "room")
		_, err := gen.Generate(opts, dir, nil)
		require.NoError(t, err)
		for _, kind := range repackplan.Kinds {
			t.Run(rv+"/"+string(kind), func(t *testing.T) {
				storeDir := t.TempDir()
				eng, _ := roomstatetest.Open(t, storeDir)
				room, err := testrooms.ImportReplayed(eng, dir)
				require.NoError(t, err)
				before := answers(t, room)

				plan, _, err := repackplan.Plan(t.Context(), room, repackplan.Options{Kind: kind})
				require.NoError(t, err)
				_, err = eng.Repack(packstore.RepackPlan{Collections: []packstore.CollectionPlan{plan}})
				require.NoError(t, err)
				require.NoError(t, eng.Close())

				_, st := roomstatetest.Open(t, storeDir)
				room, err = st.Room(ctx, room.ID())
				require.NoError(t, err)
				require.Equal(t, before, answers(t, room))
				_, err = room.Check(ctx, nil)
				require.NoError(t, err)
			})
		}
	}
}
