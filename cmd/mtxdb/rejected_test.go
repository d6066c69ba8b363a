package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// recipe is a recipe room of the integration tests (integration/testdata/recipes).
func recipe(name string) string {
	return filepath.Join("..", "..", "integration", "testdata", "recipes", name)
}

// TestCLIRejectionReasons: a rejected event's reason (the authorization rule) is
// shown by state --event and verify --rejected; verify counts rejected events; an
// oversized PDU is refused with its line and event ID, the rest imported, and
// --strict turns the refusal into exit status 2.
func TestCLIRejectionReasons(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	dup := recipe("dup-auth-events")
	if out, code := run(t, "import", "--store", store, dup); code != 0 || !strings.Contains(out, " refused=0 ") {
		t.Fatalf("import: exit %d\n%s", code, out)
	}
	if out, code := run(t, "replay", "--store", store); code != 0 || !strings.Contains(out, " rejected=1 ") {
		t.Fatalf("replay: exit %d\n%s", code, out)
	}
	const topic = "$3Cut47CFp74N_kZwq30-kzelH_Cms7ms8BE4rpg0A9o"
	rule := "authorization rule 2.1 of room version 10 (auth_events.duplicate"
	out, code := run(t, "state", "--store", store, "--room", "!minimal:a.test", "--event", topic)
	if code != 0 || !strings.Contains(out, "# rejected "+topic+": ") || !strings.Contains(out, rule) || strings.Contains(out, "m.room.topic") {
		t.Fatalf("state --event: exit %d\n%s", code, out)
	}
	out, code = run(t, "verify", "--store", store, "--expected", dup, "--rejected")
	if code != 0 || !strings.Contains(out, "rejected room=!minimal:a.test event="+topic+": ") || !strings.Contains(out, rule) ||
		!strings.Contains(out, " mismatches=0 problems=0 rejected=1") {
		t.Fatalf("verify --rejected: exit %d\n%s", code, out)
	}
	// --json: the rejected events are JSON objects too.
	out, code = run(t, "verify", "--store", store, "--expected", dup, "--rejected", "--json")
	found := false
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var o struct{ Kind, Room, Event, Reason string }
		if err := json.Unmarshal([]byte(line), &o); err != nil {
			t.Fatalf("verify --rejected --json printed %q (exit %d): %v", line, code, err)
		}
		found = found || o.Kind == "rejected" && o.Room == "!minimal:a.test" && o.Event == topic && strings.Contains(o.Reason, rule)
	}
	if code != 0 || !found {
		t.Fatalf("verify --rejected --json: exit %d, no rejected object\n%s", code, out)
	}

	big := recipe("oversized-mid-history")
	for _, strict := range []bool{false, true} {
		args := []string{"import", "--store", filepath.Join(t.TempDir(), "o"), big}
		want := 0
		if strict {
			args, want = append(args, "--strict"), 2
		}
		out, code := run(t, args...)
		if code != want || !strings.Contains(out, "events.jsonl line 6 (event $WDxEs5aYYoa9fvJV673VxpA3UX6z26Iv6QxYJ3ziRfQ): ") ||
			!strings.Contains(out, "65,536-byte") || !strings.Contains(out, " imported=7 ") {
			t.Fatalf("import (strict %v): exit %d\n%s", strict, code, out)
		}
	}
	out, code = run(t, "import", "--store", filepath.Join(t.TempDir(), "j"), "--json", big)
	if code != 0 || !strings.Contains(out, `{"kind":"refused","file":`) || !strings.Contains(out, `"line":6,"element":false,"event_id":"$WDxEs5aYYoa9fvJV673VxpA3UX6z26Iv6QxYJ3ziRfQ","reason":"pdu: PDU over the 65,536-byte size limit`) {
		t.Fatalf("import --json: exit %d\n%s", code, out)
	}
}

// TestCLIKeys: gen --keys writes the servers' keys; import --keys with them takes the
// whole room, with a file of other keys it refuses every PDU (exit 2 with --strict).
func TestCLIKeys(t *testing.T) {
	dir := t.TempDir()
	keys, other := filepath.Join(dir, "keys.json"), filepath.Join(dir, "other.json")
	if out, code := run(t, "gen", "--seed", "4", "--events", "100", "--servers", "2", "--out", filepath.Join(dir, "g"), "--keys", keys); code != 0 {
		t.Fatalf("gen: exit %d\n%s", code, out)
	}
	if out, code := run(t, "gen", "--seed", "5", "--events", "100", "--servers", "2", "--out", filepath.Join(dir, "h"), "--keys", other); code != 0 {
		t.Fatalf("gen: exit %d\n%s", code, out)
	}
	if out, code := run(t, "import", "--store", filepath.Join(dir, "s"), "--keys", keys, "--strict", filepath.Join(dir, "g")); code != 0 || !strings.Contains(out, "imported=100 ") {
		t.Fatalf("import --keys: exit %d\n%s", code, out)
	}
	out, code := run(t, "import", "--store", filepath.Join(dir, "t"), "--keys", other, "--strict", filepath.Join(dir, "g"))
	if code != 2 || !strings.Contains(out, "imported=0 ") || !strings.Contains(out, "signature check failed") {
		t.Fatalf("import --keys (other keys): exit %d\n%s", code, out)
	}
}
