package roomrules

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/mtxdb/mtxdb/authrules"
	"github.com/mtxdb/mtxdb/testrooms"
)

// fixtures loads Ruma fixture files (testrooms.LoadFixtures) and returns the room
// version, every event by ID and a Source over them with the given rejections.
func fixtures(t *testing.T, files []string, rejected map[string]bool) (gomatrixserverlib.RoomVersion, map[string]gomatrixserverlib.PDU, Source) {
	t.Helper()
	paths := make([]string, len(files))
	for i, f := range files {
		paths[i] = filepath.Join(testrooms.RumaDir(), "fixtures", f)
	}
	version, _, events, err := testrooms.LoadFixtures(paths)
	if err != nil {
		t.Fatal(err)
	}
	src := Source{
		Load: func(ids []string) ([]gomatrixserverlib.PDU, error) {
			var out []gomatrixserverlib.PDU
			for _, id := range ids {
				if p, ok := events[id]; ok {
					out = append(out, p)
				}
			}
			return out, nil
		},
		Rejected: func(id string) bool { return rejected[id] },
	}
	return version, events, src
}

func readIDs(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	if err := json.Unmarshal(b, &ids); err != nil {
		ids = nil // a list of events, not of IDs
		var evs []struct {
			EventID string `json:"event_id"`
		}
		if err := json.Unmarshal(b, &evs); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, e := range evs {
			ids = append(ids, e.EventID)
		}
	}
	slices.Sort(ids)
	return ids
}

// TestResolveRumaStateMaps resolves the two states of Ruma's MSC4297 problem A in
// room versions 11 (v2) and 12 (v2.1), handed over as event lists the way Dendrite
// holds them, and gets Ruma's expected state; only the event loader sees the
// auth chains.
func TestResolveRumaStateMaps(t *testing.T) {
	dir := filepath.Join(testrooms.RumaDir(), "fixtures", "MSC4297-problem-A")
	for _, c := range []struct{ pdus, expected string }{
		{"pdus-v11.json", "msc4297_problem_a_state_res_v2_0.json"},
		{"pdus-v12.json", "msc4297_problem_a_state_res_v2_1.json"},
	} {
		t.Run(c.pdus, func(t *testing.T) {
			version, events, src := fixtures(t, []string{"MSC4297-problem-A/" + c.pdus}, nil)
			var states [][]gomatrixserverlib.PDU
			for _, f := range []string{"state-bob.json", "state-charlie.json"} {
				var st []gomatrixserverlib.PDU
				for _, id := range readIDs(t, filepath.Join(dir, f)) {
					st = append(st, events[id])
				}
				states = append(states, st)
			}
			got, err := Resolve(version, states, src)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, p := range got {
				ids = append(ids, p.EventID())
			}
			want := readIDs(t, filepath.Join(testrooms.RumaDir(), "expected", c.expected))
			if !slices.Equal(ids, want) {
				t.Fatalf("resolved state\n got %v\nwant %v", ids, want)
			}
		})
	}
}

// TestResolveMissingKey: Bob's join is in one state and absent from the other, so
// its key is conflicted (the spec's conflicted state set) and resolved: the rules
// allow it, and it is kept.
func TestResolveMissingKey(t *testing.T) {
	version, events, src := fixtures(t, []string{"bootstrap-public-chat.json"}, nil)
	base := []string{"$00-m-room-create", "$00-m-room-member-join-alice", "$00-m-room-power_levels", "$00-m-room-join_rules"}
	pick := func(ids ...string) []gomatrixserverlib.PDU {
		var out []gomatrixserverlib.PDU
		for _, id := range ids {
			out = append(out, events[id])
		}
		return out
	}
	a := pick(append(slices.Clone(base), "$00-m-room-member-join-bob")...)
	b := pick(base...)
	got, err := Resolve(version, [][]gomatrixserverlib.PDU{a, b}, src)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, p := range got {
		ids = append(ids, p.EventID())
	}
	want := append(slices.Clone(base), "$00-m-room-member-join-bob")
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Fatalf("resolved %v, want %v", ids, want)
	}
}

// TestAuthorizeNamesRule: a rejection carries the rule that decided it.
func TestAuthorizeNamesRule(t *testing.T) {
	_, events, src := fixtures(t, []string{"bootstrap-public-chat.json"}, nil)
	// Alice's power levels change checked against a state without her membership.
	ev := events["$01-m-room-power_levels"]
	err := Authorize(ev, []gomatrixserverlib.PDU{events["$00-m-room-create"], events["$00-m-room-power_levels"]}, nil)
	var rule *authrules.RuleError
	if !errors.As(err, &rule) {
		t.Fatalf("got %v, want a *authrules.RuleError", err)
	}
	t.Logf("rejection: %v", err)
	// Against its own auth events it passes.
	var auth []gomatrixserverlib.PDU
	for _, id := range ev.AuthEventIDs() {
		auth = append(auth, events[id])
	}
	if err := AuthorizeReceived(ev, auth, src); err != nil {
		t.Fatalf("AuthorizeReceived: %v", err)
	}
	if err := Authorize(ev, auth, nil); err != nil {
		t.Fatalf("Authorize: %v", err)
	}
}

// TestAuthorizeReceivedRejectedEntry: an auth event that was itself rejected rejects
// the event (rule auth_events.rejected), which gomatrixserverlib's Allowed does not
// check; a duplicate key in the entries rejects it too.
func TestAuthorizeReceivedRejectedEntry(t *testing.T) {
	_, events, src := fixtures(t, []string{"bootstrap-public-chat.json"}, map[string]bool{"$00-m-room-power_levels": true})
	ev := events["$01-m-room-power_levels"]
	var auth []gomatrixserverlib.PDU
	for _, id := range ev.AuthEventIDs() {
		auth = append(auth, events[id])
	}
	err := AuthorizeReceived(ev, auth, src)
	var rule *authrules.RuleError
	if !errors.As(err, &rule) || rule.Rule.ID != "auth_events.rejected" {
		t.Fatalf("got %v, want rule auth_events.rejected", err)
	}
	_, _, clean := fixtures(t, []string{"bootstrap-public-chat.json"}, nil)
	err = AuthorizeReceived(ev, append(auth, events["$00-m-room-create"]), clean)
	if !errors.As(err, &rule) || rule.Rule.ID != "auth_events.duplicate" {
		t.Fatalf("got %v, want rule auth_events.duplicate", err)
	}
}

// TestPanicIsError: a panic below the seam comes back as ErrPanic.
func TestPanicIsError(t *testing.T) {
	version, events, src := fixtures(t, []string{"bootstrap-public-chat.json"}, nil)
	src.Load = func([]string) ([]gomatrixserverlib.PDU, error) { panic("loader broke") }
	a := []gomatrixserverlib.PDU{events["$00-m-room-create"], events["$00-m-room-join_rules"]}
	b := []gomatrixserverlib.PDU{events["$00-m-room-create"]}
	if _, err := Resolve(version, [][]gomatrixserverlib.PDU{a, b}, src); !errors.Is(err, ErrPanic) {
		t.Fatalf("Resolve: got %v, want ErrPanic", err)
	}
	ev := events["$01-m-room-power_levels"]
	var auth []gomatrixserverlib.PDU
	for _, id := range ev.AuthEventIDs() {
		auth = append(auth, events[id])
	}
	if err := AuthorizeReceived(ev, auth, Source{Rejected: func(string) bool { panic("rejected broke") }}); !errors.Is(err, ErrPanic) {
		t.Fatalf("AuthorizeReceived: got %v, want ErrPanic", err)
	}
}
