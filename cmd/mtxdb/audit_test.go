package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/testrooms"
)

// TestCLIAudit: a generated room (its recorded state is the spec's) audits
// clean; then the state after chosen events is edited in its recording, one
// edit per event, a state reset of each kind the room allows (a ban undone, a
// member removed, power levels reverted, a topic reverted and a later one
// taken, an entry lost, an entry added, an event the server did not apply, an
// event the rules reject applied), and audit --json reports exactly those
// findings, with exit status 2, and the same counts in its summary.
func TestCLIAudit(t *testing.T) {
	dir := t.TempDir()
	roomDir, store := filepath.Join(dir, "r"), filepath.Join(dir, "s")
	for _, args := range [][]string{
		{"gen", "--out", roomDir, "--events", "600", "--servers", "2", "--bad-rate", "0.05", "--seed", "7"},
		{"import", "--store", store, roomDir},
		{"replay", "--store", store},
	} {
		if o, code := run(t, args...); code != 0 {
			t.Fatalf("%v: exit %d\n%s", args, code, o)
		}
	}
	if o, code := run(t, "audit", "--store", store, "--expected", roomDir); code != 0 || !strings.Contains(o, "audit: rooms=1 events=600 findings=0 problems=0") {
		t.Fatalf("the room as generated: exit %d\n%s", code, o)
	}
	if o, code := run(t, "audit", "--store", store); code != 1 || !strings.Contains(o, "no recorded state to audit") {
		t.Errorf("no recorded/ and no --expected: exit %d\n%s", code, o)
	}
	want := injectResets(t, roomDir)
	o, code := run(t, "audit", "--store", store, "--expected", roomDir, "--json")
	if code != 2 {
		t.Fatalf("after the edits: exit %d, want 2\n%s", code, o)
	}
	var got []string
	counts := map[string]int{}
	byKey, keyEvents, keyLast := map[string]string{}, map[string]int{}, map[string]string{}
	for _, f := range jsonLines(t, o) {
		switch f["kind"] {
		case "finding":
			got = append(got, fmt.Sprintf("%s %s %s", f["event"], f["key"], f["finding"]))
			counts[f["finding"].(string)]++
			k := f["room"].(string) + " " + f["key"].(string)
			if byKey[k] == "" {
				byKey[k] = fmt.Sprintf("%s first=%s", f["finding"], f["event"])
				keyEvents[k] = 0
			}
			keyEvents[k]++
			keyLast[k] = f["event"].(string)
		case "audit":
			for k, n := range counts {
				if f[k] != float64(n) {
					t.Errorf("summary %s=%v, want %d", k, f[k], n)
				}
			}
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("findings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// --by-key: a line per key, summing the findings above in their order.
	o, code = run(t, "audit", "--store", store, "--expected", roomDir, "--json", "--by-key")
	if code != 2 {
		t.Fatalf("--by-key: exit %d\n%s", code, o)
	}
	keys := 0
	for _, f := range jsonLines(t, o) {
		switch f["kind"] {
		case "finding":
			t.Errorf("--by-key printed a finding line: %v", f)
		case "key":
			keys++
			k := f["room"].(string) + " " + f["key"].(string)
			if g := fmt.Sprintf("%s first=%s", f["finding"], f["first"]); g != byKey[k] || f["events"] != float64(keyEvents[k]) || f["last"] != keyLast[k] {
				t.Errorf("--by-key %s: %s events=%v last=%v, want %s events=%d last=%s", k, g, f["events"], f["last"], byKey[k], keyEvents[k], keyLast[k])
			}
		}
	}
	if keys != len(byKey) || keys == 0 {
		t.Errorf("--by-key: %d key lines, want %d", keys, len(byKey))
	}
}

// jsonLines decodes the --json output o, a JSON object per line.
func jsonLines(t *testing.T, o string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(o), "\n") {
		var f map[string]any
		if err := json.Unmarshal([]byte(line), &f); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		out = append(out, f)
	}
	return out
}

// genEvent is what injectResets reads of a generated room's events.
type genEvent struct {
	ID         string
	Type       string
	StateKey   *string `json:"state_key"`
	Membership string
	Seq        int
}

// injectResets edits the recorded state after some events of a generated room
// (each event edited once, one key) and returns the findings audit must report:
// "EVENT KEY KIND" with KEY as type|state_key.
func injectResets(t *testing.T, roomDir string) []string {
	t.Helper()
	events := map[string]genEvent{}
	var order []string
	eachLine(t, filepath.Join(roomDir, "events.jsonl"), func(b []byte) {
		var e struct {
			EventID  string  `json:"event_id"`
			Type     string  `json:"type"`
			StateKey *string `json:"state_key"`
			Content  struct {
				Membership string `json:"membership"`
			} `json:"content"`
		}
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatal(err)
		}
		events[e.EventID] = genEvent{e.EventID, e.Type, e.StateKey, e.Content.Membership, len(order)}
		order = append(order, e.EventID)
	})
	type line struct {
		EventID    string            `json:"event_id"`
		State      map[string]string `json:"state"`
		StateGroup any               `json:"state_group,omitempty"`
	}
	var lines []line
	eachLine(t, filepath.Join(roomDir, "expected_state.jsonl"), func(b []byte) {
		var l line
		if err := json.Unmarshal(b, &l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	})
	// the rejected events are those no recorded state names
	named := map[string]bool{}
	for _, l := range lines {
		for _, v := range l.State {
			named[v] = true
		}
	}
	used := map[int]bool{}
	const extraKey = "x.audit.test\x00"
	var want []string
	// edit finds a line after which the state holds a key matching ok (and not
	// the line's own event, unless own), applies change and records kind at the
	// key change names (the key it was given, or x.audit.test).
	edit := func(kind string, own bool, ok func(ev genEvent, key string) bool, change func(st map[string]string, key string) bool) {
		t.Helper()
		for i := len(lines) / 3; i < len(lines); i++ {
			if used[i] {
				continue
			}
			for _, key := range slices.Sorted(mapsKeys(lines[i].State)) {
				v := lines[i].State[key]
				if (v == lines[i].EventID) != own || !ok(events[v], key) {
					continue
				}
				if !change(lines[i].State, key) {
					continue
				}
				used[i] = true
				if _, ok := lines[i].State[extraKey]; ok {
					key = extraKey
				}
				want = append(want, fmt.Sprintf("%s %s %s", lines[i].EventID, strings.Replace(key, "\x00", "|", 1), kind))
				return
			}
		}
		t.Fatalf("the generated room has no state to edit into %s", kind)
	}
	typ := func(ty string) func(genEvent, string) bool {
		return func(ev genEvent, _ string) bool { return ev.Type == ty }
	}
	membership := func(m string) func(genEvent, string) bool {
		return func(ev genEvent, _ string) bool { return ev.Type == "m.room.member" && ev.Membership == m }
	}
	remove := func(st map[string]string, key string) bool { delete(st, key); return true }
	// other sets the key to another event of the key, earlier (before) or later.
	other := func(before bool) func(map[string]string, string) bool {
		return func(st map[string]string, key string) bool {
			cur := events[st[key]]
			for _, id := range order {
				e := events[id]
				if e.StateKey != nil && e.Type+"\x00"+*e.StateKey == key && named[id] && (e.Seq < cur.Seq) == before && id != cur.ID {
					st[key] = id
					return true
				}
			}
			return false
		}
	}
	edit("ban_undone", false, membership("ban"), remove)
	edit("member_removed", false, membership("join"), remove)
	edit("power_levels_reverted", false, typ("m.room.power_levels"), other(true))
	edit("reverted", false, typ("m.room.topic"), other(true))
	edit("differs", false, typ("m.room.topic"), other(false))
	edit("lost", false, typ("m.room.history_visibility"), remove)
	edit("extra", false, typ("m.room.create"), func(st map[string]string, key string) bool {
		st[extraKey] = st[key]
		return true
	})
	edit("rejected_accepted", true, typ("m.room.topic"), other(true))
	edit("accepted_rejected", false, typ("m.room.member"), func(st map[string]string, key string) bool {
		for _, id := range order {
			if e := events[id]; !named[id] && e.StateKey != nil && e.Type == "m.room.member" {
				st[key] = id
				return true
			}
		}
		return false
	})
	f, err := os.Create(filepath.Join(roomDir, "expected_state.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	for _, l := range lines {
		if err := enc.Encode(l); err != nil {
			t.Fatal(err)
		}
	}
	return want
}

// eachLine calls fn with each line of the file (benchrepack's readLines).
func eachLine(t *testing.T, path string, fn func([]byte)) {
	t.Helper()
	lines, err := readLines(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		fn(l)
	}
}

func mapsKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestCLIAuditUnreadableRecordings: in a store's recorded/, a recording an
// import left unfinished (*.tmp) is skipped with a warning, and one that
// cannot be compared (a room without events: no state recorded) is a problem
// line while every other room is still audited (server A's partition
// database, testrooms/dendrite).
func TestCLIAuditUnreadableRecordings(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	for _, args := range [][]string{
		{"import", "--store", store, "--from", "dendrite:" + filepath.Join(testrooms.Dir(), "dendrite", "partition-stock-A.db")},
		{"replay", "--store", store},
	} {
		if o, code := run(t, args...); code != 0 {
			t.Fatalf("%v: exit %d\n%s", args, code, o)
		}
	}
	rec := filepath.Join(store, recordedSubdir)
	entries, err := os.ReadDir(rec)
	if err != nil || len(entries) == 0 {
		t.Fatalf("recorded/: %v", err)
	}
	if err := os.CopyFS(filepath.Join(rec, entries[0].Name()+".tmp"), os.DirFS(filepath.Join(rec, entries[0].Name()))); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(rec, "empty")
	for name, body := range map[string]string{"meta.json": `{"room_id":"!empty:x","room_version":"10","counts":{"events":0},"expected_state":{"lines":0}}`,
		"expected_state.jsonl": "", "state_groups.jsonl": "", "current_state.json": "{}"} {
		if err := os.MkdirAll(empty, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(empty, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	o, code := run(t, "audit", "--store", store)
	if code != 2 || !strings.Contains(o, "records no state") || !strings.Contains(o, ".tmp is a recording an import did not finish: skipped") ||
		!strings.Contains(o, fmt.Sprintf("audit: rooms=%d ", len(entries))) || !strings.Contains(o, "problems=1") {
		t.Fatalf("exit %d\n%s", code, o)
	}
}
