package recorded

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadNothingRecorded: a room directory that records no state at all
// is an error, not a comparison of nothing.
func TestLoadNothingRecorded(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"expected_state.jsonl": "\n",
		"meta.json":            `{"room_id":"!r:example.org"}`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "nothing to compare") {
		t.Fatalf("Load: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "current_state.json"), []byte(`{"m.room.create\u0000":"$c"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err != nil {
		t.Fatalf("with a current state: %v", err)
	}
}

// TestRoomDirsSymlinks: a symlink to a room directory is listed, one to a
// file is ignored, and a dangling one fails naming itself (skipping it silently
// would leave a room out of import and verify unseen).
func TestRoomDirsSymlinks(t *testing.T) {
	dir := t.TempDir()
	rooms := filepath.Join(dir, "rooms")
	target := filepath.Join(dir, "elsewhere")
	for _, d := range []string{filepath.Join(rooms, "a"), target} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "events.jsonl"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(target, filepath.Join(rooms, "b")))
	must(os.Symlink(filepath.Join(target, "events.jsonl"), filepath.Join(rooms, "file")))
	got, err := RoomDirs(rooms)
	if err != nil || len(got) != 2 || got[0] != filepath.Join(rooms, "a") || got[1] != filepath.Join(rooms, "b") {
		t.Fatalf("RoomDirs = %q, %v; want [a b]", got, err)
	}
	if err := os.MkdirAll(filepath.Join(rooms, "notaroom"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := RoomDirs(rooms); err != nil || len(got) != 2 {
		t.Fatalf("RoomDirs with a directory without events.jsonl = %q, %v; want it ignored", got, err)
	}
	badEvents := filepath.Join(rooms, "d", "events.jsonl")
	must(os.MkdirAll(filepath.Dir(badEvents), 0o755))
	must(os.Symlink(filepath.Join(dir, "gone.jsonl"), badEvents))
	if got, err := RoomDirs(rooms); err == nil || !strings.Contains(err.Error(), badEvents) {
		t.Fatalf("RoomDirs with a dangling events.jsonl = %q, %v; want an error naming %s", got, err, badEvents)
	}
	must(os.Remove(badEvents))
	dangling := filepath.Join(rooms, "c")
	must(os.Symlink(filepath.Join(dir, "gone"), dangling))
	if got, err := RoomDirs(rooms); err == nil || !strings.Contains(err.Error(), dangling) {
		t.Fatalf("RoomDirs with a dangling symlink = %q, %v; want an error naming %s", got, err, dangling)
	}
}

// TestLoadRefusesMalformed: a line that is JSON but not a recorded state
// (null, no state, no event_id, a key without the NUL between type and state key, an
// empty event ID), a line that does not decode, a negative or wrong
// line count in meta.json and an undecodable meta.json are ErrMalformed errors
// naming the file, not states to compare.
func TestLoadRefusesMalformed(t *testing.T) {
	good := `{"event_id":"$a","state":{"m.room.create\u0000":"$a"}}`
	for _, tc := range []struct {
		lines, meta, want string
	}{
		{"null", `{"room_id":"!r:example.org"}`, "line 1: not a recorded state"},
		{good + "\n" + `{"event_id":"$b"}`, `{"room_id":"!r:example.org"}`, "line 2: not a recorded state"},
		{`{"state":{}}`, `{"room_id":"!r:example.org"}`, "line 1: not a recorded state"},
		{good, `{"room_id":"!r:example.org","expected_state":{"lines":-1}}`, "expected_state.lines is -1"},
		{good + "\n" + `{"event_id":"$b","state":{bro`, `{"room_id":"!r:example.org"}`, "line 2: invalid character"},
		{good, `{"room_id":"!r:example.org","expected_state":{"lines":2}}`, "has 1 states, meta.json expected_state.lines says 2"},
		{good, `{"room_id":`, "meta.json: unexpected end of JSON input"},
		{good, `{"room_id":"!r:example.org","counts":{"events":3,"outliers":1}}`, "has 1 states, meta.json counts 3 events and 1 outliers"},
		{`{"event_id":"$a","state":{"m.room.create|":"$a"}}`, `{"room_id":"!r:example.org"}`, `line 1: state key "m.room.create|" is not an event type, a NUL byte`},
		{good + "\n" + `{"event_id":"$b","state":{"\u0000":"$a"}}`, `{"room_id":"!r:example.org"}`, `line 2: state key "\x00" is not an event type`},
		{`{"event_id":"$a","state":{"m.room.create\u0000":""}}`, `{"room_id":"!r:example.org"}`, `line 1: state key "m.room.create|" has an empty event ID`},
	} {
		dir := t.TempDir()
		for name, body := range map[string]string{"expected_state.jsonl": tc.lines + "\n", "meta.json": tc.meta} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for _, open := range []func(string) (*Expected, error){Load, Open} {
			exp, err := open(dir)
			if err == nil && exp != nil {
				// Open streams the lines: the error comes from the scan.
				err = exp.eachState(func(ExpectedState) error { return nil })
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrMalformed) {
				t.Errorf("%q / %s: got %v, want an ErrMalformed containing %q", tc.lines, tc.meta, err, tc.want)
			}
		}
	}
}
