package roomstate_test

import (
	"path/filepath"
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
// membership of a user before each event agrees with the recorded state, one key
// of a snapshot costs a handful of reads, current state equals the state after the
// single forward extremity.
func TestRoomQueries(t *testing.T) {
	dir := filepath.Join(testrooms.Dir(), "real", "room004")
	eng := &countingEngine{StorageEngine: packstore.NewMemStorage()}
	room, err := testrooms.ImportReplayed(eng, dir)
	require.NoError(t, err)
	exp, err := recorded.Load(dir)
	require.NoError(t, err)

	// Membership before event i = membership after event i-1 in the recorded state.
	members := 0
	for i := 1; i < len(exp.After); i++ {
		prev := exp.After[i-1].State
		ev := exp.After[i].EventID
		for key, memberEvent := range prev {
			const prefix = "m.room.member\x00"
			if len(key) <= len(prefix) || key[:len(prefix)] != prefix {
				continue
			}
			user := key[len(prefix):]
			eng.gets.Store(0)
			m, id, err := room.MembershipAt(room.NewReader(), ev, user)
			require.NoError(t, err)
			require.Equal(t, memberEvent, id, "member event of %s before %s", user, ev)
			require.Contains(t, []string{"join", "leave", "invite", "ban", "knock"}, m)
			// state record + about depth nodes + metadata + PDU
			require.LessOrEqual(t, eng.gets.Load(), int64(1+4+1+1), "reads for one membership")
			members++
		}
	}
	require.Greater(t, members, 100)
	m, id, err := room.Membership(room.NewReader(), room.CurrentState(), "@nobody:nowhere")
	require.NoError(t, err)
	require.Equal(t, "leave", m)
	require.Empty(t, id)

	h := room.Head()
	require.Len(t, h.ForwardExtremities, 1)
	after, err := room.StateAfter(h.ForwardExtremities[0])
	require.NoError(t, err)
	require.Equal(t, after, room.CurrentState())
}
