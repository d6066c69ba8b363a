package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/testrooms/gen"
)

// genCmd is mtxdb gen: a generated room history (or several) in the layout of
// testrooms/real.
func genCmd() *cobra.Command {
	opts := gen.DefaultOptions()
	var out, keysOut string
	var rooms int
	c := &cobra.Command{
		Use:   "gen --out DIR [--seed N --events N --servers N --room-version V ...]",
		Short: "Generate a large, realistic, valid room history (deterministic by seed)",
		Long: `Gen simulates homeservers sharing a room (own users, own signing keys, own view
of the DAG, delayed and lost federation traffic) and writes the history in the
layout of testrooms/real: events.jsonl (arrival order at the origin server),
expected_state.jsonl, current_state.json and meta.json (counts, forks, rejected
events, state events by type, the parameters, the server keys). The same options
give byte-identical output (meta.json's "room" is DIR's name). The files are
written to a new directory beside DIR and renamed to DIR at the end, so a failed or
interrupted run leaves no partial room at DIR.

With --rooms N it writes N rooms (seeds seed..seed+N-1, wrapping after 2^64-1;
every room signed with the keys of the first seed) under DIR/roomNNN and
DIR/interleaved.jsonl: all their events as the origin server received them.
With --backfill it also writes backfill_order.jsonl ({"event_id", "batch"} lines)
and events_backfill.jsonl (the PDUs in that order, for import --any-order
--room-version V).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			if rooms < 1 {
				return fmt.Errorf("gen: --rooms %d: at least 1", rooms)
			}
			if cmd.Flags().Changed("backfill-batch") && !opts.Backfill {
				return fmt.Errorf("gen: --backfill-batch applies only with --backfill")
			}
			if err := checkGenOut(out); err != nil {
				return err
			}
			defer removeOnSignal(out)()
			if keysOut != "" {
				// The servers' public keys, for import --keys (written first: it
				// does not depend on the rooms).
				if err := os.WriteFile(keysOut, gen.KeyRing(opts).Encode(), 0o644); err != nil {
					return fmt.Errorf("gen: --keys: %w", err)
				}
			}
			start := time.Now()
			// The generator allocates much short-lived JSON: collect less often,
			// within the soft heap limit (defaultGenLimit).
			debug.SetGCPercent(400)
			if rooms > 1 {
				return generateRooms(cmd, opts, rooms, out, start)
			}
			return generateRoom(cmd, opts, out, start)
		},
	}
	f := c.Flags()
	f.StringVar(&out, "out", "", "output directory")
	f.StringVar(&keysOut, "keys", "", "also write the servers' public signing keys to this file (for import --keys)")
	f.IntVar(&rooms, "rooms", 1, "number of rooms (multi-room mode when > 1)")
	f.Uint64Var(&opts.Seed, "seed", opts.Seed, "seed")
	f.IntVar(&opts.Events, "events", opts.Events, "events per room")
	f.IntVar(&opts.Servers, "servers", opts.Servers, fmt.Sprintf("simulated homeservers (at most %d)", gen.MaxServers))
	f.StringVar(&opts.RoomVersion, "room-version", opts.RoomVersion, "room version: 10, 11 or 12")
	f.IntVar(&opts.Members, "members", 0, fmt.Sprintf("joined members to grow towards (default events/5, at least 10, at most %d)", gen.MaxMembers))
	f.IntVar(&opts.MaxPrevEvents, "max-prev-events", opts.MaxPrevEvents, "cap on prev_events of created events")
	f.IntVar(&opts.MaxDelay, "max-delay", opts.MaxDelay, "largest federation delay, in ticks (one event per tick)")
	f.Float64Var(&opts.Loss, "loss", opts.Loss, "probability a send to one server is lost")
	f.Float64Var(&opts.BadRate, "bad-rate", opts.BadRate, "share of events from users lacking the permission (rejected)")
	f.IntVar(&opts.StateBudget, "state-budget", 0, "state entries to aim for in expected_state.jsonl (default 2M; beyond it every k-th event, and the last event always)")
	f.StringVar(&opts.Resolver, "resolver", "mtxdb", "state resolution: mtxdb (resolver.ResolveConflicts, spec v2/v2.1) or gmsl (gomatrixserverlib v2, v10/v11 only)")
	f.BoolVar(&opts.ReferenceAll, "reference-all", false, "have the reference check every event, not a sample, in rooms of more than 10,000 events (about 2.5 CPU-hours at 100k)")
	f.BoolVar(&opts.NoReference, "no-reference", false, "skip the reference implementation (resolver/specres): expected_state.jsonl then records the generator's own resolution (quick runs, profiling)")
	f.BoolVar(&opts.Backfill, "backfill", false, "also write backfill_order.jsonl and events_backfill.jsonl (reverse-chronological batches)")
	f.IntVar(&opts.BackfillBatch, "backfill-batch", opts.BackfillBatch, "events per backfill batch")
	for _, w := range opts.Mix.Weights() {
		f.Float64Var(w.P, "mix-"+w.Name, *w.P, "relative weight of "+w.Name+" events")
	}
	return c
}

// reportReference prints what the reference implementation checked in a room
// (stdout), and on stderr where it disagreed with the generator's resolution:
// the room is written all the same, with the reference's states, so verify
// --expected fails on it.
func reportReference(cmd *cobra.Command, m *gen.Meta) {
	ref := m.Reference
	if ref == nil {
		return
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s: reference (resolver/specres): %d events checked (every %d), %d resolutions, in %s (%s CPU) on %d workers; mismatches=%d current_state_mismatched_keys=%d\n",
		m.Room, ref.CheckedEvents, ref.Every, ref.Resolutions, ref.Time.Round(time.Millisecond), ref.CPU.Round(time.Millisecond), ref.Workers, ref.Mismatches, ref.CurrentStateMismatchedKeys)
	if ref.Mismatches == 0 && ref.CurrentStateMismatchedKeys == 0 {
		return
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "mtxdb: gen: %s: the reference and the generator's resolution disagree at %d events (%d keys, %d rejections) and in %d keys of the current state; the room records the reference's states, so verify --expected will fail on it (meta.json \"reference\"):\n",
		m.Room, ref.Mismatches, ref.MismatchedKeys, ref.RejectionMismatches, ref.CurrentStateMismatchedKeys)
	for _, d := range ref.First {
		fmt.Fprintf(cmd.ErrOrStderr(), "  %s\n", d)
	}
}

// sameDevice reports whether two files are on the same file system.
func sameDevice(a, b os.FileInfo) bool {
	sa, ok1 := a.Sys().(*syscall.Stat_t)
	sb, ok2 := b.Sys().(*syscall.Stat_t)
	return !ok1 || !ok2 || sa.Dev == sb.Dev
}

// checkGenOut refuses an --out that cannot become the new room: a dangling
// symbolic link, a directory that is not empty (a stale room or file from an
// earlier run would sit beside the new ones, and verify would report rooms the
// new meta.json does not list), or a mount point or the root (an existing empty
// --out is replaced by the new room at the end).
func checkGenOut(out string) error {
	if target, ok := danglingLink(out); ok {
		return fmt.Errorf("gen: --out %s is a symbolic link to %s, which does not exist", out, target)
	}
	switch ents, err := os.ReadDir(out); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("--out: %w", err)
	case len(ents) > 0:
		return fmt.Errorf("--out %s is not empty; give a new or empty directory", out)
	}
	if fi, err := os.Stat(out); err == nil && fi.IsDir() {
		abs, _ := filepath.Abs(out)
		if pfi, err := os.Stat(filepath.Dir(abs)); err != nil || abs == filepath.Dir(abs) || !sameDevice(fi, pfi) {
			return fmt.Errorf("gen: --out %s is a mount point or the root: give a directory inside it", out)
		}
	}
	return nil
}

// removeOnSignal removes the room being written beside out on SIGINT or SIGTERM,
// then exits as the signal would (a SIGKILLed run's directory is removed by the
// next run on the same out). The function it returns stops that.
func removeOnSignal(out string) (stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig, ok := <-sigs
		if !ok {
			return
		}
		for _, d := range gen.TempDirs(out) {
			os.RemoveAll(d)
		}
		fmt.Fprintf(os.Stderr, "mtxdb: gen: %v: stopped, nothing written to %s\n", sig, out)
		os.Exit(128 + int(sig.(syscall.Signal)))
	}()
	return func() { signal.Stop(sigs) }
}

// generateRooms writes rooms rooms under out (gen --rooms N) and prints their
// counts and what the reference checked in each.
func generateRooms(cmd *cobra.Command, opts gen.Options, rooms int, out string, start time.Time) error {
	bar := newProgress(os.Stderr, int64(rooms*opts.Events), "generating", false)
	metas, err := gen.GenerateMulti(opts, rooms, out, func(n int) { bar.add(n) })
	bar.finish()
	if err != nil {
		return err
	}
	events := 0
	for _, m := range metas {
		events += m.Counts.Events
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%d rooms, %d events in %s (%s)\n", len(metas), events, out, time.Since(start).Round(time.Millisecond))
	for _, m := range metas {
		reportReference(cmd, m)
	}
	return nil
}

// generateRoom writes one room to out, with a bar for the events and one for
// the reference's checks, and prints its counts and what the reference checked.
func generateRoom(cmd *cobra.Command, opts gen.Options, out string, start time.Time) error {
	bar := newProgress(os.Stderr, int64(opts.Events), "generating", false)
	last := 0
	var refBar *progress
	meta, err := gen.GenerateProgress(opts, out, gen.Progress{
		Events: func(done int) { bar.add(done - last); last = done },
		Reference: func(done, total int) {
			if done == 1 {
				bar.finish()
				refBar = newProgress(os.Stderr, int64(total), "reference", false)
			}
			refBar.set(int64(done))
		},
	})
	bar.finish()
	refBar.finish()
	if err != nil {
		return err
	}
	c := meta.Counts
	fmt.Fprintf(cmd.OutOrStdout(), "%s: room %s v%s: %d events (%d state, %d rejected, %d soft-failed), %d with >1 prev_events (max %d), %d joined members, %d resolutions, in %s\n",
		filepath.Clean(out), meta.RoomID, meta.RoomVersion, c.Events, c.StateEvents, c.Rejected, c.SoftFailed,
		c.EventsWithGT1Prev, c.MaxPrevEvents, c.JoinedMembers, meta.Resolution.Resolutions, time.Since(start).Round(time.Millisecond))
	reportReference(cmd, meta)
	return nil
}
