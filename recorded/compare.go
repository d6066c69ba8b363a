package recorded

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sort"
	"strings"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomstate"
)

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

// rootGroup is a state of ours and a recorded state group.
type rootGroup struct {
	root  hamtstore.NodeID
	group int64
}

// pairCacheSize bounds the (state, group) pairs whose differences Compare keeps.
const pairCacheSize = 1024

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
// after every recorded event (exp.After, or streamed from the file for Open; except those whose state an every-k repack
// dropped: counted in NotKept), and the current state when recorded. Each
// difference is passed to report. ctx is checked before each snapshot read.
func Compare(ctx context.Context, room *roomstate.Room, exp *Expected, report func(Mismatch)) (CompareResult, error) {
	return CompareProgress(ctx, room, exp, report, nil)
}

// CompareProgress is Compare calling progress, if set, after each recorded state
// compared (in file order) with the count so far: for progress bars.
func CompareProgress(ctx context.Context, room *roomstate.Room, exp *Expected, report func(Mismatch), progress func(states int)) (CompareResult, error) {
	var res CompareResult
	rd := room.NewReader()
	memo := roomstate.EntryMemo{}
	// rec is keyed as expected_state.jsonl is ("type\x00state_key"), ours by
	// roomrecord.StatePair.
	pair := func(k string) roomrecord.StatePair {
		t, sk, _ := strings.Cut(k, "\x00")
		return roomrecord.StatePair{Type: t, StateKey: sk}
	}
	cmp := func(event string, ours map[roomrecord.StatePair]string, rec map[string]string, emit func(Mismatch)) {
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
				emit(Mismatch{Room: room.ID(), Event: event, Key: strings.Replace(k, "\x00", "|", 1), Ours: o, Recorded: rec[k]})
			}
		}
	}
	// pairs: the differences of the last (state of ours, recorded group) pairs.
	pairs, _ := lru.New[rootGroup, []Mismatch](pairCacheSize)
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
		res.Events++
		emit := func(m Mismatch) {
			res.Mismatches++
			report(m)
		}
		if es.State != nil {
			ours, err := room.StateMemo(ctx, rd, root, memo)
			if err != nil {
				return err
			}
			cmp(es.EventID, ours, es.State, emit)
			return nil
		}
		// A grouped recording: events of one group and one state of ours
		// (every event that leaves the state as it is) are compared once.
		pk := rootGroup{root, es.StateGroup}
		ms, ok := pairs.Get(pk)
		if !ok {
			rec, err := exp.groups.state(es.StateGroup)
			if err != nil {
				return malformed("recorded: %s: event %s: %w", exp.Dir, es.EventID, err)
			}
			ours, err := room.StateMemo(ctx, rd, root, memo)
			if err != nil {
				return err
			}
			ms = []Mismatch{}
			cmp(es.EventID, ours, rec, func(m Mismatch) { ms = append(ms, m) })
			pairs.Add(pk, ms)
		}
		for _, m := range ms {
			m.Event = es.EventID
			emit(m)
		}
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
		ours, err := room.StateMemo(ctx, rd, room.Head().CurrentState, memo)
		if err != nil {
			return res, err
		}
		cmp("current state", ours, exp.Current, func(m Mismatch) {
			res.Mismatches++
			report(m)
		})
		res.Current = true
	}
	return res, nil
}
