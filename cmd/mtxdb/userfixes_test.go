package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCLIImportRefusalSpeaksFlags: an --any-order import of PDUs whose room's
// m.room.create never comes names the flag that gives the room version,
// --room-version, in its refusal lines (text and JSON), not the library's
// ImportOptions.RoomVersion.
func TestCLIImportRefusalSpeaksFlags(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join(room("room050"), "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	in := filepath.Join(dir, "nocreate.jsonl")
	if err := os.WriteFile(in, []byte(strings.Join(lines[1:3], "")), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, json := range []bool{false, true} {
		args := []string{"import", "--store", filepath.Join(dir, "s"), "--any-order", in}
		if json {
			args = append(args, "--json")
		}
		out, code := run(t, args...)
		if code != 2 || strings.Count(out, "(--room-version gives it)") != 2 || strings.Contains(out, "ImportOptions") {
			t.Errorf("%v: exit %d, want 2 and two refusals naming --room-version, none ImportOptions\n%s", args, code, out)
		}
	}
}
