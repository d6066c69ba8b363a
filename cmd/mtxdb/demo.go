package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/pgstore"
	"github.com/mtxdb/mtxdb/repackplan"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/testrooms"
)

func demoCmd() *cobra.Command {
	var roomsDir, store string
	var keep bool
	c := &cobra.Command{
		Use:   "demo [--rooms DIR] [--store DIR] [--keep]",
		Short: "The main job: import real rooms, replay, verify, repack, verify again",
		Long: `Demo imports every room under --rooms (default testrooms/real, the bundled real
rooms) into a fresh store in a temporary directory, replays them through state
resolution, compares the state after every event with what the origin server recorded,
repacks all rooms through one output stream, reopens the store, checks and compares
again, and prints one summary line of key=value pairs. Exit status 2 on mismatches.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			out := cmd.OutOrStdout()
			start := time.Now()
			// The rooms first: a run that cannot read them leaves no temporary
			// directory behind, --keep or not.
			exps, err := loadExpectedDirs([]string{roomsDir}, cmd.ErrOrStderr())
			if err != nil {
				return fmt.Errorf("demo: rooms: %w", err)
			}
			if len(exps) == 0 {
				return fmt.Errorf("demo: no room directories (events.jsonl, expected_state.jsonl, meta.json) under %s", roomsDir)
			}
			for _, exp := range sortedExpected(exps) {
				if _, ok, err := testrooms.EventsFile(exp.Dir); err != nil {
					return fmt.Errorf("demo: rooms: %w", err)
				} else if !ok {
					return fmt.Errorf("demo: rooms: %s has the state its server recorded (expected_state.jsonl) but no events.jsonl to import", exp.Dir)
				}
			}
			scratch := "" // the temporary directory this run made and removes
			if store == "" && !keep {
				// A reader that goes away (mtxdb demo | head -1) must not kill the
				// demo before it removes its temporary store: with SIGPIPE
				// caught, writes to the closed pipe fail instead, and the demo
				// runs to its end and cleans up.
				signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
			}
			if store == "" {
				tmp, err := os.MkdirTemp("", "mtxdb-demo-")
				if err != nil {
					return err
				}
				store = filepath.Join(tmp, "store")
				if !keep {
					scratch = tmp
					defer os.RemoveAll(tmp)
				}
			}
			// On Ctrl-C, say what is left: a temporary store is removed.
			defer catchInterrupts("demo", func() string {
				if scratch == "" {
					return "stopped; the store is left in " + pgstore.Redacted(store)
				}
				os.RemoveAll(scratch)
				return "stopped; its temporary store was removed"
			})()
			eng, st, err := openStore(store, true)
			if err != nil {
				return err
			}
			defer func() {
				if eng != nil {
					eng.Close()
				}
			}()
			// The summary counts this run's rooms: a store holding others would be
			// replayed and repacked with them.
			if held, err := st.Rooms(); err != nil {
				return err
			} else if len(held) > 0 {
				return fmt.Errorf("demo: %s already holds %d room(s): the demo replays and repacks every room of its store; give --store a new or empty store",
					pgstore.Redacted(store), len(held))
			}
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

			// 1. Import.
			imported, dirs := 0, 0
			for _, exp := range sortedExpected(exps) {
				dirs++
				res, err := importFile(st, filepath.Join(exp.Dir, "events.jsonl"), roomstate.ImportOptions{}, out)
				if err != nil {
					return err
				}
				imported += res.Imported
			}
			rooms, err := st.Rooms()
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "demo: imported room_dirs=%d rooms=%d events=%d into %s\n", dirs, len(rooms), imported, pgstore.Redacted(store))
			testStall("demo-imported")

			// 2. Replay.
			rep, problems, err := replayRooms(rooms, false, out, nil)
			if err != nil {
				return err
			}
			problems.print(out, false)
			fmt.Fprintf(out, "demo: replayed events=%d rejected=%d resolutions=%d conflicted_keys=%d\n",
				rep.Events, rep.Rejected, rep.Resolutions, rep.ConflictedKeys)

			// 3. Verify against the recorded state.
			v1, err := verifyRooms(rooms, exps, out)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "demo: verified before repack: compared_events=%d mismatches=%d\n", v1.compared, v1.mismatches)

			// 4. Repack every room through one output stream.
			before, err := storeStats(eng)
			if err != nil {
				return err
			}
			rs, more, err := repackRooms(eng, rooms, repackplan.Options{Kind: repackplan.ReverseTopological}, out)
			if err != nil {
				return err
			}
			more.print(out, false)
			problems = append(problems, more...)
			fmt.Fprintf(out, "demo: repacked rooms=%d records_copied=%d records_dropped=%d shards_retired=%d\n",
				rs.CollectionsRepacked, rs.RecordsCopied, rs.RecordsDropped, rs.ShardsRetired)

			// 5. Reopen and verify again from disk.
			if err := eng.Close(); err != nil {
				return err
			}
			eng = nil
			eng2, st2, err := openStore(store, false)
			if err != nil {
				return fmt.Errorf("demo: reopen after repack: %w", err)
			}
			eng = eng2
			after, err := storeStats(eng2)
			if err != nil {
				return err
			}
			rooms2, err := st2.Rooms()
			if err != nil {
				return err
			}
			v2, err := verifyRooms(rooms2, exps, out)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "demo: verified after repack: compared_events=%d mismatches=%d\n", v2.compared, v2.mismatches)

			// The larger of the two checks': the same mismatch is found before and
			// after the repack, and counted once.
			mismatches := max(v1.mismatches+v1.problems, v2.mismatches+v2.problems)
			if mismatches == 0 && len(problems) > 0 {
				mismatches = len(problems) // a room replay or repack skipped
			}
			fmt.Fprintf(out, "summary room_dirs=%d rooms=%d events=%d rejected=%d compared_events=%d mismatches=%d bytes_before=%d bytes_after=%d records_dropped=%d shards_retired=%d seconds=%.1f\n",
				dirs, len(rooms2), rep.Events, rep.Rejected, v2.compared, mismatches, before.DiskBytes, after.DiskBytes,
				rs.RecordsDropped, rs.ShardsRetired, time.Since(start).Seconds())
			if mismatches > 0 {
				return exitError(2)
			}
			return nil
		},
	}
	c.Flags().StringVar(&roomsDir, "rooms", "testrooms/real", "directory of room directories (events.jsonl, expected_state.jsonl)")
	c.Flags().StringVar(&store, "store", "", storeHelp+" (default: a new temporary directory, removed afterwards)")
	c.Flags().BoolVar(&keep, "keep", false, "keep the temporary store")
	return c
}
