package resolver_test

import (
	"math"
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
	genDir := generatedV12Room(t, 5, 3000)
	for _, dir := range []string{genDir, filepath.Join(testrooms.Dir(), "real", "room003")} {
		replayWith := func(ahead bool) (*roomstate.Room, resolver.ReplayResult) {
			defer resolver.SetAheadAuth(ahead)()
			return replayInMemory(t, dir)
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
		requireSameRecords(t, dir, without, with)
		requireSameRecords(t, dir+", members cache of 8", without, small)
	}
}

// TestReplayBoundByPrevs: a replay whose resolutions leave out the auth
// children replayed after the event's last prev event (prevsBound) writes the
// same state record for every event, and the same current state, as one that
// leaves out only those not replayed yet, on a generated v12 room of four
// servers and on a real v5 room. The test fails if the bound was never below
// the replay position.
func TestReplayBoundByPrevs(t *testing.T) {
	genDir := generatedV12Room(t, 7, 2000)
	for _, dir := range []string{genDir, filepath.Join(testrooms.Dir(), "real", "room004_union")} {
		with, n := replayWith(t, dir, resolver.SetBoundByPrevs, true)
		without, _ := replayWith(t, dir, resolver.SetBoundByPrevs, false)
		require.Positive(t, n, "%s: the bound was never below the replay position", dir)
		requireSameRecords(t, dir, without, with)
		t.Logf("%s: bound lowered for %d events", filepath.Base(dir), n)
	}
}

// TestReplayFarCursor: a replay whose state cursors never move (every move
// is more than cursorMoveMax keys, 0; a cursor is still built once, from the
// empty snapshot) reads the snapshots from the HAMT and writes the same state
// record for every event, and the same current state, as one whose cursors
// always move, on a generated v12 room of four servers and on a real v5 room.
// It fails if no move was given up.
func TestReplayFarCursor(t *testing.T) {
	genDir := generatedV12Room(t, 7, 2000)
	for _, dir := range []string{genDir, filepath.Join(testrooms.Dir(), "real", "room004_union")} {
		always, n := replayWith(t, dir, resolver.SetCursorMoveMax, math.MaxInt)
		require.Zero(t, n, "%s: a move was given up without a bound", dir)
		never, n := replayWith(t, dir, resolver.SetCursorMoveMax, 0)
		require.Positive(t, n, "%s: no cursor move was given up", dir)
		requireSameRecords(t, dir, always, never)
		t.Logf("%s: %d cursor moves given up", filepath.Base(dir), n)
	}
}

// replayWith replays dir in memory (replayInMemory) with a setting made by set
// (one of the resolver's Set functions, restored after), and returns the room
// and how much the setting's counter grew during the replay.
func replayWith[T any](t *testing.T, dir string, set func(T) (counter func() int64, restore func()), v T) (*roomstate.Room, int64) {
	t.Helper()
	counter, restore := set(v)
	defer restore()
	before := counter()
	room, _ := replayInMemory(t, dir)
	return room, counter() - before
}

// replayInMemory imports the room of dir into an in-memory store and replays it.
func replayInMemory(t *testing.T, dir string) (*roomstate.Room, resolver.ReplayResult) {
	t.Helper()
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

// requireSameRecords fails unless got has the state record of want for every
// event (states before and after, rejection and its reason) and its current
// state.
func requireSameRecords(t *testing.T, what string, want, got *roomstate.Room) {
	t.Helper()
	ids, err := want.EventIDs()
	require.NoError(t, err)
	for _, id := range ids {
		a, okA, err := want.EventState(id)
		require.NoError(t, err)
		b, okB, err := got.EventState(id)
		require.NoError(t, err)
		require.Equal(t, okA, okB, "%s: event %s", what, id)
		require.Equal(t, a, b, "%s: event %s", what, id)
	}
	require.Equal(t, want.Head().CurrentState, got.Head().CurrentState, what)
}

// generatedV12Room generates a v12 room of four servers (mtxdb gen) and
// returns its directory.
func generatedV12Room(t *testing.T, seed uint64, events int) string {
	t.Helper()
	dir := t.TempDir()
	opts := gen.DefaultOptions()
	opts.Seed, opts.Events, opts.Servers, opts.RoomVersion = seed, events, 4, "12"
	_, err := gen.Generate(opts, dir, nil)
	require.NoError(t, err)
	return dir
}
