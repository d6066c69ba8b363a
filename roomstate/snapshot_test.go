package roomstate_test

import (
	"fmt"
	"testing"

	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/hamtstore"
)

// countingStore counts node writes, bytes written and reads through a MemNodeStore.
type countingStore struct {
	*hamtstore.MemNodeStore
	nodes, bytes, reads int
}

func (c *countingStore) PutNodes(n []hamtstore.EncodedNode) error {
	for _, x := range n {
		c.nodes++
		c.bytes += len(x.Data)
	}
	return c.MemNodeStore.PutNodes(n)
}

func (c *countingStore) GetNode(id hamtstore.NodeID) ([]byte, error) {
	c.reads++
	return c.MemNodeStore.GetNode(id)
}

func (c *countingStore) reset() { c.nodes, c.bytes, c.reads = 0, 0, 0 }

// memberRoom builds the state of a room with n members on s servers plus the usual
// non-member state, as one snapshot.
func memberRoom(tb testing.TB, st hamtstore.NodeStore, n int) hamtstore.NodeID {
	tb.Helper()
	changes := make([]hamtstore.Change, 0, n+6)
	for _, t := range []string{"m.room.create", "m.room.power_levels", "m.room.join_rules", "m.room.history_visibility", "m.room.name", "m.room.topic"} {
		changes = append(changes, hamtstore.Change{Key: roomrecord.StateKey(t, ""), Value: eventValue(t)})
	}
	for i := 0; i < n; i++ {
		changes = append(changes, hamtstore.Change{Key: roomrecord.StateKey("m.room.member", memberID(i)), Value: eventValue(fmt.Sprint("join", i))})
	}
	root, err := hamtstore.Apply(st, nil, hamtstore.EmptyRoot, changes)
	require.NoError(tb, err)
	return root
}

func memberID(i int) string { return fmt.Sprintf("@user%d:server%d.example.org", i, i%50) }

func eventValue(s string) hamtstore.Value {
	return hamtstore.Value(roomrecord.EventRecordID("$" + s))
}

// TestOneMembershipChangeCost: in rooms of 1k, 10k and 100k members one membership
// change writes at most depth+1 new nodes and at most 3 KiB,
// and one key of a snapshot is read with at most depth+1 node reads.
func TestOneMembershipChangeCost(t *testing.T) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		st := &countingStore{MemNodeStore: hamtstore.NewMemNodeStore()}
		root := memberRoom(t, st, n)
		st.reset()
		next, err := hamtstore.Set(st, nil, root, roomrecord.StateKey("m.room.member", memberID(n/2)), eventValue("leave"))
		require.NoError(t, err)
		depth := st.nodes // one new node per level of the changed path
		t.Logf("members=%d: one change wrote %d nodes, %d bytes", n, st.nodes, st.bytes)
		require.LessOrEqual(t, st.bytes, 3*1024, "members=%d", n)
		require.LessOrEqual(t, depth, 6)

		st.reset()
		_, ok, err := hamtstore.NewReader(st).Get(next, roomrecord.StateKey("m.room.member", memberID(n/3)))
		require.NoError(t, err)
		require.True(t, ok)
		require.LessOrEqual(t, st.reads, depth+1, "members=%d: single-key lookup", n)
		// The old snapshot is untouched.
		v, ok, err := hamtstore.NewReader(st).Get(root, roomrecord.StateKey("m.room.member", memberID(n/2)))
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, eventValue(fmt.Sprint("join", n/2)), v)
	}
}
