package specres_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/mtxdb/mtxdb/authrules"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/resolver/specres"
	"github.com/mtxdb/mtxdb/testrooms"
)

// source is a Source over parsed events; rejected is filled by replay.
type source struct {
	events   map[string]gomatrixserverlib.PDU
	rejected map[string]bool
}

func (s *source) Event(id string) (gomatrixserverlib.PDU, error) {
	if p, ok := s.events[id]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("no event %s", id)
}

func (s *source) Rejected(id string) bool { return s.rejected[id] }

func rumaDir() string { return testrooms.RumaDir() }

// load reads fixture files (testrooms.LoadFixtures; names under the Ruma
// fixtures, or paths starting with "../") as batches of events.
func load(t *testing.T, files []string) (gomatrixserverlib.RoomVersion, [][]gomatrixserverlib.PDU, *source) {
	t.Helper()
	paths := make([]string, len(files))
	for i, f := range files {
		paths[i] = filepath.Join(rumaDir(), "fixtures", f)
		if strings.HasPrefix(f, "../") {
			paths[i] = f
		}
	}
	version, batches, events, err := testrooms.LoadFixtures(paths)
	if err != nil {
		t.Fatal(err)
	}
	return version, batches, &source{events: events, rejected: map[string]bool{}}
}

func single(p gomatrixserverlib.PDU) specres.StateMap {
	return specres.StateMap{{Type: p.Type(), StateKey: *p.StateKey()}: p.EventID()}
}

// replay resolves the DAG event by event with specres: the state before an event
// resolves the states after its prev_events; the event joins the state when it
// passes the rules against the state before it; the result resolves the leaves.
func replay(version gomatrixserverlib.RoomVersion, events []gomatrixserverlib.PDU, src *source) (specres.StateMap, error) {
	after := map[string]specres.StateMap{}
	hasChild := map[string]bool{}
	for len(after) < len(events) {
		progressed := false
		for _, e := range events {
			if _, done := after[e.EventID()]; done {
				continue
			}
			var prevs []specres.StateMap
			for _, p := range e.PrevEventIDs() {
				if s, ok := after[p]; ok {
					prevs = append(prevs, s)
				}
			}
			if len(prevs) < len(e.PrevEventIDs()) {
				continue
			}
			before, err := specres.Resolve(version, prevs, src, authrules.Authorize)
			if err != nil {
				return nil, fmt.Errorf("before %s: %w", e.EventID(), err)
			}
			auth, err := specres.AuthEventsFrom(version, e, before, src)
			if err != nil {
				return nil, err
			}
			s := specres.StateMap{}
			for k, v := range before {
				s[k] = v
			}
			if authrules.Authorize(e, auth) == nil {
				s[specres.Key{Type: e.Type(), StateKey: *e.StateKey()}] = e.EventID()
			} else {
				src.rejected[e.EventID()] = true
			}
			after[e.EventID()] = s
			for _, p := range e.PrevEventIDs() {
				hasChild[p] = true
			}
			progressed = true
		}
		if !progressed {
			return nil, errors.New("prev_events missing or cyclic")
		}
	}
	var leaves []specres.StateMap
	for _, e := range events {
		if !hasChild[e.EventID()] {
			leaves = append(leaves, after[e.EventID()])
		}
	}
	return specres.Resolve(version, leaves, src, authrules.Authorize)
}

func diff(got, want specres.StateMap) string {
	var out []string
	keys := map[specres.Key]bool{}
	for k := range got {
		keys[k] = true
	}
	for k := range want {
		keys[k] = true
	}
	for k := range keys {
		if got[k] != want[k] {
			out = append(out, fmt.Sprintf("(%s, %q): got %q, want %q", k.Type, k.StateKey, got[k], want[k]))
		}
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

func readExpected(t *testing.T, name string) specres.StateMap {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(rumaDir(), "expected", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var evs []struct {
		Type     string `json:"type"`
		StateKey string `json:"state_key"`
		EventID  string `json:"event_id"`
	}
	if err := json.Unmarshal(b, &evs); err != nil {
		t.Fatal(err)
	}
	out := specres.StateMap{}
	for _, e := range evs {
		out[specres.Key{Type: e.Type, StateKey: e.StateKey}] = e.EventID
	}
	return out
}

// TestRumaVectors: the reference gives Ruma's expected state on each of the nine
// Ruma cases in each of their modes (iterative replay, batch by batch, atomic,
// state maps), as package resolver must.
func TestRumaVectors(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(rumaDir(), "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases struct {
		Cases []struct {
			Name      string   `json:"name"`
			Mode      string   `json:"mode"`
			PDUs      []string `json:"pdus"`
			StateMaps []string `json:"state_maps"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases.Cases) != 9 {
		t.Fatalf("%d cases, want 9", len(cases.Cases))
	}
	for _, c := range cases.Cases {
		want := readExpected(t, c.Name)
		version, batches, src := load(t, c.PDUs)
		var all []gomatrixserverlib.PDU
		for _, bt := range batches {
			all = append(all, bt...)
		}
		check := func(mode string, got specres.StateMap, err error) {
			if err != nil {
				t.Errorf("%s %s: %v", c.Name, mode, err)
			} else if d := diff(got, want); d != "" {
				t.Errorf("%s %s: %s", c.Name, mode, d)
			}
		}
		switch c.Mode {
		case "batches":
			got, err := replay(version, all, &source{events: src.events, rejected: map[string]bool{}})
			check("iterative", got, err)
			var prev specres.StateMap
			for i, bt := range batches {
				var maps []specres.StateMap
				if i > 0 {
					maps = append(maps, prev)
				}
				for _, p := range bt {
					maps = append(maps, single(p))
				}
				if prev, err = specres.Resolve(version, maps, src, authrules.Authorize); err != nil {
					break
				}
			}
			check("batch", prev, err)
			var maps []specres.StateMap
			for _, p := range all {
				maps = append(maps, single(p))
			}
			got, err = specres.Resolve(version, maps, src, authrules.Authorize)
			check("atomic", got, err)
		case "state_maps":
			var maps []specres.StateMap
			for _, f := range c.StateMaps {
				b, err := os.ReadFile(filepath.Join(rumaDir(), "fixtures", f))
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				if err := json.Unmarshal(b, &ids); err != nil {
					t.Fatal(err)
				}
				m := specres.StateMap{}
				for _, id := range ids {
					p, err := src.Event(id)
					if err != nil {
						t.Fatalf("%s: %v", f, err)
					}
					m[specres.Key{Type: p.Type(), StateKey: *p.StateKey()}] = id
				}
				maps = append(maps, m)
			}
			got, err := specres.Resolve(version, maps, src, authrules.Authorize)
			check("state_maps", got, err)
		default:
			t.Fatalf("%s: unknown mode %q", c.Name, c.Mode)
		}
	}
}

// TestMainlineScenario: the mainline-ordering room of resolver/testdata/reused-ids
// resolves to topic $T3 and power levels $02-m-room-power_levels-alice (its
// README says why), atomically and by replay.
func TestMainlineScenario(t *testing.T) {
	version, batches, src := load(t, []string{"bootstrap-public-chat.json",
		"../testdata/reused-ids/mainline-alice.json", "../testdata/reused-ids/mainline-bob.json"})
	var all []gomatrixserverlib.PDU
	var maps []specres.StateMap
	for _, bt := range batches {
		all = append(all, bt...)
	}
	for _, p := range all {
		maps = append(maps, single(p))
	}
	topic, pl := specres.Key{Type: "m.room.topic"}, specres.Key{Type: "m.room.power_levels"}
	atomic, err := specres.Resolve(version, maps, src, authrules.Authorize)
	if err != nil {
		t.Fatal(err)
	}
	replayed, err := replay(version, all, &source{events: src.events, rejected: map[string]bool{}})
	if err != nil {
		t.Fatal(err)
	}
	for mode, got := range map[string]specres.StateMap{"atomic": atomic, "replay": replayed} {
		if got[topic] != "$T3" || got[pl] != "$02-m-room-power_levels-alice" {
			t.Errorf("%s: topic %s, power levels %s; want $T3, $02-m-room-power_levels-alice", mode, got[topic], got[pl])
		}
	}
}

// TestErrors: unsupported versions and missing events are errors naming what.
func TestErrors(t *testing.T) {
	src := &source{events: map[string]gomatrixserverlib.PDU{}, rejected: map[string]bool{}}
	for _, v := range []gomatrixserverlib.RoomVersion{"1", "13", "org.example.custom", ""} {
		if _, err := specres.Resolve(v, nil, src, authrules.Authorize); !errors.Is(err, specres.ErrUnsupported) {
			t.Errorf("version %q: %v, want ErrUnsupported", v, err)
		}
	}
	_, err := specres.Resolve("10", []specres.StateMap{{{Type: "m.room.topic"}: "$missing"}}, src, authrules.Authorize)
	if !errors.Is(err, specres.ErrInput) || !strings.Contains(err.Error(), "$missing") {
		t.Errorf("missing event: %v", err)
	}
}

// roomEvents imports a room directory into a memory store (for parsing only: the
// room's PDUs in stored order) and returns its version and events.
func roomEvents(t *testing.T, dir string) (gomatrixserverlib.RoomVersion, []gomatrixserverlib.PDU) {
	t.Helper()
	room, err := testrooms.ImportReplayed(packstore.NewMemStorage(), dir)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := room.EventIDs()
	if err != nil {
		t.Fatal(err)
	}
	events := make([]gomatrixserverlib.PDU, len(ids))
	for i, id := range ids {
		if events[i], err = room.Event(id); err != nil {
			t.Fatal(err)
		}
	}
	return gomatrixserverlib.RoomVersion(room.Head().RoomVersion), events
}

// referenceReplay replays events (a topological order) through the reference:
// the state before an event resolves the states after its prev_events (those the
// room holds), the event is rejected when it fails the rules on its own auth
// events (authrules.CheckAuthEvents, then the rules against them) or against the
// state before it; the state after is the state before plus the event unless
// rejected or not a state event. It returns the state after each event.
func referenceReplay(t *testing.T, version gomatrixserverlib.RoomVersion, events []gomatrixserverlib.PDU) map[string]specres.StateMap {
	t.Helper()
	src := &source{events: map[string]gomatrixserverlib.PDU{}, rejected: map[string]bool{}}
	for _, e := range events {
		src.events[e.EventID()] = e
	}
	var create gomatrixserverlib.PDU
	after := map[string]specres.StateMap{}
	for _, e := range events {
		if e.Type() == "m.room.create" && e.StateKeyEquals("") {
			create = e
		}
		var prevs []specres.StateMap
		for _, p := range e.PrevEventIDs() {
			if s, ok := after[p]; ok {
				prevs = append(prevs, s)
			}
		}
		before, err := specres.Resolve(version, prevs, src, authrules.Authorize)
		if err != nil {
			t.Fatalf("before %s: %v", e.EventID(), err)
		}
		var own []gomatrixserverlib.PDU
		missing := false
		for _, a := range e.AuthEventIDs() {
			if p, ok := src.events[a]; ok {
				own = append(own, p)
			} else {
				missing = true
			}
		}
		rejected := missing || authrules.CheckAuthEvents(e, own, src.Rejected, create) != nil || authrules.Authorize(e, own) != nil
		if !rejected {
			state, err := specres.AuthEventsFrom(version, e, before, src)
			if err != nil {
				t.Fatal(err)
			}
			rejected = authrules.Authorize(e, state) != nil
		}
		s := clone(before)
		if rejected {
			src.rejected[e.EventID()] = true
		} else if e.StateKey() != nil {
			s[specres.Key{Type: e.Type(), StateKey: *e.StateKey()}] = e.EventID()
		}
		after[e.EventID()] = s
	}
	return after
}

func clone(s specres.StateMap) specres.StateMap {
	out := make(specres.StateMap, len(s))
	for k, v := range s {
		out[k] = v
	}
	return out
}

// TestRealRooms replays each bundled real room of room version 2 or later
// through the reference and compares the state after every event with the state
// its server recorded.
func TestRealRooms(t *testing.T) {
	dirs, err := recorded.RecordingDirs(filepath.Join(testrooms.Dir(), "real"))
	if err != nil {
		t.Fatal(err)
	}
	rooms, states := 0, 0
	for _, dir := range dirs {
		version, events := roomEvents(t, dir)
		if version == "1" {
			continue
		}
		exp, err := recorded.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		after := referenceReplay(t, version, events)
		rooms++
		for _, es := range exp.After {
			got, ok := after[es.EventID]
			if !ok {
				continue
			}
			want := specres.StateMap{}
			for k, id := range es.State {
				typ, sk, _ := strings.Cut(k, "\x00")
				want[specres.Key{Type: typ, StateKey: sk}] = id
			}
			states++
			if d := diff(got, want); d != "" {
				t.Errorf("%s, after %s: %s", filepath.Base(dir), es.EventID, d)
			}
		}
	}
	t.Logf("%d rooms, %d recorded states compared", rooms, states)
	if rooms < 150 || states < 2500 {
		t.Errorf("%d rooms, %d states: the bundled rooms are missing", rooms, states)
	}
}
