package testrooms

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadExpectedNothingRecorded: a room directory that records no state at all
// is an error, not a comparison of nothing.
func TestLoadExpectedNothingRecorded(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"expected_state.jsonl": "\n",
		"meta.json":            `{"room_id":"!r:example.org"}`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := LoadExpected(dir); err == nil || !strings.Contains(err.Error(), "nothing to compare") {
		t.Fatalf("LoadExpected: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "current_state.json"), []byte(`{"m.room.create\u0000":"$c"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadExpected(dir); err != nil {
		t.Fatalf("with a current state: %v", err)
	}
}
