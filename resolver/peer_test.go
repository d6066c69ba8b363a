package resolver_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/pdu"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/mtxdb/mtxdb/authrules"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/resolver/specres"
	"github.com/mtxdb/mtxdb/testrooms"
)

var update = flag.Bool("update", false, "rewrite testdata/conformance.md")

type peerCase struct {
	Name      string   `json:"name"`
	Mode      string   `json:"mode"`
	PDUs      []string `json:"pdus"`
	StateMaps []string `json:"state_maps"`
}

type peerSource struct {
	events   map[string]gomatrixserverlib.PDU
	rejected map[string]bool
}

func (s *peerSource) Event(id string) (gomatrixserverlib.PDU, error) {
	if p, ok := s.events[id]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("no event %s", id)
}

func (s *peerSource) Rejected(id string) bool { return s.rejected[id] }

func peerDir() string { return testrooms.RumaDir() }

// peerCases reads the Ruma cases' list (cases.json).
func peerCases(t *testing.T) []peerCase {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(peerDir(), "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases struct {
		Cases []peerCase `json:"cases"`
	}
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatal(err)
	}
	return cases.Cases
}

// loadBatches reads a case's PDU files (testrooms.LoadFixtures): one batch per
// file. A name is a file of the Ruma fixtures, or a path starting with "testdata/".
func loadBatches(t *testing.T, files []string) (gomatrixserverlib.RoomVersion, [][]gomatrixserverlib.PDU, *peerSource) {
	t.Helper()
	paths := make([]string, len(files))
	for i, f := range files {
		paths[i] = filepath.Join(peerDir(), "fixtures", f)
		if strings.HasPrefix(f, "testdata/") {
			paths[i] = f
		}
	}
	version, batches, events, err := testrooms.LoadFixtures(paths)
	if err != nil {
		t.Fatal(err)
	}
	return version, batches, &peerSource{events: events, rejected: map[string]bool{}}
}

func expected(t *testing.T, name string) resolver.StateMap {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(peerDir(), "expected", name+".json"))
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
	out := resolver.StateMap{}
	for _, e := range evs {
		out[resolver.Key{Type: e.Type, StateKey: e.StateKey}] = e.EventID
	}
	return out
}

func single(p gomatrixserverlib.PDU) resolver.StateMap {
	return resolver.StateMap{{Type: p.Type(), StateKey: *p.StateKey()}: p.EventID()}
}

// iterative replays the DAG: the state before an event resolves the states after its
// prev_events; the event joins the state when it passes authorization against the
// state before it. The result resolves the states after the leaves.
func iterative(version gomatrixserverlib.RoomVersion, events []gomatrixserverlib.PDU, src *peerSource) (resolver.StateMap, error) {
	after := map[string]resolver.StateMap{}
	hasChild := map[string]bool{}
	done := map[string]bool{}
	for len(done) < len(events) {
		progressed := false
		for _, e := range events {
			if done[e.EventID()] {
				continue
			}
			ready := true
			var prevs []resolver.StateMap
			for _, p := range e.PrevEventIDs() {
				s, ok := after[p]
				if !ok {
					ready = false
					break
				}
				prevs = append(prevs, s)
			}
			if !ready {
				continue
			}
			before, err := resolver.ResolveMaps(version, prevs, src)
			if err != nil {
				return nil, fmt.Errorf("before %s: %w", e.EventID(), err)
			}
			s := resolver.StateMap{}
			for k, v := range before {
				s[k] = v
			}
			if err := resolver.AuthorizeAgainst(e, before, src); err == nil {
				s[resolver.Key{Type: e.Type(), StateKey: *e.StateKey()}] = e.EventID()
			} else {
				src.rejected[e.EventID()] = true
			}
			after[e.EventID()] = s
			for _, p := range e.PrevEventIDs() {
				hasChild[p] = true
			}
			done[e.EventID()] = true
			progressed = true
		}
		if !progressed {
			return nil, fmt.Errorf("prev_events missing or cyclic")
		}
	}
	var leaves []resolver.StateMap
	for _, e := range events {
		if !hasChild[e.EventID()] {
			leaves = append(leaves, after[e.EventID()])
		}
	}
	return resolver.ResolveMaps(version, leaves, src)
}

func diffMaps(got, want resolver.StateMap) string {
	var out []string
	keys := map[resolver.Key]bool{}
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

// gmslAtomic resolves all PDUs at once with gomatrixserverlib's ResolveConflicts
// (each PDU its own state, all PDUs as auth events), the way the notes ran it.
func gmslAtomic(version gomatrixserverlib.RoomVersion, events, authEvents []gomatrixserverlib.PDU) (out resolver.StateMap, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("panic: %v", r)
		}
	}()
	res, err := gomatrixserverlib.ResolveConflicts(version, events, authEvents, pdu.UserIDForSender, func(string) bool { return false })
	if err != nil {
		return nil, err
	}
	out = resolver.StateMap{}
	for _, p := range res {
		out[resolver.Key{Type: p.Type(), StateKey: *p.StateKey()}] = p.EventID()
	}
	return out, nil
}

// TestPeerVectors runs the Ruma cases of testrooms/peer/ruma in each of their modes
// through our resolver (all must equal Ruma's expected state) and through
// gomatrixserverlib's ResolveConflicts (recorded, not required), and checks the
// conformance table in testdata/conformance.md (-update rewrites it).
func TestPeerVectors(t *testing.T) {
	cases := peerCases(t)
	if len(cases) != 9 {
		t.Fatalf("%d cases, want the 9 handed over", len(cases))
	}
	var table []string
	table = append(table, "| case | mode | ours | gomatrixserverlib ResolveConflicts |", "|---|---|---|---|")
	for _, c := range cases {
		want := expected(t, c.Name)
		version, batches, src := loadBatches(t, c.PDUs)
		var all []gomatrixserverlib.PDU
		for _, bt := range batches {
			all = append(all, bt...)
		}
		verdict := func(got resolver.StateMap, err error) string {
			if err != nil {
				return "error: " + err.Error()
			}
			if d := diffMaps(got, want); d != "" {
				return "differs: " + d
			}
			return "pass"
		}
		ours := map[string]string{}
		gmslEvents := all // gomatrixserverlib gets the events of the states to resolve
		switch c.Mode {
		case "batches":
			ours["iterative"] = verdict(iterative(version, all, &peerSource{events: src.events, rejected: map[string]bool{}}))
			var prev resolver.StateMap
			var berr error
			for i, bt := range batches {
				var maps []resolver.StateMap
				if i > 0 {
					maps = append(maps, prev)
				}
				for _, p := range bt {
					maps = append(maps, single(p))
				}
				if prev, berr = resolver.ResolveMaps(version, maps, src); berr != nil {
					break
				}
			}
			ours["batch"] = verdict(prev, berr)
			var maps []resolver.StateMap
			for _, p := range all {
				maps = append(maps, single(p))
			}
			ours["atomic"] = verdict(resolver.ResolveMaps(version, maps, src))
		case "state_maps":
			var maps []resolver.StateMap
			for _, f := range c.StateMaps {
				b, err := os.ReadFile(filepath.Join(peerDir(), "fixtures", f))
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				if err := json.Unmarshal(b, &ids); err != nil {
					t.Fatal(err)
				}
				m := resolver.StateMap{}
				for _, id := range ids {
					p, err := src.Event(id)
					if err != nil {
						t.Fatalf("%s: %v", f, err)
					}
					m[resolver.Key{Type: p.Type(), StateKey: *p.StateKey()}] = id
				}
				maps = append(maps, m)
			}
			gmslEvents = nil
			for _, m := range maps {
				for _, id := range m {
					p, _ := src.Event(id)
					gmslEvents = append(gmslEvents, p)
				}
			}
			ours["state_maps"] = verdict(resolver.ResolveMaps(version, maps, src))
		default:
			t.Fatalf("case %s: unknown mode %q", c.Name, c.Mode)
		}
		gmsl := verdict(gmslAtomic(version, gmslEvents, all))
		modes := make([]string, 0, len(ours))
		for m := range ours {
			modes = append(modes, m)
		}
		sort.Strings(modes)
		for _, m := range modes {
			if ours[m] != "pass" {
				t.Errorf("case %s, mode %s: %s", c.Name, m, ours[m])
			}
			g := "—"
			if m == "atomic" || m == "state_maps" {
				g = shortVerdict(gmsl)
			}
			table = append(table, fmt.Sprintf("| %s | %s | %s | %s |", c.Name, m, shortVerdict(ours[m]), g))
		}
		if gmsl != "pass" {
			t.Logf("gomatrixserverlib on %s: %s", c.Name, gmsl)
		}
	}
	got := strings.Join(table, "\n") + "\n"
	golden := filepath.Join("testdata", "conformance.md")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	wantTable, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(wantTable) != got {
		t.Errorf("conformance table changed (run with -update and review the diff):\n%s", got)
	}
}

func shortVerdict(v string) string {
	if v == "pass" {
		return "pass"
	}
	if i := strings.Index(v, ":"); i > 0 {
		return v[:i] + " (" + strings.TrimSpace(v[i+1:]) + ")"
	}
	return v
}

// TestResolutionIgnoresEarlierRooms resolves the Ruma cases and the rooms of
// testdata/reused-ids (whose made-up IDs name other events in the Ruma rooms;
// see its README) in one process, in file order and then backwards, every mode
// each time: each result must equal its expected state whatever ran before it.
func TestResolutionIgnoresEarlierRooms(t *testing.T) {
	type room struct {
		name  string
		files []string
		want  resolver.StateMap
	}
	cases := peerCases(t)
	var rooms []room
	for _, c := range cases {
		if c.Mode == "batches" {
			rooms = append(rooms, room{c.Name, c.PDUs, expected(t, c.Name)})
		}
	}
	// The mainline scenario goes last in file order: after topic_vs_power_levels,
	// whose $02-m-room-power_levels-alice has bob at 0.
	rooms = append(rooms, room{"reused-ids/mainline",
		[]string{"bootstrap-public-chat.json", "testdata/reused-ids/mainline-alice.json", "testdata/reused-ids/mainline-bob.json"},
		nil})
	_, _, src := loadBatches(t, rooms[len(rooms)-1].files)
	rooms[len(rooms)-1].want = resolver.StateMap{}
	for id, p := range src.events {
		if id != "$TA" && id != "$PB" && id != "$T4" && id != "$T3" && id != "$02-m-room-power_levels-alice" {
			rooms[len(rooms)-1].want[resolver.Key{Type: p.Type(), StateKey: *p.StateKey()}] = id
		}
	}
	rooms[len(rooms)-1].want[resolver.Key{Type: "m.room.topic", StateKey: ""}] = "$T3"
	rooms[len(rooms)-1].want[resolver.Key{Type: "m.room.power_levels", StateKey: ""}] = "$02-m-room-power_levels-alice"

	check := func(order string, r room) {
		version, batches, src := loadBatches(t, r.files)
		var all []gomatrixserverlib.PDU
		var maps []resolver.StateMap
		for _, bt := range batches {
			all = append(all, bt...)
		}
		for _, p := range all {
			maps = append(maps, single(p))
		}
		got, err := resolver.ResolveMaps(version, maps, src)
		if err != nil {
			t.Fatalf("%s, %s atomic: %v", order, r.name, err)
		}
		if d := diffMaps(got, r.want); d != "" {
			t.Errorf("%s, %s atomic: %s", order, r.name, d)
		}
		got, err = iterative(version, all, &peerSource{events: src.events, rejected: map[string]bool{}})
		if err != nil {
			t.Fatalf("%s, %s iterative: %v", order, r.name, err)
		}
		if d := diffMaps(got, r.want); d != "" {
			t.Errorf("%s, %s iterative: %s", order, r.name, d)
		}
	}
	for _, r := range rooms {
		check("in file order", r)
	}
	for i := len(rooms) - 1; i >= 0; i-- {
		check("backwards", rooms[i])
	}
}

// TestSenderLevelFromItsAuthEvents replays testdata/sender-level (see its README):
// the reverse topological power ordering ranks bob by the power levels his join
// rules event cites, not by the state's, so his $JB is applied last. The
// reference (specres) must agree.
func TestSenderLevelFromItsAuthEvents(t *testing.T) {
	files := []string{"bootstrap-public-chat.json", "testdata/sender-level/join-rules.json"}
	version, batches, src := loadBatches(t, files)
	var all []gomatrixserverlib.PDU
	for _, bt := range batches {
		all = append(all, bt...)
	}
	got, err := iterative(version, all, &peerSource{events: src.events, rejected: map[string]bool{}})
	if err != nil {
		t.Fatal(err)
	}
	jr := resolver.Key{Type: "m.room.join_rules", StateKey: ""}
	if got[jr] != "$JB" {
		t.Errorf("join rules %s, want $JB", got[jr])
	}
	// The same merge through the reference.
	after := func(ids ...string) specres.StateMap {
		m := specres.StateMap{}
		for _, p := range all {
			if p.EventID() == "$JA" || p.EventID() == "$JB" {
				continue
			}
			m[specres.Key{Type: p.Type(), StateKey: *p.StateKey()}] = p.EventID()
		}
		for _, id := range ids {
			p := src.events[id]
			m[specres.Key{Type: p.Type(), StateKey: *p.StateKey()}] = id
		}
		return m
	}
	ref, err := specres.Resolve(version, []specres.StateMap{after("$JA"), after("$JB")}, src, authrules.Authorize)
	if err != nil {
		t.Fatal(err)
	}
	if ref[specres.Key{Type: "m.room.join_rules"}] != "$JB" {
		t.Errorf("reference: join rules %s, want $JB", ref[specres.Key{Type: "m.room.join_rules"}])
	}
}
