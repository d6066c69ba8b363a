package recorded

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGroups: a grouped recording expands each group along its chain (set and
// removed applied in order) and refuses, as ErrMalformed naming the line, a
// group given twice, one built on a group not given before it, one without an
// ID, a bad key, and a line naming no state in a recording without groups.
func TestGroups(t *testing.T) {
	write := func(groups, lines string) string {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, groupsFile), []byte(groups), 0o644)
		os.WriteFile(filepath.Join(dir, "expected_state.jsonl"), []byte(lines), 0o644)
		return dir
	}
	ok := write(`{"state_group":5,"set":{"a\u0000":"$1","b\u0000":"$2"}}
{"state_group":7,"prev_state_group":5,"set":{"b\u0000":"$3"},"removed":["a\u0000"]}
{"state_group":-9,"prev_state_group":7,"set":{"c\u0000x":"$4"}}
`, `{"event_id":"$1","state_group":5}
{"event_id":"$4","state_group":-9}
`)
	exp, err := Load(ok)
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[int64]map[string]string{
		5:  {"a\x00": "$1", "b\x00": "$2"},
		7:  {"b\x00": "$3"},
		-9: {"b\x00": "$3", "c\x00x": "$4"},
	} {
		exp.groups.expanded.Purge()
		if got, err := exp.groups.state(id); err != nil || !maps.Equal(got, want) {
			t.Errorf("group %d: %v, %v; want %v", id, got, err, want)
		}
	}
	if exp.States != 2 || exp.After[1].StateGroup != -9 {
		t.Errorf("lines: %+v", exp.After)
	}
	for _, c := range []struct{ groups, lines, want string }{
		{`{"state_group":5,"set":{}}` + "\n" + `{"state_group":5,"set":{}}`, `{"event_id":"$1","state_group":5}`, "line 2: state group 5 given twice"},
		{`{"state_group":7,"prev_state_group":5,"set":{}}`, `{"event_id":"$1","state_group":7}`, "line 1: state group 7 builds on group 5"},
		{`{"set":{}}`, `{"event_id":"$1","state_group":7}`, "line 1: no state_group"},
		{`{"state_group":5,"set":{"nokey":"$1"}}`, `{"event_id":"$1","state_group":5}`, "line 1: state key"},
		{`{"state_group":5,`, `{"event_id":"$1","state_group":5}`, "line 1"},
	} {
		_, err := Load(write(c.groups, c.lines))
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("groups %q: %v; want ErrMalformed with %q", c.groups, err, c.want)
		}
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "expected_state.jsonl"), []byte(`{"event_id":"$1","state_group":5}`+"\n"), 0o644)
	if _, err := Load(dir); !errors.Is(err, ErrMalformed) {
		t.Errorf("a line naming a group without state_groups.jsonl: %v", err)
	}
}
