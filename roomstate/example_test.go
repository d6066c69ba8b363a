package roomstate_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/testrooms"
)

// The whole sequence on one of the bundled real rooms (testrooms/real/room003):
// open a store, import the room's PDUs, replay it through state resolution and read
// its current state, one entry of it, and the state before one event.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "mtxdb-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// A store is a directory of shard and index files; Open creates it.
	eng, err := packstore.Open(packstore.DefaultOptions(dir))
	if err != nil {
		log.Fatal(err)
	}
	defer eng.Close()
	st := roomstate.New(eng)

	// Import reads JSON lines (or one JSON array) of PDUs in which each PDU's
	// prev_events and auth_events come before it (ImportOptions.AnyOrder lifts that).
	in, err := os.Open(filepath.Join(testrooms.Dir(), "real", "room003", "events.jsonl"))
	if err != nil {
		log.Fatal(err)
	}
	defer in.Close()
	res, err := st.Import(ctx, in, "room003/events.jsonl", roomstate.ImportOptions{})
	if err != nil {
		log.Fatal(err) // an *roomstate.ImportError names the line and the event
	}
	fmt.Println("imported:", res.Imported, "rooms:", res.Rooms)
	if len(res.Rooms) != 1 {
		log.Fatalf("imported %d rooms, want 1 (an input without PDUs imports none)", len(res.Rooms))
	}

	// Replay computes and stores the state before and after every event, the
	// forward extremities and the current state.
	room, err := st.Room(ctx, res.Rooms[0])
	if err != nil {
		log.Fatal(err)
	}
	rr, err := resolver.Replay(ctx, room, resolver.ReplayOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("computed:", rr.Computed, "rejected:", rr.Rejected, "replayed:", room.Head().Replayed)

	// The whole current state, keyed by (type, state_key): a resolver.StateMap.
	rd := room.NewReader()
	var current resolver.StateMap
	current, err = room.State(ctx, rd, room.Head().CurrentState)
	if err != nil {
		log.Fatal(err)
	}
	keys := make([]string, 0, len(current))
	for k := range current {
		if k.Type != "m.room.member" {
			keys = append(keys, k.Type)
		}
	}
	sort.Strings(keys)
	fmt.Println("entries:", len(current), "non-member types:", keys)
	fmt.Println("create event:", current[resolver.Key{Type: "m.room.create", StateKey: ""}])

	// One entry, without reading the whole state.
	id, ok, err := room.Lookup(rd, room.Head().CurrentState, "m.room.join_rules", "")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("join rules:", id, ok)

	// The state an event was authorised against.
	ids, err := room.EventIDs()
	if err != nil {
		log.Fatal(err)
	}
	before, err := room.StateBefore(ids[3])
	if err != nil {
		log.Fatal(err)
	}
	s, err := room.State(ctx, rd, before)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("state before the 4th event:", len(s), "entries")
	// Output:
	// imported: 212 rooms: [!FymyxFJPGCZLfPcMwA:server1.test]
	// computed: 212 rejected: 0 replayed: true
	// entries: 10 non-member types: [m.room.create m.room.guest_access m.room.history_visibility m.room.join_rules m.room.name m.room.power_levels m.room.related_groups org.matrix.room.preview_urls]
	// create event: $15471426487fdcng:server1.test
	// join rules: $154714436223plixL:server1.test true
	// state before the 4th event: 3 entries
}

// A Room follows its room: a handle taken before a second Import through the same
// Store sees the events it added, and Replay on it computes just those.
func ExampleRoom_Head() {
	ctx := context.Background()
	st := roomstate.New(packstore.NewMemStorage()) // or over packstore.Open
	b, err := os.ReadFile(filepath.Join(testrooms.Dir(), "real", "room003", "events.jsonl"))
	if err != nil {
		log.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	first, err := st.Import(ctx, strings.NewReader(strings.Join(lines[:100], "")), "first 100", roomstate.ImportOptions{})
	if err != nil {
		log.Fatal(err)
	}
	if len(first.Rooms) != 1 {
		log.Fatalf("imported %d rooms, want 1", len(first.Rooms))
	}
	room, err := st.Room(ctx, first.Rooms[0])
	if err != nil {
		log.Fatal(err)
	}
	rr, err := resolver.Replay(ctx, room, resolver.ReplayOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("events:", room.Head().Events, "computed:", rr.Computed)

	all, err := st.Import(ctx, strings.NewReader(string(b)), "all", roomstate.ImportOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("imported:", all.Imported, "skipped:", all.Skipped)
	fmt.Println("events:", room.Head().Events, "replayed:", room.Head().Replayed)
	rr, err = resolver.Replay(ctx, room, resolver.ReplayOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("computed:", rr.Computed, "replayed:", room.Head().Replayed)
	// Output:
	// events: 100 computed: 100
	// imported: 112 skipped: 100
	// events: 212 replayed: false
	// computed: 112 replayed: true
}
