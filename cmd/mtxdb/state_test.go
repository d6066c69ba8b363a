package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCLIStateQuotesFields: a state_key holding a tab and a newline is printed
// Go-quoted, so the entry stays one line of three fields; with --json each entry
// is one JSON object holding the state_key as it is.
func TestCLIStateQuotesFields(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join(room("room003"), "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var last map[string]any // a message of the room's creator, who may set any state
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
		t.Fatal(err)
	}
	const key = "a\tb\nc"
	ev := map[string]any{"event_id": "$tab:server1.test", "room_id": last["room_id"], "sender": last["sender"],
		"origin": last["origin"], "origin_server_ts": last["origin_server_ts"], "depth": last["depth"].(float64) + 1,
		"type": "m.room.topic", "state_key": key, "content": map[string]any{"topic": "tabs"},
		"prev_events": []any{[]any{last["event_id"], map[string]any{"sha256": "AAAA"}}}, "auth_events": last["auth_events"]}
	in := filepath.Join(dir, "events.jsonl")
	if err := os.WriteFile(in, []byte(strings.Join(append(lines, hashedPDU(t, ev)), "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(dir, "s")
	mustRun(t, "import", "--store", store, in)
	mustRun(t, "replay", "--store", store)
	roomID := last["room_id"].(string)

	out := mustRun(t, "state", "--store", store, "--room", roomID)
	want := "m.room.topic\t\"a\\tb\\nc\"\t$tab:server1.test\n"
	if !strings.Contains(out, want) {
		t.Errorf("state: no line %q\n%s", want, out)
	}
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if strings.Count(l, "\t") != 2 {
			t.Errorf("state: line %q has not three fields", l)
		}
	}

	out = mustRun(t, "state", "--store", store, "--room", roomID, "--json")
	found := false
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var e map[string]string
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("state --json: line %q: %v", l, err)
		}
		if e["kind"] != "state" || e["type"] == "" || e["event_id"] == "" {
			t.Errorf("state --json: line %q is not a state entry", l)
		}
		found = found || e["state_key"] == key && e["event_id"] == "$tab:server1.test"
	}
	if !found {
		t.Errorf("state --json: no entry with state_key %q\n%s", key, out)
	}
}
