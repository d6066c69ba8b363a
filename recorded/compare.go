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
	c := &comparer{ctx: ctx, room: room, exp: exp, report: report, rd: room.NewReader(), memo: roomstate.EntryMemo{},
		lineOf: map[uint64]int{}, seed: maphash.MakeSeed()}
	c.pairs, _ = lru.New[rootGroup, []Mismatch](pairCacheSize)
	n := 0 // recorded states compared so far, for progress
	err := exp.eachState(func(es ExpectedState) error {
		if progress != nil && n > 0 {
			progress(n)
		}
		n++
		return c.line(es, n)
	})
	if err != nil {
		return c.res, err
	}
	return c.res, c.tip()
}

// comparer is one run of CompareProgress.
type comparer struct {
	ctx    context.Context
	room   *roomstate.Room
	exp    *Expected
	report func(Mismatch)
	res    CompareResult
	rd     *hamtstore.Reader
	memo   roomstate.EntryMemo
	// pairs: the differences of the last (state of ours, recorded group) pairs.
	pairs *lru.Cache[rootGroup, []Mismatch]
	// lineOf: a hash of each recorded event ID -> its line (of non-blank
	// lines): an event recorded twice means the file lost another's state.
	// Hashes keep a 1M-line file's set small; a collision is reported, never
	// hidden.
	lineOf map[uint64]int
	seed   maphash.Seed
}

func (c *comparer) emit(m Mismatch) {
	c.res.Mismatches++
	c.report(m)
}

// line compares the state after one recorded event (line n) with ours.
func (c *comparer) line(es ExpectedState, n int) error {
	room := c.room
	h := maphash.String(c.seed, es.EventID)
	if first, dup := c.lineOf[h]; dup {
		c.emit(Mismatch{Room: room.ID(), Event: es.EventID, Key: "-", Ours: "-",
			Recorded: fmt.Sprintf("(recorded twice: states %d and %d of expected_state.jsonl)", first, n)})
		return nil
	}
	c.lineOf[h] = n
	if _, err := room.Meta(es.EventID); errors.Is(err, packstore.ErrNotFound) {
		c.emit(Mismatch{Room: room.ID(), Event: es.EventID, Key: "-", Ours: "(event not imported)", Recorded: "(state recorded)"})
		return nil
	}
	root, err := room.StateAfter(es.EventID)
	if errors.Is(err, roomstate.ErrStateNotKept) {
		c.res.NotKept++
		return nil
	}
	if errors.Is(err, roomstate.ErrNoState) {
		// An outlier, or not replayed: the recorded state has nothing to
		// compare with; count it and go on with the other events.
		c.emit(Mismatch{Room: room.ID(), Event: es.EventID, Key: "-", Ours: "(no state: outlier or not replayed)", Recorded: "(state recorded)"})
		return nil
	}
	if err != nil {
		return err
	}
	c.res.Events++
	if es.State != nil {
		ours, err := room.StateMemo(c.ctx, c.rd, root, c.memo)
		if err != nil {
			return err
		}
		c.cmp(es.EventID, ours, es.State, c.emit)
		return nil
	}
	// A grouped recording: events of one group and one state of ours (every
	// event that leaves the state as it is) are compared once.
	pk := rootGroup{root, es.StateGroup}
	ms, ok := c.pairs.Get(pk)
	if !ok {
		rec, err := c.exp.groups.state(es.StateGroup)
		if err != nil {
			return malformed("recorded: %s: event %s: %w", c.exp.Dir, es.EventID, err)
		}
		ours, err := room.StateMemo(c.ctx, c.rd, root, c.memo)
		if err != nil {
			return err
		}
		ms = []Mismatch{}
		c.cmp(es.EventID, ours, rec, func(m Mismatch) { ms = append(ms, m) })
		c.pairs.Add(pk, ms)
	}
	for _, m := range ms {
		m.Event = es.EventID
		c.emit(m)
	}
	return nil
}

// tip compares the forward extremities and the current state, when recorded
// and the store holds no more of the room than the recording.
func (c *comparer) tip() error {
	room, exp := c.room, c.exp
	if exp.Events > 0 && int(room.Head().Events) != exp.Events {
		c.res.CurrentSkipped = true
		return nil
	}
	if len(exp.ForwardExtremities) > 0 {
		ours := append([]string(nil), room.Head().ForwardExtremities...)
		rec := append([]string(nil), exp.ForwardExtremities...)
		sort.Strings(ours)
		sort.Strings(rec)
		if strings.Join(ours, ",") != strings.Join(rec, ",") {
			c.emit(Mismatch{Room: room.ID(), Event: "forward extremities", Key: "-", Ours: strings.Join(ours, ","), Recorded: strings.Join(rec, ",")})
		}
	}
	if len(exp.Current) > 0 {
		ours, err := room.StateMemo(c.ctx, c.rd, room.Head().CurrentState, c.memo)
		if err != nil {
			return err
		}
		c.cmp("current state", ours, exp.Current, c.emit)
		c.res.Current = true
	}
	return nil
}

// cmp passes each key on which ours and rec differ to emit, in key order.
// rec is keyed as expected_state.jsonl is ("type\x00state_key"), ours by
// roomrecord.StatePair.
func (c *comparer) cmp(event string, ours map[roomrecord.StatePair]string, rec map[string]string, emit func(Mismatch)) {
	pair := func(k string) roomrecord.StatePair {
		t, sk, _ := strings.Cut(k, "\x00")
		return roomrecord.StatePair{Type: t, StateKey: sk}
	}
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
			emit(Mismatch{Room: c.room.ID(), Event: event, Key: strings.Replace(k, "\x00", "|", 1), Ours: o, Recorded: rec[k]})
		}
	}
}
