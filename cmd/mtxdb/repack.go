package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/pgstore"
	"github.com/mtxdb/mtxdb/repackplan"
	"github.com/mtxdb/mtxdb/roomrecord"
	"github.com/mtxdb/mtxdb/roomstate"
)

// repackCmd is mtxdb repack: rooms rewritten in the order their walks read them,
// garbage dropped, shards retired.
func repackCmd() *cobra.Command {
	var store, room string
	var rf repackFlags
	var asJSON bool
	c := &cobra.Command{
		Use:   "repack --store DIR [--room ROOM_ID] [--plan KIND] [--liveness all|every-k [--every K]]",
		Short: "Rewrite rooms in the order their walks read them and drop garbage (offline)",
		Long: `Repack builds a plan per room (default reverse-topological: over prev_events from
the forward extremities, each event followed by its new snapshot nodes; auth-chain:
what state resolution's auth walks read first; edges-first: every event's edge
metadata as one dense region, then the rest; mixed: walk regions), copies the
live records of all selected rooms into new shards through one output stream, swaps
the indexes and retires shards nothing references any more. Run it with no other
process using the store.

--liveness all (the default) keeps every event's state snapshots. --liveness every-k
keeps the state record and snapshots only of the forward extremities, state events,
rejected events and every K-th event by arrival index (arrival index % K == 0); the
other events keep their PDU and edges, and their state records and the snapshot nodes
only they reach are dropped as garbage. The room head records the rule: afterwards
'mtxdb state --event' on such an event fails with "state not kept", verify counts
them as state_not_kept, replay appends new events as before (it recomputes a dropped
state in memory when a new event needs it), and 'replay --force' writes every state
record again. K may only grow to a multiple of the K of an earlier every-k repack.
--every defaults to 16.

Ctrl-C (SIGINT) or SIGTERM stops at once and says what was kept: while planning,
nothing is repacked yet; during the copy the store stays consistent (rooms whose
copy was not finished keep their old layout, and the copies already written are
garbage the next repack reclaims). Exit status 130 (143).

A room that cannot be planned (not replayed, a record that does not decode or is not
found) is left as it is, with a "problem room=…" line, and the others are repacked;
so is a room whose plan lists a record the store's index does not find (a damaged
frame head), a room whose copy meets a damaged frame (the copies already written
are removed first), and a room collection whose head record cannot be read, named by its
collection ID in a "problem" line (the room ID is in the head). Exit status 2 when
there is any such room.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			opts, err := rf.options(cmd)
			if err != nil {
				return err
			}
			if err := nonEmptyFlag(cmd, "room", room); err != nil {
				return err
			}
			eng, rooms, badHeads, err := openRoomsAndErrors(ctx, store, room, false)
			if err != nil {
				return err
			}
			defer eng.Close()
			defer catchInterrupts("repack", repackInterrupted(store, rooms, opts))()
			// A collection whose head cannot be read is not in the plan: its
			// records stay as they are.
			unreadable := printHeadProblems(cmd.OutOrStdout(), asJSON, badHeads, "the room is not repacked (its records are left as they are)")
			before, _ := storeStats(eng)
			if len(rooms) == 0 && room == "" && unreadable == 0 && before.LiveRecords > 0 {
				// Records but no room (as verify says): nothing to plan, and
				// not a clean store either.
				printProblem(cmd.OutOrStdout(), asJSON, "", fmt.Sprintf("store: %d records but no mtxdb room: not a store of mtxdb's rooms, or its room heads are lost; nothing was repacked", before.LiveRecords))
				return exitError(2)
			}
			_, problems, err := repackSummaryTo(ctx, cmd.OutOrStdout(), asJSON, eng, rooms, opts)
			if err == nil && len(problems)+unreadable > 0 {
				after, _ := storeStats(eng)
				if grown := after.DiskBytes - before.DiskBytes; grown > 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "mtxdb: repack: the store grew by %s: a shard that holds a room left as it is cannot be retired and stays on disk beside the copies, until that room is repaired and repacked too (rooms left as they are: %d)\n",
						humanize.IBytes(uint64(grown)), len(problems.skipped())+unreadable)
				}
				return exitError(2)
			}
			return err
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp)
	c.Flags().StringVar(&room, "room", "", "repack only this room ID")
	rf.register(c, "plan kind: "+planKinds())
	jsonFlag(c, &asJSON)
	return c
}

// planKinds lists the repack plan kinds for help and error texts.
func planKinds() string {
	names := make([]string, len(repackplan.Kinds))
	for i, k := range repackplan.Kinds {
		names[i] = string(k)
	}
	return strings.Join(names, ", ")
}

// repackFlags are the plan and liveness flags of repack and import --repack.
type repackFlags struct {
	plan, liveness string
	every          uint32
}

func (f *repackFlags) register(c *cobra.Command, planHelp string) {
	c.Flags().StringVar(&f.plan, "plan", string(repackplan.ReverseTopological), planHelp)
	c.Flags().StringVar(&f.liveness, "liveness", "all", "what stays live: all (every event's state snapshots) or every-k (snapshots of forward extremities, state events, rejected events and every --every-th event by arrival)")
	c.Flags().Uint32Var(&f.every, "every", 16, "K of --liveness every-k (every K-th event by arrival keeps its state)")
}

// options checks the flags and returns the plan options.
func (f *repackFlags) options(c *cobra.Command) (repackplan.Options, error) {
	o := repackplan.Options{Kind: repackplan.Kind(f.plan)}
	if c.Flags().Changed("every") && f.liveness != string(repackplan.EveryK) {
		return o, fmt.Errorf("--every only applies with --liveness every-k")
	}
	switch f.liveness {
	case "all", string(repackplan.AllSnapshots):
		o.Liveness = repackplan.AllSnapshots
	case string(repackplan.EveryK):
		if f.every == 0 {
			return o, fmt.Errorf("--every must be at least 1")
		}
		o.Liveness, o.Every = repackplan.EveryK, f.every
	default:
		return o, fmt.Errorf("--liveness must be all or every-k, not %q", f.liveness)
	}
	if !slices.Contains(repackplan.Kinds, o.Kind) {
		return o, fmt.Errorf("--plan must be one of %s, not %q", planKinds(), f.plan)
	}
	return o, nil
}

// planRooms plans every room (under every-k this writes each room's head: the keep
// rule) and returns the repack plan and the plans' stats summed. A room that cannot
// be planned because of its data (not replayed, a record that does not decode or is
// not found) is a
// skipped problem and left as it is; any other error (options the room's keep rule
// refuses, a store lost during the run) ends planning.
func planRooms(ctx context.Context, rooms []*roomstate.Room, opts repackplan.Options, out io.Writer) (packstore.RepackPlan, repackplan.Stats, roomProblems, error) {
	var plan packstore.RepackPlan
	var tot repackplan.Stats
	var problems roomProblems
	bar := newProgress(out, int64(len(rooms)), "planning", false)
	defer bar.finish()
	for _, r := range rooms {
		cp, ps, err := repackplan.Plan(ctx, r, opts)
		if errors.Is(err, repackplan.ErrNotReplayed) || isRoomDamage(err) {
			what := fmt.Sprintf("not repacked: %v", err)
			if errors.Is(err, repackplan.ErrNotReplayed) {
				// Plans walk the state records: say what to run first.
				what += "; run mtxdb replay on the store first (a plan follows the state records)"
			}
			problems = append(problems, roomProblem{room: r.ID(), what: what, skipped: true})
			bar.add(1)
			continue
		}
		if err != nil {
			return plan, tot, problems, err
		}
		tot.Events += ps.Events
		tot.Nodes += ps.Nodes
		tot.Records += ps.Records
		tot.Walked += ps.Walked
		tot.StatesDropped += ps.StatesDropped
		plan.Collections = append(plan.Collections, cp)
		bar.add(1)
	}
	return plan, tot, problems, nil
}

// repackRooms plans every room and repacks those planned through one output
// stream; the rooms it could not plan are returned as problems.
func repackRooms(ctx context.Context, eng storeEngine, rooms []*roomstate.Room, opts repackplan.Options, out io.Writer) (packstore.RepackStats, roomProblems, error) {
	plan, _, problems, err := planRooms(ctx, rooms, opts, out)
	if err != nil || len(plan.Collections) == 0 {
		return packstore.RepackStats{}, problems, err
	}
	rs, missing, err := repackLeavingMissing(plan, rooms, eng.Repack)
	return rs, append(problems, missing...), err
}

// repackLeavingMissing runs repack on plan. When the engine refuses the plan
// because a room's collection lacks a record the plan lists (a damaged frame
// or index: the engine refuses before it changes anything), or meets a
// corrupt frame while copying a room's records (the engine then removes its
// copies and changes nothing), it leaves that room out, as a skipped problem
// naming the record or the damage, and repacks the others.
func repackLeavingMissing(plan packstore.RepackPlan, rooms []*roomstate.Room, repack func(packstore.RepackPlan) (packstore.RepackStats, error)) (packstore.RepackStats, roomProblems, error) {
	var problems roomProblems
	for len(plan.Collections) > 0 {
		rs, err := repack(plan)
		var miss *packstore.RepackMissingError
		var bad *packstore.RepackCorruptError
		var coll packstore.ID
		switch {
		case errors.As(err, &miss):
			coll = miss.Collection
		case errors.As(err, &bad):
			coll = bad.Collection
		default:
			return rs, problems, err
		}
		i := slices.IndexFunc(plan.Collections, func(cp packstore.CollectionPlan) bool { return cp.Collection == coll })
		j := slices.IndexFunc(rooms, func(r *roomstate.Room) bool { return roomrecord.CollectionID(r.ID()) == coll })
		if i < 0 || j < 0 {
			return rs, problems, err
		}
		var what string
		if miss != nil {
			what = missingRecordProblem(rooms[j], miss)
		} else {
			what = fmt.Sprintf("not repacked: a record it copies is damaged (%v); its records are left as they are (mtxdb verify --room %s shows the damage)", bad.Err, rooms[j].ID())
		}
		problems = append(problems, roomProblem{room: rooms[j].ID(), what: what, skipped: true})
		plan.Collections = slices.Delete(slices.Clone(plan.Collections), i, i+1)
	}
	return packstore.RepackStats{}, problems, nil
}

// missingRecordProblem says which record of room a repack found missing: the
// PDU, metadata or state record of an event when the record is one, and
// what to run.
func missingRecordProblem(room *roomstate.Room, miss *packstore.RepackMissingError) string {
	what := "records the plan lists are not in the store"
	if miss.Record != (packstore.ID{}) {
		what = fmt.Sprintf("record %s (a state snapshot node or a room record) is not in the store", miss.Record)
		ids, _ := room.EventIDs()
		for _, id := range ids {
			ev := roomrecord.EventRecordID(id)
			kind := ""
			switch miss.Record {
			case ev:
				kind = "the PDU"
			case roomrecord.MetaRecordID(ev):
				kind = "the metadata record"
			case roomrecord.StateRecordID(ev):
				kind = "the state record"
			}
			if kind != "" {
				what = fmt.Sprintf("record %s (%s of event %s) is not in the store", miss.Record, kind, id)
				break
			}
		}
	}
	return fmt.Sprintf("not repacked: %s: a damaged frame or index; its records are left as they are (mtxdb verify --room %s shows the damage)", what, room.ID())
}

// repackSummary repacks the rooms (one plan per room, one output stream) and
// prints what it did: disk and live bytes before (after planning, which under
// every-k rewrites the room heads) and after, records copied, garbage dropped
// (records no plan kept, of which state records the liveness policy dropped; dead
// frames of superseded or deleted records go with the retired shards), shards
// retired, and the disk bytes returned (or grown: a room repacked out of shards
// other rooms keep adds its new shard and retires nothing).
func repackSummary(ctx context.Context, out io.Writer, eng storeEngine, rooms []*roomstate.Room, opts repackplan.Options) (packstore.RepackStats, roomProblems, error) {
	return repackSummaryTo(ctx, out, false, eng, rooms, opts)
}

// repackWithProgress runs eng.Repack with a bar over the rooms copied (when out is
// a terminal), polled from the engine.
func repackWithProgress(eng storeEngine, plan packstore.RepackPlan, out io.Writer) (packstore.RepackStats, error) {
	pf, isPack := eng.(*packstore.PackfileStorage)
	bar := newProgress(out, int64(len(plan.Collections)), "repack", false)
	if bar == nil || !isPack {
		return eng.Repack(plan)
	}
	done := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if i := pf.RepackProgress(); i >= 0 {
					bar.set(int64(i))
				}
			}
		}
	}()
	rs, err := eng.Repack(plan)
	close(done)
	<-polled
	bar.finish()
	return rs, err
}

// repackPhase is what a running repack is doing, for the interrupt message:
// "planning" or "copying" (the copy, the index swap and the retirement of shards).
var repackPhase atomic.Value

// repackInterrupted returns the message of an interrupted repack of store.
func repackInterrupted(store string, rooms []*roomstate.Room, opts repackplan.Options) func() string {
	again := repackCommand(store, rooms, opts)
	return func() string {
		switch repackPhase.Load() {
		case "copying":
			return "stopped during the copy: the store stays consistent (rooms whose copy was not finished keep their old layout; some may already be repacked; the copies written so far are garbage the next repack reclaims, and the next command may warn that it cut their unsynced tail); run " + again + " again"
		default:
			return "stopped while planning: nothing was repacked (an every-k plan may have recorded its keep rule in room heads, which the next repack applies); run " + again + " again"
		}
	}
}

// repackCommand is the mtxdb repack command line that repeats a repack of
// rooms with opts: plan and liveness as given, and --room when one room of
// several in the store was asked (import --repack of one room included).
func repackCommand(store string, rooms []*roomstate.Room, opts repackplan.Options) string {
	c := "mtxdb repack --store " + shellArg(pgstore.Redacted(store))
	if len(rooms) == 1 {
		c += " --room " + shellArg(rooms[0].ID())
	}
	if opts.Kind != "" {
		c += " --plan " + string(opts.Kind)
	}
	if opts.Liveness == repackplan.EveryK {
		c += fmt.Sprintf(" --liveness every-k --every %d", opts.Every)
	}
	return c
}

// repackSummaryTo is repackSummary, with JSON lines if asJSON.
// The rooms it could not plan are printed as problem lines first and returned; the
// others are repacked.
func repackSummaryTo(ctx context.Context, out io.Writer, asJSON bool, eng storeEngine, rooms []*roomstate.Room, opts repackplan.Options) (packstore.RepackStats, roomProblems, error) {
	repackPhase.Store("planning")
	plan, ps, problems, err := planRooms(ctx, rooms, opts, out)
	if err != nil {
		return packstore.RepackStats{}, problems, err
	}
	problems.print(out, asJSON)
	before, err := storeStats(eng)
	if err != nil {
		return packstore.RepackStats{}, problems, err
	}
	repackPhase.Store("copying")
	testStall("repack-copy")
	rs, missing, err := repackLeavingMissing(plan, rooms, func(plan packstore.RepackPlan) (packstore.RepackStats, error) {
		return repackWithProgress(eng, plan, out)
	})
	missing.print(out, asJSON)
	problems = append(problems, missing...)
	if err != nil {
		return rs, problems, err
	}
	after, err := storeStats(eng)
	if err != nil {
		return rs, problems, err
	}
	liveness := string(opts.Liveness)
	if liveness == "" {
		liveness = string(repackplan.AllSnapshots)
	}
	if opts.Liveness == repackplan.EveryK {
		liveness = fmt.Sprintf("every-%d", opts.Every)
	}
	printLine(out, asJSON, "repack", kv{"plan", opts.Kind}, kv{"rooms", rs.CollectionsRepacked}, kv{"liveness", liveness}, kv{"records_copied", rs.RecordsCopied},
		kv{"bytes_copied", rs.BytesCopied}, kv{"garbage_records_dropped", rs.RecordsDropped}, kv{"state_records_dropped", ps.StatesDropped},
		kv{"garbage_live_bytes_dropped", max(0, before.LiveBytes-after.LiveBytes)}, kv{"shards_retired", rs.ShardsRetired}, kv{"bytes_retired", rs.BytesRetired})
	printLine(out, asJSON, "repack", kv{"disk_bytes_before", before.DiskBytes}, kv{"disk_bytes_after", after.DiskBytes}, kv{"returned", max(0, before.DiskBytes-after.DiskBytes)}, kv{"grown", max(0, after.DiskBytes-before.DiskBytes)},
		kv{"shards_before", before.Shards}, kv{"shards_after", after.Shards}, kv{"live_bytes_before", before.LiveBytes}, kv{"live_bytes_after", after.LiveBytes})
	return rs, problems, nil
}
