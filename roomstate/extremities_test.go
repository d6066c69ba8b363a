package roomstate_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomrecord"
	"github.com/mtxdb/mtxdb/roomstate"
)

// modelExtremities is the forward-extremity rule applied to the room's events,
// from their metadata records: the events no event of the room names in
// prev_events.
func modelExtremities(t *testing.T, room *roomstate.Room) []string {
	t.Helper()
	ids, err := room.EventIDs()
	require.NoError(t, err)
	named := map[string]bool{}
	for _, id := range ids {
		m, err := room.Meta(id)
		require.NoError(t, err)
		for _, p := range m.PrevEvents {
			named[p] = true
		}
	}
	var out []string
	for _, id := range ids {
		if !named[id] {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// reopen opens the room through a new Store over eng (nothing cached) and
// requires that its forward extremities are the model's and that Check passes.
func reopen(t *testing.T, eng packstore.StorageEngine, roomID string) *roomstate.Room {
	t.Helper()
	room, err := roomstate.New(eng).Room(t.Context(), roomID)
	require.NoError(t, err)
	require.Equal(t, modelExtremities(t, room), room.Head().ForwardExtremities)
	_, err = room.Check(t.Context(), nil)
	require.NoError(t, err)
	return room
}

// importAlternate imports with AnyOrder every other line of lines (from the
// first when odd is false, else from the second), in batches of 7 so that the
// extremity chunks change many times. In a room whose events form a chain, the
// events of the first such import are all forward extremities (the event each
// names in prev_events and the one naming it are missing), and the second import
// leaves one.
func importAlternate(t *testing.T, st *roomstate.Store, lines []string, odd bool) {
	t.Helper()
	var some []string
	for i, l := range lines {
		if (i%2 == 1) == odd {
			some = append(some, l)
		}
	}
	_, err := st.Import(t.Context(), strings.NewReader(strings.Join(some, "\n")), "alternate",
		roomstate.ImportOptions{AnyOrder: true, RoomVersion: "10", BatchSize: 7})
	require.NoError(t, err)
}

// TestExtremityChunksAcrossFormats: a room with hundreds of forward extremities
// gets a version 3 head whose chunks RoomRecords lists; rewritten as the head
// every store held before version 3 (version 1, every extremity inline, byte
// for byte as that code wrote it: roomrecord's TestHeadVersion1Golden), it opens
// with the same extremities, takes a further import (which moves them into
// chunks again), the import of the events between (which leaves a few, inline)
// and a replay; a new Store sees the model's extremities and a clean Check at
// every step.
func TestExtremityChunksAcrossFormats(t *testing.T) {
	lines := roomLines(t, "room001")
	eng := packstore.NewMemStorage()
	st := roomstate.New(eng)
	importAlternate(t, st, lines[300:], false)
	rooms, err := st.Rooms(t.Context())
	require.NoError(t, err)
	require.Len(t, rooms, 1)
	roomID := rooms[0].ID()
	room := reopen(t, eng, roomID)
	h := room.Head()
	require.Greater(t, len(h.ForwardExtremities), roomrecord.MaxInlineExtremities)
	require.NotEmpty(t, h.ExtremityChunks, "a version 3 head")
	listed := room.RoomRecords()
	for _, c := range h.ExtremityChunks {
		require.Contains(t, listed, c.ID)
	}

	// Today's format: the same head as a version 1 record.
	old := h
	old.InlineExtremities, old.ExtremityChunks = nil, nil
	coll := roomrecord.CollectionID(roomID)
	require.NoError(t, eng.PutMany(coll, []packstore.Record{{ID: roomrecord.HeadRecordID, Data: roomrecord.EncodeHead(&old)}}))
	require.Empty(t, reopen(t, eng, roomID).Head().ExtremityChunks)

	st = roomstate.New(eng)
	importAlternate(t, st, lines[:300], false)
	room = reopen(t, eng, roomID)
	require.NotEmpty(t, room.Head().ExtremityChunks)
	require.Greater(t, len(room.Head().ForwardExtremities), len(h.ForwardExtremities))

	importAlternate(t, roomstate.New(eng), lines, true)
	room = reopen(t, eng, roomID)
	require.LessOrEqual(t, len(room.Head().ForwardExtremities), roomrecord.MaxInlineExtremities/2)
	require.Empty(t, room.Head().ExtremityChunks, "few extremities: inline again")

	_, err = resolver.Replay(t.Context(), room, resolver.ReplayOptions{})
	require.NoError(t, err)
	after, err := roomstate.New(eng).Room(t.Context(), roomID)
	require.NoError(t, err)
	require.Equal(t, room.Head().ForwardExtremities, after.Head().ForwardExtremities)
	require.LessOrEqual(t, len(after.Head().ForwardExtremities), roomrecord.MaxInlineExtremities/2)
	require.Empty(t, after.Head().ExtremityChunks, "few extremities: inline again")
}

// TestExtremityChunksCorruptStore: a head naming a chunk that is not stored, or
// a chunk whose bytes changed, makes Room and Rooms fail with ErrCorruptRecord
// naming the room and the chunk, not ErrUnknownRoom, and no panic.
func TestExtremityChunksCorruptStore(t *testing.T) {
	lines := roomLines(t, "room001")
	for _, tc := range []struct {
		name string
		mess func(eng *packstore.MemStorage, coll packstore.ID, h roomrecord.Head)
		want string
	}{
		{"chunk not stored", func(eng *packstore.MemStorage, coll packstore.ID, h roomrecord.Head) {
			h.ExtremityChunks = slices.Clone(h.ExtremityChunks)
			h.ExtremityChunks[0].ID[0] ^= 1
			require.NoError(t, eng.PutMany(coll, []packstore.Record{{ID: roomrecord.HeadRecordID, Data: roomrecord.EncodeHead(&h)}}))
		}, "not found"},
		{"chunk bytes changed", func(eng *packstore.MemStorage, coll packstore.ID, h roomrecord.Head) {
			c := h.ExtremityChunks[0]
			b := roomrecord.EncodeExtremityChunk(c.EventIDs[1:])
			require.NoError(t, eng.PutMany(coll, []packstore.Record{{ID: c.ID, Data: b}}))
		}, "hashes to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := packstore.NewMemStorage()
			importAlternate(t, roomstate.New(eng), lines, false)
			rooms, err := roomstate.New(eng).Rooms(t.Context())
			require.NoError(t, err)
			h := rooms[0].Head()
			require.NotEmpty(t, h.ExtremityChunks)
			tc.mess(eng, roomrecord.CollectionID(h.RoomID), h)
			_, err = roomstate.New(eng).Room(t.Context(), h.RoomID)
			require.ErrorIs(t, err, roomrecord.ErrCorruptRecord)
			require.False(t, errors.Is(err, roomstate.ErrUnknownRoom))
			for _, s := range []string{h.RoomID, tc.want, "forward-extremity chunk"} {
				require.Contains(t, err.Error(), s)
			}
			_, err = roomstate.New(eng).Rooms(t.Context())
			require.ErrorIs(t, err, roomrecord.ErrCorruptRecord)
		})
	}
}

// TestImportAnyOrderExtremities: a backfill (newest first, with AnyOrder) in two
// imports leaves as forward extremities the events no imported event names in
// prev_events (room004_union has 7), not every event: an event that arrives
// after an event naming it is not one, whether that event came in this import
// or an earlier one.
func TestImportAnyOrderExtremities(t *testing.T) {
	lines := roomLines(t, "room004_union")
	rev := slices.Clone(lines)
	slices.Reverse(rev)
	eng := packstore.NewMemStorage()
	for _, part := range [][]string{rev[:100], rev[100:]} {
		_, err := roomstate.New(eng).Import(t.Context(), strings.NewReader(strings.Join(part, "\n")), "backfill",
			roomstate.ImportOptions{AnyOrder: true, RoomVersion: "5", BatchSize: 7})
		require.NoError(t, err)
	}
	rooms, err := roomstate.New(eng).Rooms(t.Context())
	require.NoError(t, err)
	require.Len(t, rooms, 1)
	room := reopen(t, eng, rooms[0].ID())
	require.Len(t, room.Head().ForwardExtremities, 7)
	require.Equal(t, len(lines), int(room.Head().Events))
}
