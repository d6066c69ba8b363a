package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/pgstore"
	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/repackplan"
	"github.com/mtxdb/mtxdb/roomstate"
)

// demoCmd is mtxdb demo: the main job (import, replay, verify, repack, verify
// again) on a directory of recorded rooms, in a fresh store.
func demoCmd() *cobra.Command {
	var roomsDir, store string
	var keep bool
	c := &cobra.Command{
		Use:   "demo [--rooms DIR] [--store DIR] [--keep]",
		Short: "The main job: import real rooms, replay, verify, repack, verify again",
		Long: `Demo imports every room under --rooms (default testrooms/real, the bundled real
rooms: a path relative to the current directory, so run demo from the repository
root or pass --rooms DIR) into a fresh store in a temporary directory, replays them through state
resolution, compares the state after every event with what the origin server recorded,
repacks all rooms through one output stream, reopens the store, checks and compares
again, and prints one summary line of key=value pairs. Exit status 2 on mismatches.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			ctx := cmd.Context()
			start := time.Now()
			// The rooms first: a run that cannot read them leaves no temporary
			// directory behind, --keep or not.
			exps, err := demoRooms(roomsDir, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			scratch, err := demoScratch(&store, keep) // the temporary directory this run made and removes
			if err != nil {
				return err
			}
			if scratch != "" {
				defer os.RemoveAll(scratch)
			}
			// On Ctrl-C, say what is left: a temporary store is removed.
			defer catchInterrupts("demo", func() string {
				if scratch == "" {
					return "stopped; the store is left in " + pgstore.Redacted(store)
				}
				os.RemoveAll(scratch)
				return "stopped; its temporary store was removed"
			})()
			d, err := openDemo(ctx, cmd.OutOrStdout(), store)
			if err != nil {
				return err
			}
			defer d.close()
			// On a failure, name the store a run leaves (--keep or --store).
			defer func() {
				var code exitError
				switch {
				case err == nil || scratch != "":
				case errors.As(err, &code):
					fmt.Fprintf(cmd.ErrOrStderr(), "mtxdb: demo: the store is left in %s\n", pgstore.Redacted(store))
				default:
					err = fmt.Errorf("%w (the store is left in %s)", err, pgstore.Redacted(store))
				}
			}()
			s, err := d.run(ctx, exps)
			if err != nil {
				return err
			}
			fmt.Fprintf(d.out, "summary room_dirs=%d rooms=%d events=%d rejected=%d compared_events=%d mismatches=%d bytes_before=%d bytes_after=%d records_dropped=%d shards_retired=%d seconds=%.1f\n",
				s.dirs, s.rooms, s.events, s.rejected, s.compared, s.mismatches, s.bytesBefore, s.bytesAfter,
				s.recordsDropped, s.shardsRetired, time.Since(start).Seconds())
			if s.mismatches > 0 {
				return exitError(2)
			}
			return nil
		},
	}
	c.Flags().StringVar(&roomsDir, "rooms", defaultDemoRooms, "directory of room directories (events.jsonl, expected_state.jsonl)")
	c.Flags().StringVar(&store, "store", "", storeHelp+" (default: a new temporary directory, removed afterwards)")
	c.Flags().BoolVar(&keep, "keep", false, "keep the temporary store")
	return c
}

// defaultDemoRooms is demo's --rooms: the bundled real rooms, relative to the
// repository root.
const defaultDemoRooms = "testrooms/real"

// demoRooms reads the recorded state of the rooms under dir, keyed by room ID, and
// checks that each has events to import. When dir is the default and is not
// there, the error says it is relative to the current directory.
func demoRooms(dir string, warn io.Writer) (map[string][]*recorded.Expected, error) {
	exps, err := loadExpectedDirs([]string{dir}, warn)
	if err != nil && dir == defaultDemoRooms && errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("demo: rooms: %w (the default --rooms %s is relative to the current directory: run mtxdb demo from the repository root, or pass --rooms DIR)", err, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("demo: rooms: %w", err)
	}
	if len(exps) == 0 {
		return nil, fmt.Errorf("demo: no room directories (events.jsonl, expected_state.jsonl, meta.json) under %s", dir)
	}
	for _, exp := range sortedExpected(exps) {
		if _, ok, err := recorded.EventsFile(exp.Dir); err != nil {
			return nil, fmt.Errorf("demo: rooms: %w", err)
		} else if !ok {
			return nil, fmt.Errorf("demo: rooms: %s has the state its server recorded (expected_state.jsonl) but no events.jsonl to import", exp.Dir)
		}
	}
	return exps, nil
}

// demoScratch sets *store to a store in a new temporary directory when none was
// given, and returns that directory unless keep: the one the run removes ("" for
// none).
func demoScratch(store *string, keep bool) (string, error) {
	if *store != "" {
		return "", nil
	}
	if !keep {
		// A reader that goes away (mtxdb demo | head -1) must not kill the
		// demo before it removes its temporary store: with SIGPIPE
		// caught, writes to the closed pipe fail instead, and the demo
		// runs to its end and cleans up.
		signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	}
	tmp, err := os.MkdirTemp("", "mtxdb-demo-")
	if err != nil {
		return "", err
	}
	*store = filepath.Join(tmp, "store")
	if keep {
		return "", nil
	}
	return tmp, nil
}

// demo is one run of mtxdb demo over its store.
type demo struct {
	out   io.Writer
	store string
	eng   storeEngine // nil while closed
	st    *roomstate.Store
}

// demoSummary is what the demo's summary line counts.
type demoSummary struct {
	dirs, rooms, events, rejected, compared, mismatches int
	bytesBefore, bytesAfter                             int64
	recordsDropped, shardsRetired                       int
}

// openDemo opens or creates the store, which must hold no room: the summary
// counts this run's rooms, and a store holding others would be replayed and
// repacked with them.
func openDemo(ctx context.Context, out io.Writer, store string) (*demo, error) {
	eng, st, err := openStore(store, true)
	if err != nil {
		return nil, err
	}
	if held, err := st.Rooms(ctx); err != nil {
		eng.Close()
		return nil, err
	} else if len(held) > 0 {
		eng.Close()
		return nil, fmt.Errorf("demo: %s already holds %d room(s): the demo replays and repacks every room of its store; give --store a new or empty store",
			pgstore.Redacted(store), len(held))
	}
	return &demo{out: out, store: store, eng: eng, st: st}, nil
}

// close closes the store if it is open.
func (d *demo) close() {
	if d.eng != nil {
		d.eng.Close()
	}
}

// run is the demo's phases: import every room, replay, verify against the
// recorded state, repack every room through one output stream, reopen and
// verify again from disk. Each prints its line.
func (d *demo) run(ctx context.Context, exps map[string][]*recorded.Expected) (demoSummary, error) {
	var s demoSummary
	rooms, err := d.importRooms(ctx, exps, &s)
	if err != nil {
		return s, err
	}
	rep, problems, err := replayRooms(ctx, rooms, false, d.out, nil)
	if err != nil {
		return s, err
	}
	problems.print(d.out, false)
	fmt.Fprintf(d.out, "demo: replayed events=%d rejected=%d resolutions=%d conflicted_keys=%d\n",
		rep.Events, rep.Rejected, rep.Resolutions, rep.ConflictedKeys)
	s.events, s.rejected = rep.Events, rep.Rejected
	v1, err := verifyRooms(ctx, rooms, exps, d.out)
	if err != nil {
		return s, err
	}
	fmt.Fprintf(d.out, "demo: verified before repack: compared_events=%d mismatches=%d\n", v1.compared, v1.mismatches)
	more, err := d.repack(ctx, rooms, &s)
	if err != nil {
		return s, err
	}
	problems = append(problems, more...)
	v2, err := d.reverify(ctx, exps, &s)
	if err != nil {
		return s, err
	}
	// The larger of the two checks': the same mismatch is found before and
	// after the repack, and counted once.
	s.compared = v2.compared
	s.mismatches = max(v1.mismatches+v1.problems, v2.mismatches+v2.problems)
	if s.mismatches == 0 && len(problems) > 0 {
		s.mismatches = len(problems) // a room replay or repack skipped
	}
	return s, nil
}

// importRooms imports every recorded room's events.jsonl, in directory order, and
// returns the store's rooms.
func (d *demo) importRooms(ctx context.Context, exps map[string][]*recorded.Expected, s *demoSummary) ([]*roomstate.Room, error) {
	imported := 0
	for _, exp := range sortedExpected(exps) {
		s.dirs++
		res, err := importFile(ctx, d.st, filepath.Join(exp.Dir, "events.jsonl"), roomstate.ImportOptions{}, d.out)
		if err != nil {
			return nil, err
		}
		imported += res.Imported
	}
	rooms, err := d.st.Rooms(ctx)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(d.out, "demo: imported room_dirs=%d rooms=%d events=%d into %s\n", s.dirs, len(rooms), imported, pgstore.Redacted(d.store))
	testStall("demo-imported")
	return rooms, nil
}

// repack repacks every room through one output stream with the default plan and
// returns the rooms it could not plan.
func (d *demo) repack(ctx context.Context, rooms []*roomstate.Room, s *demoSummary) (roomProblems, error) {
	before, err := storeStats(d.eng)
	if err != nil {
		return nil, err
	}
	s.bytesBefore = before.DiskBytes
	rs, more, err := repackRooms(ctx, d.eng, rooms, repackplan.Options{Kind: repackplan.ReverseTopological}, d.out)
	if err != nil {
		return nil, err
	}
	more.print(d.out, false)
	fmt.Fprintf(d.out, "demo: repacked rooms=%d records_copied=%d records_dropped=%d shards_retired=%d\n",
		rs.CollectionsRepacked, rs.RecordsCopied, rs.RecordsDropped, rs.ShardsRetired)
	s.recordsDropped, s.shardsRetired = rs.RecordsDropped, rs.ShardsRetired
	return more, nil
}

// reverify closes the store, reopens it and verifies every room again from disk.
func (d *demo) reverify(ctx context.Context, exps map[string][]*recorded.Expected, s *demoSummary) (verifyTotals, error) {
	if err := d.eng.Close(); err != nil {
		return verifyTotals{}, err
	}
	d.eng = nil
	eng, st, err := openStore(d.store, false)
	if err != nil {
		return verifyTotals{}, fmt.Errorf("demo: reopen after repack: %w", err)
	}
	d.eng, d.st = eng, st
	after, err := storeStats(eng)
	if err != nil {
		return verifyTotals{}, err
	}
	s.bytesAfter = after.DiskBytes
	rooms, err := st.Rooms(ctx)
	if err != nil {
		return verifyTotals{}, err
	}
	s.rooms = len(rooms)
	v, err := verifyRooms(ctx, rooms, exps, d.out)
	if err != nil {
		return verifyTotals{}, err
	}
	fmt.Fprintf(d.out, "demo: verified after repack: compared_events=%d mismatches=%d\n", v.compared, v.mismatches)
	return v, nil
}
