package resolver_test

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/testrooms"
)

// TestReplayIncremental: replay after a partial import computes those events; a second
// replay writes nothing; importing the rest and replaying computes only the new
// events, with the same final state as one replay of the whole room; Force
// recomputes all and changes no snapshot.
func TestReplayIncremental(t *testing.T) {
	dir := filepath.Join(testrooms.Dir(), "real", "room004_union")
	f, err := os.Open(filepath.Join(dir, "events.jsonl"))
	require.NoError(t, err)
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	f.Close()
	require.Greater(t, len(lines), 150)

	eng, err := packstore.Open(packstore.DefaultOptions(t.TempDir()))
	require.NoError(t, err)
	defer eng.Close()
	st := roomstate.New(eng)
	imp := func(ls []string) *roomstate.Room {
		res, err := st.Import(strings.NewReader(strings.Join(ls, "\n")), "part", roomstate.ImportOptions{})
		require.NoError(t, err)
		room, err := st.Room(res.Rooms[0])
		require.NoError(t, err)
		return room
	}
	room := imp(lines[:100])
	res, err := resolver.Replay(room, resolver.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, 100, res.Computed)

	require.NoError(t, eng.Sync())
	bytes := eng.Stats().DiskBytes
	res, err = resolver.Replay(room, resolver.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, 0, res.Computed)
	require.NoError(t, eng.Sync())
	require.Equal(t, bytes, eng.Stats().DiskBytes, "a second replay wrote something")

	room = imp(lines)
	res, err = resolver.Replay(room, resolver.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, len(lines)-100, res.Computed)
	incremental := room.Head()

	whole := replayedRoom(t, dir)
	require.Equal(t, whole.Head().CurrentState, incremental.CurrentState)
	require.Equal(t, whole.Head().ForwardExtremities, incremental.ForwardExtremities)

	res, err = resolver.Replay(room, resolver.ReplayOptions{Force: true})
	require.NoError(t, err)
	require.Equal(t, len(lines), res.Computed)
	require.Equal(t, incremental.CurrentState, room.Head().CurrentState)
	exp, err := testrooms.LoadExpected(dir)
	require.NoError(t, err)
	cr, err := testrooms.Compare(room, exp, func(m testrooms.Mismatch) { t.Error(m) })
	require.NoError(t, err)
	require.Equal(t, len(exp.After), cr.Events)
}
