package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/roomstate"
)

// verifyCmd is mtxdb verify: every record and snapshot checked, and with
// --expected the states compared with those the origin server recorded.
func verifyCmd() *cobra.Command {
	var store, room string
	var expected []string
	var asJSON, listRejected bool
	c := &cobra.Command{
		Use:   "verify --store DIR [--room ROOM_ID] [--expected DIR]... [--rejected]",
		Short: "Check every record and snapshot; compare with recorded state",
		Long: `Verify reads every record of each room: PDUs, metadata, state records, every
distinct snapshot (node hashes, canonical CHAMP shape, entries naming state events of
their key). With --expected (a room directory with expected_state.jsonl, or a directory
of such rooms) it also compares the state after every event and the current state with
what the origin server recorded, printing each mismatch with room, event, key, ours,
recorded. Events whose state an every-k repack dropped (mtxdb repack --liveness
every-k) are counted as state_not_kept and not compared. A recorded room directory
needs meta.json naming its room_id. The summary counts the events replay rejected;
--rejected prints each as "rejected room=… event=…: reason", the reason naming the
authorization rule.

A room not replayed to its end (only imported, a replay interrupted, events imported
since) has its existing state records checked, and its events without one are
counted as unreplayed with one line per room: that alone is not damage (exit 0).
Compared with --expected, such a room is one problem line ("room not replayed"),
not a mismatch per event. A room that fails its check is a problem line, and its
events are counted as unchecked_events (not in events).

Exit status 2 when the data is wrong: a mismatch, a room that fails its check, a
recorded room the store lacks or has not replayed, --room with --expected directories
none of which records that room (nothing compared), a recorded room directory whose
files are malformed (a line of expected_state.jsonl that does not decode, a line
count meta.json contradicts), or a store that fails to open as corrupt; 1 for usage
and I/O errors, including a store lost during the run; 0 otherwise.`,
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
			exps, err := loadExpectedDirs(expected, cmd.ErrOrStderr())
			if err != nil {
				return fmt.Errorf("--expected: %w", err)
			}
			others := 0 // recorded rooms other than --room, not compared
			if room != "" {
				exps, others = expectedForRoom(exps, room, cmd.ErrOrStderr())
			}
			defer catchInterrupts("verify", func() string { return "stopped; verify writes nothing" })()
			out := cmd.OutOrStdout()
			v, err := verifyRoomsTo(ctx, rooms, exps, out, asJSON)
			if err != nil {
				return err
			}
			if room != "" && len(expected) > 0 && len(exps) == 0 {
				// The user asked for a comparison and none can be made.
				v.problems++
				printProblem(out, asJSON, room, fmt.Sprintf("no --expected directory records this room (it holds %d recordings of other rooms, named or counted in the warnings): nothing was compared with a recording", others))
			}
			// Its room ID is in the head: the room is not checked, nor
			// compared with what a recording says of it.
			v.problems += printHeadProblems(out, asJSON, badHeads, "the room is not checked")
			if listRejected {
				if err := printRejected(rooms, cmd.OutOrStdout(), asJSON); err != nil {
					return err
				}
			}
			if pf, ok := eng.(*packstore.PackfileStorage); ok && pf.OpenReport().TruncatedBytes > 0 {
				r := pf.OpenReport()
				// A bad tail (opened read-only, it stays on disk): after a crash
				// that is unsynced data, but verify cannot tell it from lost data
				// (docs/known-limits.md).
				v.problems++
				printProblem(out, asJSON, "", fmt.Sprintf("store: %s has a torn or cut-short tail of %d bytes at offset %d, left on disk (index from %s)",
					r.TruncatedFile, r.TruncatedBytes, r.TruncatedAt, r.Source))
			}
			if len(rooms) == 0 && room == "" {
				// Records but no room: another program's store in packstore's
				// format (a Dendrite's state store holds HAMT nodes by NID), or
				// the room heads are lost.
				if st, err := storeStats(eng); err == nil && st.LiveRecords > 0 {
					v.problems++
					printProblem(out, asJSON, "", fmt.Sprintf("store: %d records but no mtxdb room: not a store of mtxdb's rooms (a Dendrite state store, for one), or its room heads are lost; nothing was checked", st.LiveRecords))
				}
			}
			printLine(out, asJSON, "verify", kv{"rooms", len(rooms)}, kv{"events", v.events}, kv{"unchecked_events", v.unchecked}, kv{"unreplayed", v.unreplayed},
				kv{"snapshots", v.snapshots}, kv{"state_not_kept", v.notKept}, kv{"compared_events", v.compared}, kv{"compared_room_dirs", v.comparedRooms},
				kv{"mismatches", v.mismatches}, kv{"problems", v.problems}, kv{"rejected", v.rejected})
			if v.mismatches > 0 || v.problems > 0 {
				return exitError(2)
			}
			return nil
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp)
	c.Flags().StringVar(&room, "room", "", "verify only this room ID")
	c.Flags().StringArrayVar(&expected, "expected", nil, "room directory, or directory of rooms, with recorded state")
	c.Flags().BoolVar(&listRejected, "rejected", false, "print each rejected event with the reason replay recorded (the authorization rule)")
	jsonFlag(c, &asJSON)
	return c
}

// otherRecordingsNamed is how many recordings of rooms other than --room
// expectedForRoom names in a warning of their own; the rest are counted in one.
const otherRecordingsNamed = 3

// expectedForRoom keeps of exps only the recordings of room (none: an empty
// map), warning to warn of the recordings of other rooms (the first
// otherRecordingsNamed by name, the rest by count), and returns how many
// recordings it left out.
func expectedForRoom(exps map[string][]*recorded.Expected, room string, warn io.Writer) (map[string][]*recorded.Expected, int) {
	others := 0
	for _, exp := range sortedExpected(exps) {
		if exp.RoomID != room {
			if others < otherRecordingsNamed {
				fmt.Fprintf(warn, "mtxdb: warning: %s records room %s, not --room %s: not compared\n", exp.Dir, exp.RoomID, room)
			}
			others++
		}
	}
	if others > otherRecordingsNamed {
		fmt.Fprintf(warn, "mtxdb: warning: %d more recordings of rooms other than --room %s: not compared\n", others-otherRecordingsNamed, room)
	}
	if len(exps[room]) == 0 {
		return map[string][]*recorded.Expected{}, others
	}
	return map[string][]*recorded.Expected{room: exps[room]}, others
}

// loadExpectedDirs reads recorded state from room directories or directories of
// rooms, keyed by room ID. Several directories may hold versions of one room (the
// real rooms' room004 and room004_union): all of them are kept, in directory order.
// A subdirectory that is neither a room directory nor a recorded room is skipped
// with a warning to warn.
func loadExpectedDirs(paths []string, warn io.Writer) (map[string][]*recorded.Expected, error) {
	out := map[string][]*recorded.Expected{}
	seen := map[string]bool{} // room directories read, by absolute path, symlinks resolved
	for _, p := range paths {
		dirs := []string{p}
		if _, err := os.Stat(filepath.Join(p, "expected_state.jsonl")); err != nil {
			if dirs, err = recorded.RecordingDirs(p); err != nil {
				return nil, err
			}
			others, err := recorded.OtherSubdirs(p, dirs)
			if err != nil {
				return nil, err
			}
			for _, d := range others {
				fmt.Fprintf(warn, "mtxdb: warning: %s holds neither events.jsonl nor expected_state.jsonl: skipped\n", d)
			}
		}
		if len(dirs) == 0 {
			if _, ok, _ := recorded.EventsFile(p); ok {
				// A room without its recording is a data problem: exit 2.
				return nil, corruptError{fmt.Errorf("%s is a room directory without expected_state.jsonl: no state its server recorded to compare with", p)}
			}
			return nil, fmt.Errorf("%s holds no recorded room: a recorded room's directory holds expected_state.jsonl and meta.json (and events.jsonl, or state_groups.jsonl)", p)
		}
		for _, d := range dirs {
			abs, err := filepath.Abs(d)
			if err != nil {
				return nil, err
			}
			if real, err := filepath.EvalSymlinks(abs); err == nil {
				abs = real // a symlinked room directory is the directory it names
			}
			if seen[abs] {
				fmt.Fprintf(warn, "mtxdb: warning: %s given more than once: read once\n", d)
				continue
			}
			seen[abs] = true
			if _, err := os.Stat(filepath.Join(d, "expected_state.jsonl")); errors.Is(err, fs.ErrNotExist) {
				return nil, corruptError{fmt.Errorf("%s holds events.jsonl but no expected_state.jsonl: no state its server recorded to compare with", d)}
			}
			exp, err := recorded.Open(d)
			if errors.Is(err, recorded.ErrMalformed) {
				return nil, corruptError{err} // the recording is wrong: exit 2
			} else if err != nil {
				return nil, err
			}
			if exp.RoomID == "" {
				return nil, fmt.Errorf("%s: no meta.json naming the room_id", d)
			}
			out[exp.RoomID] = append(out[exp.RoomID], exp)
		}
	}
	return out, nil
}

// sortedExpected returns the recorded rooms ordered by directory.
func sortedExpected(exps map[string][]*recorded.Expected) []*recorded.Expected {
	var out []*recorded.Expected
	for _, es := range exps {
		out = append(out, es...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dir < out[j].Dir })
	return out
}

type verifyTotals struct {
	events, snapshots, compared, comparedRooms, mismatches, problems int
	// notKept: events whose state an every-k repack dropped (not compared, not a problem).
	notKept int
	// rejected: events replay rejected (their reasons: verify --rejected).
	rejected int
	// unreplayed: events without a state record in rooms not replayed to their end.
	unreplayed int
	// unchecked: events of rooms whose check failed (not in events).
	unchecked int
}

// verifyRooms is verifyRoomsTo with text output.
func verifyRooms(ctx context.Context, rooms []*roomstate.Room, exps map[string][]*recorded.Expected, out io.Writer) (verifyTotals, error) {
	return verifyRoomsTo(ctx, rooms, exps, out, false)
}

// verifyRoomsTo checks every room and compares those with recorded state. A room
// that fails its check or comparison is printed as a problem and counted; the other
// rooms are still verified. A recorded room the store does not hold, or has not
// replayed, is a problem too. An error that says the store itself was lost (closed,
// an I/O or connection error: lostStore) ends the run with that error, not a
// problem: exit status 1, not 2.
func verifyRoomsTo(ctx context.Context, rooms []*roomstate.Room, exps map[string][]*recorded.Expected, out io.Writer, asJSON bool) (verifyTotals, error) {
	var v verifyTotals
	var total int64
	for _, r := range rooms {
		total += int64(r.Head().Events)
		for _, exp := range exps[r.ID()] {
			total += int64(exp.States)
		}
	}
	bar := newProgress(out, total, "verify", false)
	var base int64
	inStore := map[string]bool{}
	for _, r := range rooms {
		inStore[r.ID()] = true
		n := int64(r.Head().Events)
		cr, err := r.Check(ctx, func(i int) { bar.set(base + int64(i)) })
		base += n
		bar.set(base)
		if err != nil && lostStore(err) {
			bar.finish()
			return v, fmt.Errorf("verify room %s: %w", r.ID(), err)
		}
		if err != nil {
			v.problems++
			v.unchecked += int(n)
			bar.clear()
			printProblem(out, asJSON, r.ID(), fmt.Sprintf("%v (its %d events are not checked)", err, n))
			for _, exp := range exps[r.ID()] {
				base += int64(exp.States)
			}
			continue
		}
		v.events += cr.Events
		v.snapshots += cr.Snapshots
		v.notKept += cr.NotKept
		v.rejected += cr.Rejected
		v.unreplayed += cr.Unreplayed
		if cr.Unreplayed > 0 {
			bar.clear()
			if asJSON {
				printLine(out, true, "unreplayed", kv{"room", r.ID()}, kv{"events", cr.Unreplayed}, kv{"of", cr.Events})
			} else {
				fmt.Fprintf(out, "unreplayed room=%s: %d of %d events have no state record yet (mtxdb replay computes them)\n", r.ID(), cr.Unreplayed, cr.Events)
			}
		}
		for _, exp := range exps[r.ID()] {
			if cr.Unreplayed > 0 {
				v.problems++
				base += int64(exp.States)
				bar.clear()
				printProblem(out, asJSON, r.ID(), fmt.Sprintf("against %s: room not replayed (%d of %d events have no state record; mtxdb replay)", exp.Dir, cr.Unreplayed, cr.Events))
				continue
			}
			res, err := recorded.CompareProgress(ctx, r, exp, func(m recorded.Mismatch) {
				bar.clear()
				if asJSON {
					printLine(out, true, "mismatch", kv{"room", m.Room}, kv{"event", m.Event}, kv{"key", m.Key}, kv{"ours", m.Ours}, kv{"recorded", m.Recorded})
				} else {
					fmt.Fprintln(out, m)
				}
			}, func(i int) { bar.set(base + int64(i)) })
			base += int64(exp.States)
			bar.set(base)
			if err != nil && lostStore(err) {
				bar.finish()
				return v, fmt.Errorf("verify room %s against %s: %w", r.ID(), exp.Dir, err)
			}
			if err != nil {
				v.problems++
				bar.clear()
				printProblem(out, asJSON, r.ID(), fmt.Sprintf("against %s: %v", exp.Dir, err))
				continue
			}
			v.compared += res.Events
			v.comparedRooms++
			v.mismatches += res.Mismatches
		}
	}
	bar.finish()
	for _, id := range sortedSet(keysOf(exps)) {
		if !inStore[id] {
			for _, exp := range exps[id] {
				v.problems++
				printProblem(out, asJSON, id, fmt.Sprintf("recorded in %s but not in the store", exp.Dir))
			}
		}
	}
	return v, nil
}
