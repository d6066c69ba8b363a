package roomstate_test

import (
	"github.com/mtxdb/mtxdb/roomstate/roomstatetest"
	"path/filepath"
	"testing"

	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/testrooms"
)

// TestReadKinds checks that each room query is counted under its kind, on both
// engines that count reads, and that an engine without KindGetter still works.
func TestReadKinds(t *testing.T) {
	ctx := t.Context()
	dir := filepath.Join(testrooms.Dir(), "real", "room004")
	ps, err := packstore.Open(packstore.Options{Dir: t.TempDir()}) // no cache: every read is physical
	require.NoError(t, err)
	defer ps.Close()
	for _, eng := range []packstore.StorageEngine{packstore.NewMemStorage(), ps} {
		room, err := testrooms.ImportReplayed(eng, dir)
		require.NoError(t, err)
		kg := eng.(packstore.KindGetter)
		kg.ResetReadStats()
		room, err = roomstate.New(eng).Room(ctx, room.ID())
		require.NoError(t, err)
		ids, err := room.EventIDs()
		require.NoError(t, err)
		require.Equal(t, packstore.ReadCounters{}, kg.ReadStats()[roomrecord.ReadPDU])

		kg.ResetReadStats()
		_, err = room.EventJSON(ids[0])
		require.NoError(t, err)
		_, err = room.Meta(ids[0])
		require.NoError(t, err)
		_, err = room.Meta(ids[1])
		require.NoError(t, err)
		rs := kg.ReadStats()
		require.EqualValues(t, 1, rs[roomrecord.ReadPDU].Reads, "%s: %v", eng, rs)
		require.EqualValues(t, 2, rs[roomrecord.ReadMeta].Reads)
		require.Len(t, rs, 2)

		kg.ResetReadStats()
		rd := room.NewReader()
		_, err = roomstatetest.Entries(ctx, room, rd, room.Head().CurrentState)
		require.NoError(t, err)
		rs = kg.ReadStats()
		require.EqualValues(t, rd.NodesRead(), rs[roomrecord.ReadNode].Reads+rs[roomrecord.ReadNode].CacheHits)
		require.Positive(t, rs[roomrecord.ReadNode].Reads)
		require.Positive(t, rs[roomrecord.ReadMeta].Reads) // StateEntries checks each entry's metadata
		require.Len(t, rs, 2)
	}
	require.Equal(t, "node", roomrecord.ReadKindName(roomrecord.ReadNode))
	require.Equal(t, "kind9", roomrecord.ReadKindName(9))
}
