// Package recorded reads room directories and the state their origin server
// recorded, and checks a replayed room against it: what mtxdb verify --expected
// and the demo compare with, and what the tests of every layer above roomstate
// use.
//
// A room directory holds events.jsonl (PDUs in the order the origin server
// stored them), expected_state.jsonl (one line per event the server kept state
// for: {"event_id": ..., "state": {"type\x00state_key": event ID, ...}}, the
// state after that event), current_state.json (the server's current state, in
// the same form) and meta.json (room_id, forward_extremities, counts.events,
// counts.outliers, and for generated rooms expected_state.lines). A recording
// needs no events.jsonl to be compared. A recording written from a server's
// database (mtxdb import --from) holds state_groups.jsonl instead of whole states:
// each line of expected_state.jsonl names the group of the state after its event
// (Group).
package recorded

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ErrMalformed marks a recorded room directory whose files are malformed: a line of
// expected_state.jsonl that does not decode or is not a recorded state, a line
// count meta.json contradicts, a meta.json or current_state.json that does not
// decode, or a directory that records no state. The recording, not the request,
// is wrong (mtxdb verify exits 2 for it, as for a mismatch). Test with errors.Is.
var ErrMalformed = errors.New("recorded: malformed recording")

// recordingError is an error of a malformed recording: its message is the
// wrapped error's, and errors.Is finds ErrMalformed in it.
type recordingError struct{ error }

func (e recordingError) Unwrap() []error { return []error{e.error, ErrMalformed} }

// malformed marks err as an error of a malformed recording.
func malformed(format string, args ...any) error {
	return recordingError{fmt.Errorf(format, args...)}
}

// RoomDirs lists the room directories (those holding events.jsonl) under dir,
// a directory of rooms such as testrooms/real, sorted; a symlink to a room
// directory is listed as one. A symlink whose target is missing or unreadable
// is an error naming it (it is most likely a room that would otherwise be left
// out unseen), as is an events.jsonl that exists but cannot be read; a symlink
// to a file is ignored, as files and directories without events.jsonl are.
func RoomDirs(dir string) ([]string, error) {
	return subdirsWith(dir, func(p string) (bool, error) {
		_, ok, err := EventsFile(p)
		return ok, err
	})
}

// RecordingDirs returns the subdirectories of dir that are room directories
// (events.jsonl) or hold recorded state (expected_state.jsonl), sorted: what
// verify --expected reads (a recorded room needs no events.jsonl to be compared).
// One whose expected_state.jsonl exists but cannot be read is an error naming it.
func RecordingDirs(dir string) ([]string, error) {
	return subdirsWith(dir, func(p string) (bool, error) {
		if _, ok, err := EventsFile(p); err != nil || ok {
			return ok, err
		}
		f := filepath.Join(p, "expected_state.jsonl")
		_, err := os.Stat(f)
		if err == nil {
			return true, nil
		}
		if _, lerr := os.Lstat(f); lerr == nil || !errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("recorded: %s cannot be read: %w", f, err)
		}
		return false, nil
	})
}

// OtherSubdirs returns the subdirectories of dir not in dirs, sorted: what a
// listing of room directories left out.
func OtherSubdirs(dir string, dirs []string) ([]string, error) {
	in := map[string]bool{}
	for _, d := range dirs {
		in[d] = true
	}
	return subdirsWith(dir, func(p string) (bool, error) { return !in[p], nil })
}

// subdirsWith returns the subdirectories of dir (a symlink to a directory counts
// as one) for which keep says true, sorted.
func subdirsWith(dir string, keep func(string) (bool, error)) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if e.Type()&os.ModeSymlink != 0 {
			// A symlinked room directory counts as the directory it names.
			fi, err := os.Stat(p)
			if err != nil {
				return nil, fmt.Errorf("recorded: %s is a symlink whose target cannot be read: %w", p, err)
			}
			if !fi.IsDir() {
				continue
			}
		} else if !e.IsDir() {
			continue
		}
		if ok, err := keep(p); err != nil {
			return nil, err
		} else if ok {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out, nil
}

// EventsFile returns dir's events.jsonl and whether dir holds one (a room
// directory). One that exists but cannot be read (a dangling symlink, no
// permission) is an error naming it, not "no events.jsonl".
func EventsFile(dir string) (string, bool, error) {
	ev := filepath.Join(dir, "events.jsonl")
	_, err := os.Stat(ev)
	if err == nil {
		return ev, true, nil
	}
	if _, lerr := os.Lstat(ev); lerr == nil || !errors.Is(err, fs.ErrNotExist) {
		return ev, false, fmt.Errorf("recorded: %s cannot be read: %w", ev, err)
	}
	return ev, false, nil
}

// Expected is what the origin server recorded for a room.
type Expected struct {
	Dir    string
	RoomID string
	// After is the state after each event ("type\x00state_key" -> event ID), in file
	// order; events the server kept no state for have no entry.
	After []ExpectedState
	// Current is the server's current state; empty when the server had left the room.
	Current map[string]string
	// ForwardExtremities as the server recorded them (may be empty).
	ForwardExtremities []string
	// Events is the number of events in the room directory (meta.json counts.events).
	Events int
	// States is the number of recorded states (lines of expected_state.jsonl),
	// also when After was not loaded (Open).
	States int
	// groups: the recording's state_groups.jsonl, when it has one (Group).
	groups *groups
}

// ExpectedState is one line of expected_state.jsonl: the state after an event,
// whole (State) or, in a recording with state_groups.jsonl, as the group that
// holds it (StateGroup; State then absent).
type ExpectedState struct {
	EventID    string            `json:"event_id"`
	State      map[string]string `json:"state"`
	StateGroup int64             `json:"state_group,omitempty"`
}

// Load reads expected_state.jsonl, current_state.json and meta.json of a room
// directory, every recorded state into After. For large rooms use Open.
func Load(dir string) (*Expected, error) {
	return loadExpected(dir, true)
}

// Open is Load without holding the states: After stays empty,
// States counts them, and Compare streams them from expected_state.jsonl one at
// a time (the generated 1M-event room records 250 MB of states, several GB as
// maps). The file is read once here, to count and check its lines.
func Open(dir string) (*Expected, error) {
	return loadExpected(dir, false)
}

// eachState calls fn with every recorded state in file order: from After when
// it was loaded, else streamed from the file (a decoding error names the line).
func (exp *Expected) eachState(fn func(ExpectedState) error) error {
	if exp.After != nil || exp.States == 0 {
		for _, es := range exp.After {
			if err := fn(es); err != nil {
				return err
			}
		}
		return nil
	}
	return scanExpected(exp.Dir, true, exp.groups != nil, fn)
}

// scanExpected calls fn for each non-blank line of dir's expected_state.jsonl,
// decoded when decode is set (fn then gets the state; otherwise a zero value).
func scanExpected(dir string, decode bool, grouped bool, fn func(ExpectedState) error) error {
	f, err := os.Open(filepath.Join(dir, "expected_state.jsonl"))
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var es ExpectedState
		if decode {
			if err := json.Unmarshal(sc.Bytes(), &es); err != nil {
				return malformed("recorded: %s/expected_state.jsonl line %d: %w", dir, line, err)
			}
			if es.EventID == "" || (es.State == nil && (!grouped || es.StateGroup == 0)) {
				return malformed("recorded: %s/expected_state.jsonl line %d: not a recorded state: want an object with event_id and state (or state_group, with state_groups.jsonl)", dir, line)
			}
			if err := checkStateKeys(es.State); err != nil {
				return malformed("recorded: %s/expected_state.jsonl line %d: %w", dir, line, err)
			}
		}
		if err := fn(es); err != nil {
			return err
		}
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return malformed("recorded: %s/expected_state.jsonl: %w", dir, err)
	} else if err != nil {
		return fmt.Errorf("recorded: %s/expected_state.jsonl: %w", dir, err)
	}
	return nil
}

func loadExpected(dir string, hold bool) (*Expected, error) {
	exp := &Expected{Dir: dir}
	var err error
	if exp.groups, err = loadGroups(dir); err != nil {
		return nil, err
	}
	if err := scanExpected(dir, hold, exp.groups != nil, func(es ExpectedState) error {
		exp.States++
		if hold {
			exp.After = append(exp.After, es)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if b, err := os.ReadFile(filepath.Join(dir, "current_state.json")); err == nil {
		if err := json.Unmarshal(b, &exp.Current); err != nil {
			return nil, malformed("recorded: %s/current_state.json: %w", dir, err)
		}
		if err := checkStateKeys(exp.Current); err != nil {
			return nil, malformed("recorded: %s/current_state.json: %w", dir, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if b, err := os.ReadFile(filepath.Join(dir, "meta.json")); err == nil {
		var m struct {
			RoomID             string   `json:"room_id"`
			ForwardExtremities []string `json:"forward_extremities"`
			Counts             struct {
				Events   int `json:"events"`
				Outliers int `json:"outliers"`
			} `json:"counts"`
			// Generated rooms say how many lines expected_state.jsonl has.
			ExpectedState struct {
				Lines int `json:"lines"`
			} `json:"expected_state"`
		}
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, malformed("recorded: %s/meta.json: %w", dir, err)
		}
		exp.RoomID, exp.ForwardExtremities, exp.Events = m.RoomID, m.ForwardExtremities, m.Counts.Events
		if n := m.ExpectedState.Lines; n < 0 {
			return nil, malformed("recorded: %s/meta.json: expected_state.lines is %d, not a line count", dir, n)
		} else if n > 0 && n != exp.States {
			return nil, malformed("recorded: %s/expected_state.jsonl has %d states, meta.json expected_state.lines says %d", dir, exp.States, n)
		} else if want := m.Counts.Events - m.Counts.Outliers; n == 0 && m.Counts.Events > 0 && exp.States != want {
			// A recording without expected_state.lines (a real room's) records the
			// state after every event that is not an outlier.
			return nil, malformed("recorded: %s/expected_state.jsonl has %d states, meta.json counts %d events and %d outliers: a recording of every event has %d", dir, exp.States, m.Counts.Events, m.Counts.Outliers, want)
		}
	}
	if exp.States == 0 && len(exp.Current) == 0 {
		return nil, malformed("recorded: %s records no state (expected_state.jsonl is empty and current_state.json is absent or empty): nothing to compare", dir)
	}
	return exp, nil
}

// checkStateKeys refuses a recorded state whose key is not "type\x00state_key" (a
// type, then a NUL byte, then the state key, which may be empty) or whose event ID
// is empty.
// Of several bad keys the smallest is named; the state is walked once, unsorted
// (states of 100k keys are checked on every line of a large recording).
func checkStateKeys(state map[string]string) error {
	var bad string
	var err error
	for k, id := range state {
		if err != nil && k >= bad {
			continue
		}
		if t, _, ok := strings.Cut(k, "\x00"); !ok || t == "" {
			bad, err = k, fmt.Errorf("state key %q is not an event type, a NUL byte (\u0000) and a state key", k)
		} else if id == "" {
			bad, err = k, fmt.Errorf("state key %q has an empty event ID", strings.Replace(k, "\x00", "|", 1))
		}
	}
	return err
}
