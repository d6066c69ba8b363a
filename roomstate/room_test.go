package roomstate_test

import (
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/testrooms"
)

// countingEngine counts Gets on a storage engine (atomically: replay's
// prefetching goroutine reads beside the replay).
type countingEngine struct {
	packstore.StorageEngine
	gets atomic.Int64
}

func (c *countingEngine) Get(coll, id packstore.ID) ([]byte, error) {
	c.gets.Add(1)
	return c.StorageEngine.Get(coll, id)
}

// TestRoomQueries replays a real room and asks the Dendrite-style questions of it:
// the member event of a user before each event agrees with the recorded state,
// one key of a snapshot costs a handful of reads, current state equals the state
// after the single forward extremity.
func TestRoomQueries(t *testing.T) {
	dir := filepath.Join(testrooms.Dir(), "real", "room004")
	eng := &countingEngine{StorageEngine: packstore.NewMemStorage()}
	room, err := testrooms.ImportReplayed(eng, dir)
	require.NoError(t, err)
	exp, err := recorded.Load(dir)
	require.NoError(t, err)

	// The state before event i is the recorded state after event i-1.
	members := 0
	for i := 1; i < len(exp.After); i++ {
		prev := exp.After[i-1].State
		ev := exp.After[i].EventID
		for key, memberEvent := range prev {
			user, ok := strings.CutPrefix(key, "m.room.member\x00")
			if !ok {
				continue
			}
			eng.gets.Store(0)
			root, err := room.StateBefore(ev)
			require.NoError(t, err)
			id, found, err := room.Lookup(room.NewReader(), root, "m.room.member", user)
			require.NoError(t, err)
			require.True(t, found, "member event of %s before %s", user, ev)
			require.Equal(t, memberEvent, id, "member event of %s before %s", user, ev)
			// state record + about depth nodes + metadata
			require.LessOrEqual(t, eng.gets.Load(), int64(1+4+1), "reads for one key")
			members++
		}
	}
	require.Greater(t, members, 100)
	h := room.Head()
	_, found, err := room.Lookup(room.NewReader(), h.CurrentState, "m.room.member", "@nobody:nowhere")
	require.NoError(t, err)
	require.False(t, found)

	require.Len(t, h.ForwardExtremities, 1)
	after, err := room.StateAfter(h.ForwardExtremities[0])
	require.NoError(t, err)
	require.Equal(t, after, h.CurrentState)
}
