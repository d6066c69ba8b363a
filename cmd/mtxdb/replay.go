package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime/debug"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/pgstore"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomrecord"
	"github.com/mtxdb/mtxdb/roomstate"
)

// replayCmd is mtxdb replay: the state before and after every event of each room,
// through state resolution, and the rooms' current state.
func replayCmd() *cobra.Command {
	var store, room string
	var force, asJSON bool
	c := &cobra.Command{
		Use:   "replay --store DIR [--room ROOM_ID] [--force]",
		Short: "Compute the state before and after every event through state resolution",
		Long: `Replay walks each room's events in topological order over prev and auth events
(ties by arrival; events whose ancestors never arrived are left out as outliers),
resolves the states after each event's prev_events into the state before it, authorises the
event against its auth events and that state (rejecting it otherwise), and stores both
snapshots; then sets forward extremities and current state. Replay is incremental:
events that already have a state record keep it (unless an earlier event was
recomputed), so it computes only what import added; --force recomputes everything.
After an every-k repack, events whose state was dropped stay without one
(state_not_kept); a new event whose prev_events name one gets it recomputed in memory
(rederived). --force writes every state record again and clears the every-k rule
when it starts: after a --force that did not finish (killed, interrupted), a plain
replay computes the events still without a state record.
It prints one summary line; use verify --expected to compare with recorded state.
Under a soft heap limit (--memory-limit, default 900MiB) and without GOGC set,
replay collects garbage at GOGC=200: faster, with a larger heap in rooms whose live
heap is well under the limit (a 100k-event room: about 0.4-0.5 GiB of RSS). A
1M-event room peaks under 1 GiB of RSS; a larger one needs a higher limit (its live
heap grows with the room: 450-560 MB at 1M events).

A room that cannot be replayed (a record that does not decode, an event the rules
cannot handle) is skipped with a "problem room=…" line and the other rooms are
replayed; so is a room collection whose head record cannot be read, named by its
collection ID in a "problem" line (the room ID is in the head). Events that lie on a cycle of prev_events and auth_events (or descend
from one) are left out as outliers and named in a problem line. The summary counts
rooms (every room collection), rooms_failed and cyclic; exit status 2 when there
is any problem.

Ctrl-C (SIGINT) or SIGTERM stops before the next event: the states computed so far
are synced, the command prints its summary and how to continue, and exits 130
(143). A second signal stops at once.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if err := nonEmptyFlag(cmd, "room", room); err != nil {
				return err
			}
			replayGC()
			storeCacheBytes, storePreadKinds = replayCacheBytes, replayPreadKinds
			eng, rooms, badHeads, err := openRoomsAndErrors(ctx, store, room, false)
			if err != nil {
				return err
			}
			defer eng.Close()
			defer catchInterrupts("replay", nil)()
			var durs []time.Duration
			tot, problems, err := replayRooms(ctx, rooms, force, cmd.OutOrStdout(), &durs)
			stopped := errors.Is(err, resolver.ErrStopped)
			if err != nil && !stopped {
				return err
			}
			problems.print(cmd.OutOrStdout(), asJSON)
			unreadable := printHeadProblems(cmd.OutOrStdout(), asJSON, badHeads, "the room is not replayed")
			p50, p99 := percentile(durs, 0.50), percentile(durs, 0.99)
			printLine(cmd.OutOrStdout(), asJSON, "replay", kv{"rooms", len(rooms) + unreadable}, kv{"rooms_failed", problems.count() + unreadable}, kv{"events", tot.Events}, kv{"computed", tot.Computed}, kv{"rejected", tot.Rejected},
				kv{"outliers", tot.Outliers}, kv{"cyclic", len(tot.Cyclic)}, kv{"state_not_kept", tot.NotKept}, kv{"rederived", tot.Rederived}, kv{"resolutions", tot.Resolutions},
				kv{"conflicted_keys", tot.ConflictedKeys}, kv{"auth_difference", tot.AuthDifference}, kv{"pdus_parsed", tot.EventsLoaded},
				kv{"auth_checks_ahead", tot.AuthAhead}, kv{"resolution_p50_us", p50.Microseconds()}, kv{"resolution_p99_us", p99.Microseconds()})
			if stopped {
				fmt.Fprintf(cmd.ErrOrStderr(), "mtxdb: replay: interrupted (%v): the state records of the %d events computed are stored and synced; %s\n", err, tot.Computed, replayResumeHint(store, room, force))
				return interruptExit()
			}
			if len(problems)+unreadable > 0 {
				return exitError(2)
			}
			return nil
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp)
	c.Flags().StringVar(&room, "room", "", "replay only this room ID")
	c.Flags().BoolVar(&force, "force", false, "recompute every event, not only those without a state record")
	jsonFlag(c, &asJSON)
	return c
}

// percentile returns the q-quantile (nearest rank) of ds, 0 for none; ds is sorted.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

// replayRooms replays each room; times, if set, receives the wall time of every
// resolution that was computed (not those answered from the resolver's memo). A
// room whose replay fails on its data (a corrupt record, an event resolution or
// the rules cannot handle) is a skipped problem and the others are replayed; a
// room with events on a prev/auth cycle is a problem too (those events are left
// out). Only a store lost during the run (lostStore) or ErrStopped ends it early.
func replayRooms(ctx context.Context, rooms []*roomstate.Room, force bool, out io.Writer, times *[]time.Duration) (resolver.ReplayResult, roomProblems, error) {
	var tot resolver.ReplayResult
	var problems roomProblems
	total := 0
	for _, r := range rooms {
		total += int(r.Head().Events)
	}
	bar := newProgress(out, int64(total), "replay", false)
	defer bar.finish()
	done := 0 // events walked, for testStall
	for _, r := range rooms {
		walked := 0
		timed := 0 // resolution times kept before this room
		if times != nil {
			timed = len(*times)
		}
		res, err := resolver.Replay(ctx, r, resolver.ReplayOptions{Force: force, Progress: func(done, _ int) { walked++; bar.add(1) }, ResolutionTimes: times, Stop: func() bool {
			if done++; done == 1001 { // asked before event 1001: 1000 walked
				testStall("replay-1000")
			}
			return interrupted()
		}})
		if err != nil && !errors.Is(err, resolver.ErrStopped) {
			if lostStore(err) {
				return tot, problems, fmt.Errorf("replay room %s: %w", r.ID(), err)
			}
			what := fmt.Sprintf("not replayed: %v", err)
			var se *roomstate.StateRecordError
			if errors.As(err, &se) && isDataProblem(err) && !force {
				// A forced replay reads no state record: it computes every
				// event again and writes every state record.
				what += "; mtxdb replay --force --room " + shellArg(r.ID()) + " (with this --store) writes every state record of the room again, this one included"
			}
			problems = append(problems, roomProblem{room: r.ID(), what: what, skipped: true})
			bar.add(max(0, int(r.Head().Events)-walked))
			if times != nil {
				// The summary's counts leave the failed room out; so do its percentiles.
				*times = (*times)[:timed]
			}
			continue
		}
		tot.Events += res.Events
		tot.Computed += res.Computed
		tot.Outliers += res.Outliers
		tot.Cyclic = append(tot.Cyclic, res.Cyclic...)
		tot.NotKept += res.NotKept
		tot.Rederived += res.Rederived
		tot.AuthDifference += res.AuthDifference
		tot.EventsLoaded += res.EventsLoaded
		tot.Rejected += res.Rejected
		tot.AuthAhead += res.AuthAhead
		tot.Resolutions += res.Resolutions
		tot.ConflictedKeys += res.ConflictedKeys
		if len(res.Cyclic) > 0 {
			problems = append(problems, cyclicProblem(r.ID(), res.Cyclic))
		}
		if err != nil { // stopped: what it computed is synced
			bar.finish()
			return tot, problems, err
		}
	}
	bar.finish()
	return tot, problems, nil
}

// replayResumeHint says how to continue an interrupted replay, with a
// postgres:// store's password masked.
func replayResumeHint(store, room string, force bool) string {
	again := "mtxdb replay --store " + shellArg(pgstore.Redacted(store))
	if room != "" {
		again += " --room " + shellArg(room)
	}
	if force {
		// A forced replay rewrites every record; a plain one would compute
		// only the events left without one (the forced one cleared the
		// every-k rule when it started) and not rewrite the others.
		return "run " + again + " --force again to recompute every event (it starts over)"
	}
	return "run " + again + " to continue: it computes only the events without a state record"
}

// replayCacheBytes is replay's packstore node cache: none. A replay reads each
// PDU once and a HAMT node again only after its resolver's Reader let it go;
// with the default 64 MiB cache the 1M-event replay held 75 MB more live heap
// and took no less CPU (docs/bench/issue31-progress.md).
const replayCacheBytes = 0

// replayPreadKinds: a replay reads its HAMT nodes with pread, not through
// the shard mappings. It reads a node from the store when its resolver's
// Reader let it go, at random offsets in what the replay wrote, where each
// read through a mapping faulted its page in: 0.4 reads an event at 1M, about
// 11 us each in a CPU profile, 4.5 us of it the fault.
var replayPreadKinds = []packstore.ReadKind{roomrecord.ReadNode}

// replayGCPercent is replay's GOGC under a soft heap limit: it collects half as
// often as the default, for a heap up to three times its live size, which the
// limit caps (docs/bench/issue31-progress.md has the measurements).
const replayGCPercent = 200

// importGCPercent is import's GOGC under a soft heap limit, as replay's: its
// live heap is small (the batch, the rooms' known event IDs), and what it
// allocates per PDU is garbage by the next batch.
const importGCPercent = 200

// replayGC sets replayGCPercent (limitedGC).
func replayGC() { limitedGC(replayGCPercent) }

// importGC sets importGCPercent (limitedGC).
func importGC() { limitedGC(importGCPercent) }

// limitedGC sets GOGC to percent when a soft heap limit bounds the heap and
// the user did not set GOGC.
func limitedGC(percent int) {
	if os.Getenv("GOGC") == "" && debug.SetMemoryLimit(-1) < math.MaxInt64 {
		debug.SetGCPercent(percent)
	}
}
