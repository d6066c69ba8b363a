package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/audit"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/pgstore"
	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/roomrecord"
	"github.com/mtxdb/mtxdb/roomstate"
)

// recordedSubdir is where, in a store directory, audit looks for the state the
// rooms' servers recorded when no --expected is given.
const recordedSubdir = "recorded"

// auditCmd is mtxdb audit: where the state a server recorded departs from the
// spec's, each difference classified (package audit).
func auditCmd() *cobra.Command {
	var store, room string
	var expected []string
	var byKey bool
	var asJSON bool
	c := &cobra.Command{
		Use:   "audit --store DIR [--room ROOM_ID] [--expected DIR]... [--by-key] [--json]",
		Short: "Say where the state a server recorded departs from the spec's, and what it means",
		Long: `Audit compares, room by room, the state the room's server recorded after every
event (and its current state) with the state the spec gives for the same events:
mtxdb replay's, which must have run. Each difference is a line
"finding room=… event=… key=… kind=KIND ours=… recorded=…" (ours: the spec's
entry; (none): no entry), KIND one of
  accepted_rejected      the server's entry is an event the authorization rules reject
  rejected_accepted      the spec's entry is an event the server did not apply (it
                         rejected or soft-failed it), there and wherever that carries on
  ban_undone             the spec has the member banned, the server does not
  member_removed         the spec has a membership for the user, the server none
  power_levels_reverted  the server's power levels arrived before the spec's
  join_rules_reverted    the same for the join rules
  reverted               the same for any other key
  lost                   the spec has an entry, the server none
  extra                  the server has an entry, the spec none
  differs                both have one; the server's arrived later
tried in that order. Then a line per room with its counts by kind, and a total.
A key that differs from some event on usually differs at every later event too:
with --by-key the findings of a room are summed per key instead, a line
"key room=… key=… finding=KIND events=N first=… last=…" each (KIND: the first
finding's; first and last: the events it differs at first and last); the counts
are the same.

The recorded state is read from the store directory's recorded/ subdirectory
(where mtxdb import --from writes it), or from --expected (room directories with
expected_state.jsonl and meta.json, as mtxdb verify --expected reads them).

A recorded event the store lacks or has no state for (refused at import: its
content does not give the event ID the server knows it by, say), a room that
cannot be audited (a room collection whose head record cannot be read among them,
named by its recording's room ID or else its collection ID), and --room naming a
room without a recording are "problem" lines; the other rooms are audited all the
same. With --json each line is one
object: {"kind":"finding","room","event","key","finding":KIND,"ours","recorded"},
"room", "problem" and "audit" lines likewise.

Exit status 2 when anything differs or there is a problem (a recorded room not
in the store or not replayed, among them); 1 for usage and I/O errors; 0 when
every room agrees with the spec.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if err := nonEmptyFlag(cmd, "room", room); err != nil {
				return err
			}
			eng, rooms, badHeads, err := openRoomsAndErrors(ctx, store, room, true)
			if err != nil {
				return err
			}
			defer eng.Close()
			if len(expected) == 0 {
				if pgstore.IsURL(store) {
					return fmt.Errorf("a PostgreSQL store has no recorded/ directory: give the recorded state with --expected DIR")
				}
				dir := filepath.Join(store, recordedSubdir)
				if _, err := os.Stat(dir); err != nil {
					return fmt.Errorf("no recorded state to audit: %s does not exist (mtxdb import --from writes it) and no --expected was given", dir)
				}
				expected = []string{dir}
			}
			var exps map[string][]*recorded.Expected
			var unreadable []error
			if len(expected) == 1 && expected[0] == filepath.Join(store, recordedSubdir) {
				exps, unreadable, err = loadRecorded(expected[0], cmd.ErrOrStderr())
			} else {
				if exps, err = loadExpectedDirs(expected, cmd.ErrOrStderr()); err != nil {
					err = fmt.Errorf("--expected: %w", err)
				}
			}
			if err != nil {
				return err
			}
			defer catchInterrupts("audit", func() string { return "stopped; audit writes nothing" })()
			t, err := auditRooms(ctx, auditInput{rooms, badHeads, exps, unreadable}, auditOutput{room: room, out: cmd.OutOrStdout(), asJSON: asJSON, byKey: byKey})
			if err != nil {
				return err
			}
			if t.findings > 0 || t.problems > 0 {
				return exitError(2)
			}
			return nil
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp)
	c.Flags().StringVar(&room, "room", "", "audit only this room ID")
	c.Flags().BoolVar(&byKey, "by-key", false, "a line per room and state key that differs (its first finding, the events it differs at, the first and last of them) instead of a line per event and key")
	c.Flags().StringArrayVar(&expected, "expected", nil, "room directory, or directory of rooms, with recorded state (default: the store's recorded/)")
	jsonFlag(c, &asJSON)
	return c
}

// loadRecorded reads the recordings of a store's recorded/ directory, one
// room directory at a time: a recording that cannot be read is returned in
// unreadable (a problem line each) and the others are audited; the
// directories an import is still writing or left unfinished (*.tmp,
// *.staged) are skipped with a warning.
func loadRecorded(dir string, warn io.Writer) (map[string][]*recorded.Expected, []error, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	exps := map[string][]*recorded.Expected{}
	var unreadable []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
			continue
		}
		if strings.HasSuffix(e.Name(), ".tmp") || strings.HasSuffix(e.Name(), ".staged") {
			fmt.Fprintf(warn, "mtxdb: warning: %s is a recording an import did not finish: skipped (importing again replaces it)\n", p)
			continue
		}
		m, err := loadExpectedDirs([]string{p}, warn)
		if err != nil {
			unreadable = append(unreadable, err)
			continue
		}
		for id, list := range m {
			exps[id] = append(exps[id], list...)
		}
	}
	return exps, unreadable, nil
}

type auditTotals struct {
	rooms, events, findings, problems int
	differing                         int // events whose state differs
	kinds                             map[audit.Kind]int
}

// auditOutput is what audit prints, and for which room ("" every room).
type auditOutput struct {
	room   string
	out    io.Writer
	asJSON bool
	byKey  bool
}

// auditInput is what audit compares: the store's rooms and the room
// collections whose head cannot be read (badHeads), the recordings by room
// ID, and the recordings that could not be read.
type auditInput struct {
	rooms      []*roomstate.Room
	badHeads   []*roomstate.HeadError
	exps       map[string][]*recorded.Expected
	unreadable []error
}

// auditRooms audits every recorded room of in.exps (only o.room, when not
// empty) against the store's rooms and prints the findings, a line per room
// and the total. A room collection whose head cannot be read is a problem
// line, named by the room ID of its recording when there is one.
func auditRooms(ctx context.Context, in auditInput, o auditOutput) (auditTotals, error) {
	room, out, asJSON, exps := o.room, o.out, o.asJSON, in.exps
	t := auditTotals{kinds: map[audit.Kind]int{}}
	for _, err := range in.unreadable {
		if room != "" {
			break // another room's, perhaps: --room audits one
		}
		t.problems++
		printProblem(out, asJSON, "", err.Error())
	}
	bad := recordedHeads(in.badHeads, exps)
	for _, h := range in.badHeads {
		if _, ok := bad[h.Collection]; !ok {
			t.problems++
			printProblem(out, asJSON, "", h.Error()+": the room is not audited")
		}
	}
	byID := map[string]*roomstate.Room{}
	for _, r := range in.rooms {
		byID[r.ID()] = r
	}
	if room != "" && len(exps[room]) == 0 {
		t.problems++
		printProblem(out, asJSON, room, "no recorded state for this room (mtxdb import --from records the rooms it imports)")
	}
	for _, exp := range sortedExpected(exps) {
		if room != "" && exp.RoomID != room {
			continue
		}
		r := byID[exp.RoomID]
		switch {
		case r == nil && bad[roomrecord.CollectionID(exp.RoomID)] != nil:
			t.problems++
			printProblem(out, asJSON, exp.RoomID, fmt.Sprintf("its head record (room collection %s) cannot be read: %v: the room is not audited",
				roomrecord.CollectionID(exp.RoomID), bad[roomrecord.CollectionID(exp.RoomID)].Err))
			continue
		case r == nil:
			t.problems++
			printProblem(out, asJSON, exp.RoomID, fmt.Sprintf("recorded in %s but not in the store", exp.Dir))
			continue
		case !r.Head().Replayed:
			t.problems++
			printProblem(out, asJSON, exp.RoomID, "not replayed: run mtxdb replay first")
			continue
		}
		rt, err := auditRoom(ctx, r, exp, o)
		t.problems += rt.problems
		if err != nil && lostStore(err) {
			return t, err
		}
		if err != nil {
			t.problems++
			printProblem(out, asJSON, exp.RoomID, fmt.Sprintf("audit stopped in this room: %v", err))
			continue
		}
		t.rooms++
		t.events += rt.events
		t.findings += rt.findings
		for k, n := range rt.kinds {
			t.kinds[k] += n
		}
		printLine(out, asJSON, "room", append([]kv{{"room", exp.RoomID}, {"events", rt.events}, {"differing_events", rt.differing}, {"findings", rt.findings}}, kindFields(rt.kinds)...)...)
	}
	printLine(out, asJSON, "audit", append([]kv{{"rooms", t.rooms}, {"events", t.events}, {"findings", t.findings}, {"problems", t.problems}}, kindFields(t.kinds)...)...)
	return t, nil
}

// recordedHeads returns the head errors of bad whose collection is that of a
// recorded room of exps, by collection.
func recordedHeads(bad []*roomstate.HeadError, exps map[string][]*recorded.Expected) map[packstore.ID]*roomstate.HeadError {
	out := map[packstore.ID]*roomstate.HeadError{}
	for _, h := range bad {
		for id := range exps {
			if roomrecord.CollectionID(id) == h.Collection {
				out[h.Collection] = h
			}
		}
	}
	return out
}

// auditRoom compares one replayed room with its recording and prints each
// finding.
func auditRoom(ctx context.Context, r *roomstate.Room, exp *recorded.Expected, o auditOutput) (auditTotals, error) {
	out, asJSON := o.out, o.asJSON
	t := auditTotals{kinds: map[audit.Kind]int{}}
	keys := map[string]*keyFindings{} // --by-key
	c := audit.NewClassifier(audit.RoomEvents{Room: r})
	var classifyErr error
	lastEvent := ""
	res, err := recorded.Compare(ctx, r, exp, func(m recorded.Mismatch) {
		if classifyErr != nil {
			return
		}
		if m.Key == "-" {
			// Not a state difference: an event the store lacks or has no state
			// for, or one recorded twice (recorded.Compare).
			t.problems++
			printProblem(out, asJSON, m.Room, fmt.Sprintf("event %s: ours %s, recorded %s", m.Event, m.Ours, m.Recorded))
			return
		}
		f, err := c.Classify(m)
		if err != nil {
			classifyErr = err
			return
		}
		if m.Event != lastEvent {
			t.differing++
			lastEvent = m.Event
		}
		t.findings++
		t.kinds[f.Kind]++
		if o.byKey {
			k := keys[f.Key]
			if k == nil {
				k = &keyFindings{kind: f.Kind, first: f.Event}
				keys[f.Key] = k
			}
			k.events++
			k.last = f.Event
			return
		}
		if asJSON {
			printLine(out, true, "finding", kv{"room", f.Room}, kv{"event", f.Event}, kv{"key", f.Key}, kv{"finding", string(f.Kind)}, kv{"ours", f.Ours}, kv{"recorded", f.Recorded})
		} else {
			fmt.Fprintln(out, f)
		}
	})
	if err == nil {
		err = classifyErr
	}
	if err != nil {
		return t, fmt.Errorf("audit room %s against %s: %w", r.ID(), exp.Dir, err)
	}
	t.events = res.Events
	for _, key := range slices.Sorted(maps.Keys(keys)) {
		k := keys[key]
		printLine(out, asJSON, "key", kv{"room", r.ID()}, kv{"key", key}, kv{"finding", string(k.kind)}, kv{"events", k.events}, kv{"first", k.first}, kv{"last", k.last})
	}
	return t, nil
}

// keyFindings sums a room's findings for one state key (--by-key): the kind
// of the first, the events they are at, the first and last of those.
type keyFindings struct {
	kind        audit.Kind
	events      int
	first, last string
}

// kindFields gives the non-zero counts by kind, in audit.Kinds order.
func kindFields(kinds map[audit.Kind]int) []kv {
	var out []kv
	for _, k := range audit.Kinds {
		if n := kinds[k]; n > 0 {
			out = append(out, kv{string(k), n})
		}
	}
	return out
}
