package smallroom_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/testrooms/smallroom"
)

// TestGenerateDeterministic: a seed and options give one room.
func TestGenerateDeterministic(t *testing.T) {
	for seed := int64(0); seed < 50; seed++ {
		a, err := smallroom.Generate(seed, smallroom.Options{})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := smallroom.Generate(seed, smallroom.Options{})
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("seed %d: two rooms", seed)
		}
	}
}

// TestGenerateOptions: the options bound the room; out-of-range ones are refused.
func TestGenerateOptions(t *testing.T) {
	r, err := smallroom.Generate(1, smallroom.Options{Version: "7", Events: 2, Servers: 1})
	if err != nil {
		t.Fatal(err)
	}
	if r.Version != "7" || len(r.Events) != 2 {
		t.Fatalf("version %s, %d events", r.Version, len(r.Events))
	}
	for _, o := range []smallroom.Options{{Version: "13"}, {Version: "x"}, {Events: 1}, {Events: 61}, {Servers: 6}} {
		if _, err := smallroom.Generate(1, o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

// importHashed imports a room's hashed rendering into a fresh in-memory store and
// replays it.
func importHashed(t *testing.T, rd *smallroom.Rendering) *roomstate.Room {
	ctx := t.Context()
	t.Helper()
	st := roomstate.New(packstore.NewMemStorage())
	res, err := st.Import(ctx, bytes.NewReader(rd.JSONL()), "smallroom", roomstate.ImportOptions{})
	if err != nil {
		t.Fatalf("import: %v\n%s", err, rd.JSONL())
	}
	if res.Imported != len(rd.Lines) || res.Redacted != 0 || len(res.Rooms) != 1 || res.Rooms[0] != rd.RoomID {
		t.Fatalf("import: %+v, want %d events of %s, none redacted", res, len(rd.Lines), rd.RoomID)
	}
	room, err := st.Room(ctx, rd.RoomID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resolver.Replay(ctx, room, resolver.ReplayOptions{}); err != nil {
		t.Fatal(err)
	}
	return room
}

// TestRenderings: in every room version the hashed rendering imports as it is
// (every content hash good, the store's IDs the rendering's), the fixture
// rendering parses back to the same room, and the two renderings name the same
// events in the same order.
func TestRenderings(t *testing.T) {
	for seed := int64(0); seed < 60; seed++ {
		v := smallroom.Versions[seed%12]
		r, err := smallroom.Generate(seed, smallroom.Options{Version: v})
		if err != nil {
			t.Fatal(err)
		}
		h, err := r.Hashed()
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		f, err := r.Fixture()
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		room := importHashed(t, h)
		ids, err := room.EventIDs()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(ids, h.IDs) {
			t.Fatalf("seed %d v%s: stored IDs %v, rendering's %v", seed, v, ids, h.IDs)
		}
		back, err := smallroom.ParseFixture(bytes.NewReader(f.JSONL()))
		if err != nil {
			t.Fatalf("seed %d v%s: %v", seed, v, err)
		}
		back.Seed = r.Seed
		if !reflect.DeepEqual(normalised(back), normalised(r)) {
			t.Fatalf("seed %d v%s: parsed fixture differs from the room", seed, v)
		}
		for i := range r.Events {
			hp, fp := h.PDUs[i], f.PDUs[i]
			if hp.Type() != fp.Type() || hp.SenderID() != fp.SenderID() || len(hp.AuthEventIDs()) != len(fp.AuthEventIDs()) ||
				len(hp.PrevEventIDs()) != len(fp.PrevEventIDs()) || hp.OriginServerTS() != fp.OriginServerTS() {
				t.Fatalf("seed %d v%s: event %d differs between the renderings", seed, v, i)
			}
			if hp.RoomID().String() != h.RoomID || fp.RoomID().String() != f.RoomID {
				t.Fatalf("seed %d v%s: event %d: room IDs %s %s", seed, v, i, hp.RoomID().String(), fp.RoomID().String())
			}
		}
	}
}

// normalised is a room with nil and empty slices alike and content compacted.
func normalised(r *smallroom.Room) *smallroom.Room {
	out := *r
	out.Events = nil
	for _, e := range r.Events {
		if len(e.Prev) == 0 {
			e.Prev = nil
		}
		if len(e.Auth) == 0 {
			e.Auth = nil
		}
		var b bytes.Buffer
		_ = json.Compact(&b, e.Content)
		e.Content = b.Bytes()
		out.Events = append(out.Events, e)
	}
	return &out
}

// TestRoomsHaveWhatTheyAreFor: over rooms of every version, replayed by our
// resolver: merges, rejections (a share, not most), every kind of fault and odd
// auth event, equal and inverted timestamps, every join rule the versions have.
func TestRoomsHaveWhatTheyAreFor(t *testing.T) {
	const rooms = 240
	count := map[string]int{}
	var events, rejected, merges int
	for seed := int64(0); seed < rooms; seed++ {
		r, err := smallroom.Generate(seed, smallroom.Options{Version: smallroom.Versions[seed%12]})
		if err != nil {
			t.Fatal(err)
		}
		h, err := r.Hashed()
		if err != nil {
			t.Fatal(err)
		}
		room := importHashed(t, h)
		events += len(r.Events)
		merges += r.Merges()
		for i, e := range r.Events {
			st, ok, err := room.EventState(h.IDs[i])
			if err != nil || !ok {
				t.Fatalf("seed %d: state of %s: %v %v", seed, e.Name, ok, err)
			}
			if st.Rejected {
				rejected++
			}
			note := e.Note
			switch {
			case strings.HasPrefix(note, "auth: power levels"):
				note = "auth: power levels"
			case strings.HasPrefix(note, "creator "):
				note = "creator not the sender"
			}
			if note != "" {
				count[note]++
			}
			for _, p := range e.Prev {
				switch pt := r.Events[p].TS; {
				case pt == e.TS:
					count["equal timestamp"]++
				case pt > e.TS:
					count["inverted timestamp"]++
				}
			}
			if e.Type == "m.room.join_rules" {
				var c struct {
					JoinRule string `json:"join_rule"`
				}
				_ = json.Unmarshal(e.Content, &c)
				count["join rule "+c.JoinRule]++
			}
			if e.Type == "m.room.member" {
				var c struct {
					Membership string `json:"membership"`
				}
				_ = json.Unmarshal(e.Content, &c)
				kind := c.Membership
				if e.Sender != *e.StateKey {
					kind += " of another"
				}
				count["member "+kind]++
			}
		}
	}
	t.Logf("%d rooms, %d events, %d merges, %d rejected (%.0f%%)", rooms, events, merges, rejected, 100*float64(rejected)/float64(events))
	var lines []string
	for k, n := range count {
		lines = append(lines, fmt.Sprintf("%s: %d", k, n))
	}
	t.Logf("%s", strings.Join(lines, "; "))
	if rejected*20 < events || rejected*10 > events*4 {
		t.Errorf("%d of %d events rejected: want between 5%% and 40%%", rejected, events)
	}
	if merges*10 < events {
		t.Errorf("%d merges in %d events: want 10%% at least", merges, events)
	}
	for _, want := range []string{"bad: sender lacks power for m.room.topic", "bad: raises the sender above its own level",
		"bad: a join the join rules forbid", "bad: kicks a user at or above the sender's level",
		"bad: an auth event of a key the selection does not name", "bad: two auth events of one key",
		"bad: cites a rejected auth event", "bad: no m.room.create among its auth events", "auth: power levels",
		"creator not the sender",
		"equal timestamp", "inverted timestamp", "join rule public", "join rule invite", "join rule knock",
		"join rule restricted", "join rule knock_restricted", "member knock", "member ban of another",
		"member leave of another", "member invite of another"} {
		if count[want] == 0 {
			t.Errorf("no %q in %d rooms", want, rooms)
		}
	}
}

// TestSpliceAndDrop: removing any event of a room leaves a room that renders and
// imports; Drop removes what depends on the event, Splice only the event.
func TestSpliceAndDrop(t *testing.T) {
	for seed := int64(0); seed < 12; seed++ {
		r, err := smallroom.Generate(seed, smallroom.Options{Version: smallroom.Versions[seed%12], Events: 16})
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i < len(r.Events); i++ {
			s := r.Splice(i)
			if len(s.Events) != len(r.Events)-1 {
				t.Fatalf("seed %d: Splice(%d): %d events, want %d", seed, i, len(s.Events), len(r.Events)-1)
			}
			d := r.Drop(i)
			if len(d.Events) > len(s.Events) {
				t.Fatalf("seed %d: Drop(%d) kept %d events, Splice %d", seed, i, len(d.Events), len(s.Events))
			}
			for _, x := range []*smallroom.Room{s, d} {
				h, err := x.Hashed()
				if err != nil {
					t.Fatalf("seed %d, without %d: %v", seed, i, err)
				}
				importHashed(t, h)
			}
		}
		if n := len(r.Splice(0).Events) + len(r.Drop(0).Events); n != 0 {
			t.Fatalf("seed %d: removing the create event left %d events", seed, n)
		}
	}
}
