// Package testrooms holds room histories for tests, the demo and benchmarks, and the
// code that reads them and checks a replayed store against them.
//
// real/ holds 190 anonymised real rooms (see real/README.md for their source note;
// each room's meta.json names the repository, path and commit it came from). A
// room directory holds events.jsonl (PDUs in the order the origin server stored
// them), expected_state.jsonl (the state after each event as that server recorded
// it) and current_state.json.
package testrooms

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
)

// ErrRecording marks a recorded room directory whose files are malformed: a line of
// expected_state.jsonl that does not decode or is not a recorded state, a line
// count meta.json contradicts, a meta.json or current_state.json that does not
// decode, or a directory that records no state. The recording, not the request,
// is wrong (mtxdb verify exits 2 for it, as for a mismatch). Test with errors.Is.
var ErrRecording = errors.New("testrooms: malformed recording")

// recordingError is an error of a malformed recording: its message is the
// wrapped error's, and errors.Is finds ErrRecording in it.
type recordingError struct{ error }

func (e recordingError) Unwrap() []error { return []error{e.error, ErrRecording} }

// malformed marks err as an error of a malformed recording.
func malformed(format string, args ...any) error {
	return recordingError{fmt.Errorf(format, args...)}
}

// Dir returns the testrooms directory of this source tree (for tests and the demo
// run from a checkout).
func Dir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "testrooms"
	}
	return filepath.Dir(file)
}

// RealRoomDirs lists the room directories (those holding events.jsonl) under dir,
// a directory of rooms such as testrooms/real, sorted; a symlink to a room
// directory is listed as one. A symlink whose target is missing or unreadable
// is an error naming it (it is most likely a room that would otherwise be left
// out unseen), as is an events.jsonl that exists but cannot be read; a symlink
// to a file is ignored, as files and directories without events.jsonl are.
func RealRoomDirs(dir string) ([]string, error) {
	return subdirsWith(dir, func(p string) (bool, error) {
		_, ok, err := EventsFile(p)
		return ok, err
	})
}

// RecordedRoomDirs returns the subdirectories of dir that are room directories
// (events.jsonl) or hold recorded state (expected_state.jsonl), sorted: what
// verify --expected reads (a recorded room needs no events.jsonl to be compared).
// One whose expected_state.jsonl exists but cannot be read is an error naming it.
func RecordedRoomDirs(dir string) ([]string, error) {
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
			return false, fmt.Errorf("testrooms: %s cannot be read: %w", f, err)
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
				return nil, fmt.Errorf("testrooms: %s is a symlink whose target cannot be read: %w", p, err)
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
		return ev, false, fmt.Errorf("testrooms: %s cannot be read: %w", ev, err)
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
	// also when After was not loaded (OpenExpected).
	States int
}

// ExpectedState is one line of expected_state.jsonl.
type ExpectedState struct {
	EventID string            `json:"event_id"`
	State   map[string]string `json:"state"`
}

// LoadExpected reads expected_state.jsonl, current_state.json and meta.json of a room
// directory, every recorded state into After. For large rooms use OpenExpected.
func LoadExpected(dir string) (*Expected, error) {
	return loadExpected(dir, true)
}

// OpenExpected is LoadExpected without holding the states: After stays empty,
// States counts them, and Compare streams them from expected_state.jsonl one at
// a time (the generated 1M-event room records 250 MB of states, several GB as
// maps). The file is read once here, to count and check its lines.
func OpenExpected(dir string) (*Expected, error) {
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
	return scanExpected(exp.Dir, true, fn)
}

// scanExpected calls fn for each non-blank line of dir's expected_state.jsonl,
// decoded when decode is set (fn then gets the state; otherwise a zero value).
func scanExpected(dir string, decode bool, fn func(ExpectedState) error) error {
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
				return malformed("testrooms: %s/expected_state.jsonl line %d: %w", dir, line, err)
			}
			if es.EventID == "" || es.State == nil {
				return malformed("testrooms: %s/expected_state.jsonl line %d: not a recorded state: want an object with event_id and state", dir, line)
			}
			if err := checkStateKeys(es.State); err != nil {
				return malformed("testrooms: %s/expected_state.jsonl line %d: %w", dir, line, err)
			}
		}
		if err := fn(es); err != nil {
			return err
		}
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return malformed("testrooms: %s/expected_state.jsonl: %w", dir, err)
	} else if err != nil {
		return fmt.Errorf("testrooms: %s/expected_state.jsonl: %w", dir, err)
	}
	return nil
}

func loadExpected(dir string, hold bool) (*Expected, error) {
	exp := &Expected{Dir: dir}
	if err := scanExpected(dir, hold, func(es ExpectedState) error {
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
			return nil, malformed("testrooms: %s/current_state.json: %w", dir, err)
		}
		if err := checkStateKeys(exp.Current); err != nil {
			return nil, malformed("testrooms: %s/current_state.json: %w", dir, err)
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
			return nil, malformed("testrooms: %s/meta.json: %w", dir, err)
		}
		exp.RoomID, exp.ForwardExtremities, exp.Events = m.RoomID, m.ForwardExtremities, m.Counts.Events
		if n := m.ExpectedState.Lines; n < 0 {
			return nil, malformed("testrooms: %s/meta.json: expected_state.lines is %d, not a line count", dir, n)
		} else if n > 0 && n != exp.States {
			return nil, malformed("testrooms: %s/expected_state.jsonl has %d states, meta.json expected_state.lines says %d", dir, exp.States, n)
		} else if want := m.Counts.Events - m.Counts.Outliers; n == 0 && m.Counts.Events > 0 && exp.States != want {
			// A recording without expected_state.lines (a real room's) records the
			// state after every event that is not an outlier.
			return nil, malformed("testrooms: %s/expected_state.jsonl has %d states, meta.json counts %d events and %d outliers: a recording of every event has %d", dir, exp.States, m.Counts.Events, m.Counts.Outliers, want)
		}
	}
	if exp.States == 0 && len(exp.Current) == 0 {
		return nil, malformed("testrooms: %s records no state (expected_state.jsonl is empty and there is no current_state.json): nothing to compare", dir)
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

// Mismatch is one difference between our state and the recorded state. Ours or
// Recorded is empty where that side has no entry for the key.
type Mismatch struct {
	Room     string
	Event    string // "current state" for the room's current state
	Key      string // "type|state_key"
	Ours     string
	Recorded string
}

// String gives the mismatch on one line, "(none)" for a side without an entry:
// "mismatch room=R event=E key=type|state_key ours=ID recorded=ID".
func (m Mismatch) String() string {
	or := func(s string) string {
		if s == "" {
			return "(none)"
		}
		return s
	}
	return fmt.Sprintf("mismatch room=%s event=%s key=%s ours=%s recorded=%s", m.Room, m.Event, m.Key, or(m.Ours), or(m.Recorded))
}

// CompareResult counts what Compare checked.
type CompareResult struct {
	Events     int // events whose state after was compared
	Mismatches int
	// NotKept counts recorded events whose state an every-k repack dropped
	// (roomstate.ErrStateNotKept): not compared.
	NotKept int
	Current bool // the current state (and forward extremities) were compared
	// CurrentSkipped is set when the store holds more of the room than the recorded
	// directory (another version of the same room was imported too), so the recorded
	// current state and extremities describe an earlier tip and are not compared.
	CurrentSkipped bool
}

// Compare checks a replayed room against what its origin server recorded: the state
// after every recorded event (exp.After, or streamed from the file for OpenExpected; except those whose state an every-k repack
// dropped: counted in NotKept), and the current state when recorded. Each
// difference is passed to report.
func Compare(room *roomstate.Room, exp *Expected, report func(Mismatch)) (CompareResult, error) {
	return CompareProgress(room, exp, report, nil)
}

// CompareProgress is Compare calling progress, if set, after each recorded state
// compared (in file order) with the count so far: for progress bars.
func CompareProgress(room *roomstate.Room, exp *Expected, report func(Mismatch), progress func(states int)) (CompareResult, error) {
	var res CompareResult
	rd := room.NewReader()
	memo := roomstate.EntryMemo{}
	// rec is keyed as expected_state.jsonl is ("type\x00state_key"), ours by
	// roomstate.StatePair.
	pair := func(k string) roomstate.StatePair {
		t, sk, _ := strings.Cut(k, "\x00")
		return roomstate.StatePair{Type: t, StateKey: sk}
	}
	cmp := func(event string, ours map[roomstate.StatePair]string, rec map[string]string) {
		if len(ours) == len(rec) {
			same := true
			for k, v := range rec {
				if w, ok := ours[pair(k)]; !ok || w != v {
					same = false
					break
				}
			}
			if same {
				return // the common case: no need to sort the keys
			}
		}
		keys := map[string]bool{}
		for k := range ours {
			keys[k.Type+"\x00"+k.StateKey] = true
		}
		for k := range rec {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			if o := ours[pair(k)]; o != rec[k] {
				res.Mismatches++
				report(Mismatch{Room: room.ID(), Event: event, Key: strings.Replace(k, "\x00", "|", 1), Ours: o, Recorded: rec[k]})
			}
		}
	}
	n := 0 // recorded states compared so far, for progress
	// lineOf: a hash of each recorded event ID -> its line (of non-blank lines):
	// an event recorded twice means the file lost another's state. Hashes keep
	// a 1M-line file's set small; a collision is reported, never hidden.
	lineOf := map[uint64]int{}
	seed := maphash.MakeSeed()
	err := exp.eachState(func(es ExpectedState) error {
		if progress != nil && n > 0 {
			progress(n)
		}
		n++
		h := maphash.String(seed, es.EventID)
		if first, dup := lineOf[h]; dup {
			res.Mismatches++
			report(Mismatch{Room: room.ID(), Event: es.EventID, Key: "-", Ours: "-",
				Recorded: fmt.Sprintf("(recorded twice: states %d and %d of expected_state.jsonl)", first, n)})
			return nil
		}
		lineOf[h] = n
		if _, err := room.Meta(es.EventID); errors.Is(err, packstore.ErrNotFound) {
			res.Mismatches++
			report(Mismatch{Room: room.ID(), Event: es.EventID, Key: "-", Ours: "(event not imported)", Recorded: "(state recorded)"})
			return nil
		}
		root, err := room.StateAfter(es.EventID)
		if errors.Is(err, roomstate.ErrStateNotKept) {
			res.NotKept++
			return nil
		}
		if errors.Is(err, roomstate.ErrNoState) {
			// An outlier, or not replayed: the recorded state has nothing to
			// compare with; count it and go on with the other events.
			res.Mismatches++
			report(Mismatch{Room: room.ID(), Event: es.EventID, Key: "-", Ours: "(no state: outlier or not replayed)", Recorded: "(state recorded)"})
			return nil
		}
		if err != nil {
			return err
		}
		ours, err := room.StateMemo(rd, root, memo)
		if err != nil {
			return err
		}
		cmp(es.EventID, ours, es.State)
		res.Events++
		return nil
	})
	if err != nil {
		return res, err
	}
	if exp.Events > 0 && int(room.Head().Events) != exp.Events {
		res.CurrentSkipped = true
		return res, nil
	}
	if len(exp.ForwardExtremities) > 0 {
		ours := append([]string(nil), room.Head().ForwardExtremities...)
		rec := append([]string(nil), exp.ForwardExtremities...)
		sort.Strings(ours)
		sort.Strings(rec)
		if strings.Join(ours, ",") != strings.Join(rec, ",") {
			res.Mismatches++
			report(Mismatch{Room: room.ID(), Event: "forward extremities", Key: "-", Ours: strings.Join(ours, ","), Recorded: strings.Join(rec, ",")})
		}
	}
	if len(exp.Current) > 0 {
		ours, err := room.StateMemo(rd, room.Head().CurrentState, memo)
		if err != nil {
			return res, err
		}
		cmp("current state", ours, exp.Current)
		res.Current = true
	}
	return res, nil
}

// ImportReplayed imports a room directory's events.jsonl into eng and replays it:
// the set-up most end-to-end tests share. It returns the (single) room imported.
func ImportReplayed(eng packstore.StorageEngine, dir string) (*roomstate.Room, error) {
	f, err := os.Open(filepath.Join(dir, "events.jsonl"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st := roomstate.New(eng)
	res, err := st.Import(f, dir, roomstate.ImportOptions{})
	if err != nil {
		return nil, err
	}
	if len(res.Rooms) != 1 {
		return nil, fmt.Errorf("testrooms: %s holds %d rooms, want 1", dir, len(res.Rooms))
	}
	room, err := st.Room(res.Rooms[0])
	if err != nil {
		return nil, err
	}
	if _, err := resolver.Replay(room, resolver.ReplayOptions{}); err != nil {
		return nil, err
	}
	return room, nil
}
