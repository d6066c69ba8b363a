package resolver_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/testrooms"
	"github.com/mtxdb/mtxdb/testrooms/gen"
)

// replayedRoom imports and replays one bundled room into a fresh in-memory store.
func replayedRoom(t testing.TB, dir string) *roomstate.Room {
	t.Helper()
	st := roomstate.New(packstore.NewMemStorage())
	f, err := os.Open(filepath.Join(dir, "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := st.Import(f, dir, roomstate.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	room, err := st.Room(res.Rooms[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resolver.Replay(room, resolver.ReplayOptions{}); err != nil {
		t.Fatal(err)
	}
	return room
}

// stateMap reads a stored snapshot as a StateMap.
func stateMap(t testing.TB, room *roomstate.Room, eventID string, after bool) resolver.StateMap {
	t.Helper()
	st, ok, err := room.EventState(eventID)
	if err != nil || !ok {
		t.Fatalf("state of %s: %v %v", eventID, ok, err)
	}
	root := st.Before
	if after {
		root = st.After
	}
	entries, err := room.StateEntries(room.NewReader(), root)
	if err != nil {
		t.Fatal(err)
	}
	out := resolver.StateMap{}
	for k, v := range entries {
		typ, sk, _ := cut(k)
		out[resolver.Key{Type: typ, StateKey: sk}] = v
	}
	return out
}

func cut(k string) (string, string, bool) {
	for i := 0; i < len(k); i++ {
		if k[i] == 0 {
			return k[:i], k[i+1:], true
		}
	}
	return k, "", false
}

// TestStorageMatchesMaps: at every event with two or more prev_events in the real
// rooms, the state before it as replay stored it (HAMT diff, conflict-sized loads,
// auth difference by forward search) equals ResolveMaps over the whole state maps
// after its prev_events (every event read, auth chains of every state event).
func TestStorageMatchesMaps(t *testing.T) {
	dirs, err := testrooms.RealRoomDirs(filepath.Join(testrooms.Dir(), "real"))
	if err != nil {
		t.Fatal(err)
	}
	// Generated rooms have what the real ones lack: many merges, conflicting power
	// events, rejections; v12 exercises state resolution v2.1.
	for _, rv := range []string{"10", "11", "12"} {
		opts := gen.DefaultOptions()
		opts.Seed, opts.Events, opts.Servers, opts.RoomVersion = 3, 400, 4, rv
		dir := filepath.Join(t.TempDir(), "gen-v"+rv)
		if _, err := gen.Generate(opts, dir, nil); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dir)
	}
	merges := 0
	for _, dir := range dirs {
		room := replayedRoom(t, dir)
		r, err := resolver.New(room)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := room.EventIDs()
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			m, err := room.Meta(id)
			if err != nil {
				t.Fatal(err)
			}
			if len(m.PrevEvents) < 2 {
				continue
			}
			var maps []resolver.StateMap
			for _, p := range m.PrevEvents {
				maps = append(maps, stateMap(t, room, p, true))
			}
			want, err := resolver.ResolveMaps(room.Version(), maps, r)
			if err != nil {
				t.Fatalf("%s %s: %v", filepath.Base(dir), id, err)
			}
			if d := diffMaps(stateMap(t, room, id, false), want); d != "" {
				t.Errorf("%s: state before %s: storage path differs from whole maps: %s", filepath.Base(dir), id, d)
			}
			merges++
		}
	}
	if merges == 0 {
		t.Fatal("no merge events in the real rooms")
	}
	t.Logf("%d merge events compared", merges)
}
