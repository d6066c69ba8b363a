package resolver_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/testrooms"
)

// realRoomLines returns the events.jsonl lines of a real room and its recording.
func realRoomLines(t *testing.T, name string) ([]string, *recorded.Expected) {
	t.Helper()
	dir := filepath.Join(testrooms.Dir(), "real", name)
	b, err := os.ReadFile(filepath.Join(dir, "events.jsonl"))
	require.NoError(t, err)
	exp, err := recorded.Load(dir)
	require.NoError(t, err)
	return strings.Split(strings.TrimSpace(string(b)), "\n"), exp
}

// TestRoomHandleFollowsImport: a *Room taken before a second Import of the same
// Store sees the events it added (Replay on such a handle computes them), its
// head counts them, and the replayed room equals the recording.
func TestRoomHandleFollowsImport(t *testing.T) {
	ctx := t.Context()
	lines, exp := realRoomLines(t, "room003")
	half := len(lines) / 2
	st := roomstate.New(packstore.NewMemStorage())
	res, err := st.Import(ctx, strings.NewReader(strings.Join(lines[:half], "\n")), "first half", roomstate.ImportOptions{})
	require.NoError(t, err)
	room, err := st.Room(ctx, res.Rooms[0])
	require.NoError(t, err)
	rr, err := resolver.Replay(ctx, room, resolver.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, half, rr.Computed)

	_, err = st.Import(ctx, strings.NewReader(strings.Join(lines, "\n")), "whole", roomstate.ImportOptions{})
	require.NoError(t, err)
	require.Equal(t, uint32(len(lines)), room.Head().Events, "the old handle's head")
	require.False(t, room.Head().Replayed)
	ck, err := room.Check(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, len(lines)-half, ck.Unreplayed)

	rr, err = resolver.Replay(ctx, room, resolver.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, len(lines)-half, rr.Computed, "Replay on the handle taken before the import")
	cr, err := recorded.Compare(ctx, room, exp, func(m recorded.Mismatch) { t.Error(m) })
	require.NoError(t, err)
	require.Equal(t, len(exp.After), cr.Events)
}

// TestReplayStop: a Replay whose Stop hook fires part-way returns ErrStopped with
// the events done so far stored (Check counts the rest as Unreplayed); the next
// Replay computes only the rest and the room equals the recording. A stopped
// Force replay leaves the keep-rule-free room replayable with Force again.
func TestReplayStop(t *testing.T) {
	ctx := t.Context()
	lines, exp := realRoomLines(t, "room003")
	st := roomstate.New(packstore.NewMemStorage())
	res, err := st.Import(ctx, strings.NewReader(strings.Join(lines, "\n")), "room003", roomstate.ImportOptions{})
	require.NoError(t, err)
	room, err := st.Room(ctx, res.Rooms[0])
	require.NoError(t, err)
	asked, stopAt := 0, 40
	rr, err := resolver.Replay(ctx, room, resolver.WithBatchSize(resolver.ReplayOptions{Stop: func() bool { asked++; return asked > stopAt }}, 7))
	require.ErrorIs(t, err, resolver.ErrStopped)
	require.Equal(t, stopAt, rr.Computed)
	require.False(t, room.Head().Replayed)
	ck, err := room.Check(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, len(lines)-stopAt, ck.Unreplayed)

	rr, err = resolver.Replay(ctx, room, resolver.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, len(lines)-stopAt, rr.Computed)
	cr, err := recorded.Compare(ctx, room, exp, func(m recorded.Mismatch) { t.Error(m) })
	require.NoError(t, err)
	require.Equal(t, len(exp.After), cr.Events)

	asked = 0
	_, err = resolver.Replay(ctx, room, resolver.ReplayOptions{Force: true, Stop: func() bool { asked++; return asked > stopAt }})
	require.ErrorIs(t, err, resolver.ErrStopped)
	rr, err = resolver.Replay(ctx, room, resolver.ReplayOptions{Force: true})
	require.NoError(t, err)
	require.Equal(t, len(lines), rr.Computed)
	_, err = recorded.Compare(ctx, room, exp, func(m recorded.Mismatch) { t.Error(m) })
	require.NoError(t, err)
}

// TestReplayCanceled: a context canceled part-way stops Replay as Stop does (the
// states computed are stored, the head stays not replayed) with an error
// matching both ErrStopped and context.Canceled; a later Replay finishes the room.
func TestReplayCanceled(t *testing.T) {
	lines, exp := realRoomLines(t, "room003")
	st := roomstate.New(packstore.NewMemStorage())
	res, err := st.Import(t.Context(), strings.NewReader(strings.Join(lines, "\n")), "room003", roomstate.ImportOptions{})
	require.NoError(t, err)
	room, err := st.Room(t.Context(), res.Rooms[0])
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stopAt := 30
	rr, err := resolver.Replay(ctx, room, resolver.WithBatchSize(resolver.ReplayOptions{Progress: func(done, _ int) {
		if done == stopAt {
			cancel()
		}
	}}, 7))
	require.ErrorIs(t, err, resolver.ErrStopped)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, stopAt, rr.Computed)
	require.False(t, room.Head().Replayed)

	rr, err = resolver.Replay(t.Context(), room, resolver.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, len(lines)-stopAt, rr.Computed)
	_, err = recorded.Compare(t.Context(), room, exp, func(m recorded.Mismatch) { t.Error(m) })
	require.NoError(t, err)
}
