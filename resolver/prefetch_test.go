package resolver_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/testrooms"
	"github.com/mtxdb/mtxdb/testrooms/gen"
)

// TestReplayAuthAhead: a replay whose checks of events against their own auth
// events run ahead on the prefetching goroutine writes the same state record
// for every event (states before and after, rejection and its reason) as one
// that makes every check itself, on a generated v12 room with rejections (most
// of its checks made ahead) and on a real v1 room.
func TestReplayAuthAhead(t *testing.T) {
	genDir := t.TempDir()
	opts := gen.DefaultOptions()
	opts.Seed, opts.Events, opts.Servers, opts.RoomVersion = 5, 3000, 4, "12"
	_, err := gen.Generate(opts, genDir, nil)
	require.NoError(t, err)
	for _, dir := range []string{genDir, filepath.Join(testrooms.Dir(), "real", "room003")} {
		replayWith := func(ahead bool) (*roomstate.Room, resolver.ReplayResult) {
			defer resolver.SetAheadAuth(ahead)()
			f, err := os.Open(filepath.Join(dir, "events.jsonl"))
			require.NoError(t, err)
			defer f.Close()
			st := roomstate.New(packstore.NewMemStorage())
			imp, err := st.Import(t.Context(), f, dir, roomstate.ImportOptions{})
			require.NoError(t, err)
			room, err := st.Room(t.Context(), imp.Rooms[0])
			require.NoError(t, err)
			res, err := resolver.Replay(t.Context(), room, resolver.ReplayOptions{})
			require.NoError(t, err)
			return room, res
		}
		with, resWith := replayWith(true)
		without, resWithout := replayWith(false)
		// With a members cache of 8 the prefetcher checks ahead with the
		// eventHeads of the member events it let go: as many checks, the same
		// records.
		restore := resolver.SetPrefetchMembers(8)
		small, resSmall := replayWith(true)
		restore()
		require.GreaterOrEqual(t, resSmall.AuthAhead, resWith.AuthAhead*9/10, "%s: checks ahead with 8 member events parsed", dir)
		require.Zero(t, resWithout.AuthAhead)
		require.Positive(t, resWith.AuthAhead, "%s: checks made ahead", dir)
		require.Equal(t, resWithout.Rejected, resWith.Rejected)
		require.Equal(t, resWith.Events, resWith.EventsLoaded, "%s: each PDU parsed once", dir)
		if dir == genDir {
			// Its plain events share few checks (senders and auth events vary).
			require.Greater(t, resWith.AuthAhead, resWith.Events/2, "checks made ahead")
			require.Positive(t, resWith.Rejected, "the generated room has rejections")
		}
		t.Logf("%s: %d events, %d checked ahead, %d rejected", filepath.Base(dir), resWith.Events, resWith.AuthAhead, resWith.Rejected)
		ids, err := with.EventIDs()
		require.NoError(t, err)
		for _, id := range ids {
			a, okA, err := with.EventState(id)
			require.NoError(t, err)
			b, okB, err := without.EventState(id)
			require.NoError(t, err)
			require.Equal(t, okB, okA, "%s: event %s", dir, id)
			require.Equal(t, b, a, "%s: event %s", dir, id)
			c, okC, err := small.EventState(id)
			require.NoError(t, err)
			require.Equal(t, okB, okC, "%s: event %s", dir, id)
			require.Equal(t, b, c, "%s: event %s, members cache of 8", dir, id)
		}
		require.Equal(t, without.Head().CurrentState, with.Head().CurrentState)
		require.Equal(t, without.Head().CurrentState, small.Head().CurrentState)
	}
}
