package roomstate_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomrecord"
	"github.com/mtxdb/mtxdb/testrooms"
)

// TestStateWriter: Apply gives the same snapshot whether its changes come in one
// call or one at a time, reads back through Lookup and State, and deletes; an
// in-memory writer's nodes are not in the store, and it refuses to write records;
// a done context stops every write.
func TestStateWriter(t *testing.T) {
	ctx := t.Context()
	eng := packstore.NewMemStorage()
	room, err := testrooms.ImportReplayed(eng, filepath.Join(testrooms.Dir(), "real", "room004"))
	require.NoError(t, err)
	cur := room.Head().CurrentState
	st, err := room.State(ctx, room.NewReader(), cur)
	require.NoError(t, err)
	someKey := roomrecord.StatePair{Type: "m.room.create"}
	require.Contains(t, st, someKey)
	set := map[roomrecord.StatePair]string{}
	for k, id := range st {
		if len(set) < 5 || k == someKey {
			set[k] = id
		}
	}

	w := room.StateWriter(false)
	all, err := w.Apply(ctx, hamtstore.EmptyRoot, set, nil)
	require.NoError(t, err)
	one := hamtstore.EmptyRoot
	for k, id := range set {
		one, err = w.Apply(ctx, one, map[roomrecord.StatePair]string{k: id}, nil)
		require.NoError(t, err)
	}
	require.Equal(t, all, one, "one call or one change at a time")
	got, err := room.State(ctx, room.NewReader(), all)
	require.NoError(t, err)
	require.Equal(t, set, got)

	less, err := w.Apply(ctx, all, nil, []roomrecord.StatePair{someKey})
	require.NoError(t, err)
	delete(set, someKey)
	want, err := w.Apply(ctx, hamtstore.EmptyRoot, set, nil)
	require.NoError(t, err)
	require.Equal(t, want, less, "delete")
	_, ok, err := room.Lookup(room.NewReader(), less, someKey.Type, someKey.StateKey)
	require.NoError(t, err)
	require.False(t, ok, "deleted key")

	mem := room.StateWriter(true)
	other, err := mem.Apply(ctx, hamtstore.EmptyRoot, map[roomrecord.StatePair]string{someKey: st[someKey], {Type: "x.test", StateKey: "b"}: st[someKey]}, nil)
	require.NoError(t, err)
	_, _, err = mem.Reader().Get(other, roomrecord.StateKey("x.test", "b"))
	require.NoError(t, err, "the in-memory writer's reader sees its nodes")
	_, err = eng.Get(roomrecord.CollectionID(room.ID()), packstore.ID(other))
	require.ErrorIs(t, err, packstore.ErrNotFound, "in-memory nodes are not stored")
	require.Error(t, mem.PutEventStates(ctx, []string{"$x"}, []roomrecord.EventState{{}}))
	h := room.Head()
	require.Error(t, mem.Commit(ctx, &h))

	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err = w.Apply(done, hamtstore.EmptyRoot, set, nil)
	require.True(t, errors.Is(err, done.Err()))
	require.ErrorIs(t, w.Commit(done, nil), done.Err())
}

// TestStateWriterWriteBehind: in write-behind mode, Apply's nodes are readable
// through the writer before any write and reach the engine with the state
// records at PutEventStates (Wait waits for them); a failed write keeps its nodes
// readable and its error is returned by the next Commit, once.
func TestStateWriterWriteBehind(t *testing.T) {
	ctx := t.Context()
	eng := &failingPuts{MemStorage: packstore.NewMemStorage(), failAt: 1 << 30}
	room, err := testrooms.ImportReplayed(eng, filepath.Join(testrooms.Dir(), "real", "room004"))
	require.NoError(t, err)
	coll := roomrecord.CollectionID(room.ID())
	st, err := room.State(ctx, room.NewReader(), room.Head().CurrentState)
	require.NoError(t, err)
	k := roomrecord.StatePair{Type: "x.test", StateKey: "a"}
	id := st[roomrecord.StatePair{Type: "m.room.create"}]

	w := room.StateWriter(false)
	w.WriteBehind()
	root, err := w.Apply(ctx, hamtstore.EmptyRoot, map[roomrecord.StatePair]string{k: id}, nil)
	require.NoError(t, err)
	_, err = eng.Get(coll, packstore.ID(root))
	require.ErrorIs(t, err, packstore.ErrNotFound, "held, not written")
	w.Reader().Reset() // read the nodes through the writer's store, not decoded copies
	_, ok, err := w.Reader().Get(root, roomrecord.StateKey(k.Type, k.StateKey))
	require.NoError(t, err)
	require.True(t, ok, "held nodes are readable")
	require.NoError(t, w.PutEventStates(ctx, []string{"$x"}, []roomrecord.EventState{{Before: root, After: root}}))
	require.NoError(t, w.Wait())
	_, err = eng.Get(coll, packstore.ID(root))
	require.NoError(t, err, "written with the state records")
	_, err = eng.Get(coll, roomrecord.StateRecordID(roomrecord.EventRecordID("$x")))
	require.NoError(t, err)

	eng.failAt = eng.calls + 1
	k2 := roomrecord.StatePair{Type: "x.test", StateKey: "b"}
	root2, err := w.Apply(ctx, root, map[roomrecord.StatePair]string{k2: id}, nil)
	require.NoError(t, err)
	require.NoError(t, w.PutEventStates(ctx, []string{"$y"}, []roomrecord.EventState{{Before: root, After: root2}}), "the write runs behind")
	w.Reader().Reset()
	_, ok, err = w.Reader().Get(root2, roomrecord.StateKey(k2.Type, k2.StateKey))
	require.NoError(t, err)
	require.True(t, ok, "a failed write's nodes stay readable")
	require.ErrorIs(t, w.Commit(ctx, nil), errInjected)
	require.NoError(t, w.Wait(), "the error is returned once")
}
