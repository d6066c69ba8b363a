package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/pgstore"
	"github.com/mtxdb/mtxdb/repackplan"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/testrooms"
)

// storeHelp describes --store.
const storeHelp = "store directory, or a postgres:// URL (a PostgreSQL database shared by several processes)"

// storeEngine is what the commands use of a store, whichever engine holds it:
// a packfile directory (packstore) or a PostgreSQL database (pgstore: --store
// postgres://...).
type storeEngine interface {
	packstore.StorageEngine
	Repack(packstore.RepackPlan) (packstore.RepackStats, error)
}

// openStore opens a store directory or database; only import and demo may
// create one.
func openStore(dir string, create bool) (storeEngine, *roomstate.Store, error) {
	return openStoreMode(dir, create, false)
}

// openStoreMode is openStore, read-only (packstore.Options.ReadOnly: no
// truncation, no writes, a shared lock; pgstore.Options.ReadOnly: no schema
// created, read-only sessions) for the commands that only read: verify,
// stats, state. Every command opens its store here.
func openStoreMode(dir string, create, readOnly bool) (storeEngine, *roomstate.Store, error) {
	if dir == "" {
		return nil, nil, fmt.Errorf("--store is required")
	}
	if pgstore.IsURL(dir) {
		eng, err := pgstore.Open(pgstore.Options{URL: dir, NoCreate: !create, ReadOnly: readOnly})
		if errors.Is(err, pgstore.ErrNoSchema) {
			return nil, nil, fmt.Errorf("%w: no mtxdb store in that database (mtxdb import creates it)", err)
		}
		if err != nil {
			return nil, nil, err
		}
		return eng, roomstate.New(eng), nil
	}
	if !create {
		if fi, err := os.Stat(dir); err != nil {
			return nil, nil, fmt.Errorf("store %s does not exist (mtxdb import creates it)", dir)
		} else if !fi.IsDir() {
			return nil, nil, fmt.Errorf("store %s is a file, not a store directory", dir)
		}
		if !looksLikeStore(dir) {
			return nil, nil, fmt.Errorf("%s is not an mtxdb store (no shard or index files in it); mtxdb import creates one", dir)
		}
	}
	opts := packstore.DefaultOptions(dir)
	opts.ReadAhead = readAhead.mode
	opts.ReadOnly = readOnly
	eng, err := packstore.Open(opts)
	if err != nil {
		if packstore.IsCorruption(err) {
			return nil, nil, corruptError{err}
		}
		if errors.Is(err, packstore.ErrLocked) {
			// Exit status 1; the message names the directory and the pid.
			return nil, nil, fmt.Errorf("%w; wait for that mtxdb command to finish (one process per store)", err)
		}
		return nil, nil, err
	}
	r := eng.OpenReport()
	if r.CheckpointErr != nil || r.DeltaErr != nil {
		fmt.Fprintf(os.Stderr, "mtxdb: warning: %s: index files not used (%v; %v), index rebuilt from %s\n",
			dir, r.CheckpointErr, r.DeltaErr, r.Source)
	}
	for _, w := range r.Warnings {
		fmt.Fprintf(os.Stderr, "mtxdb: warning: %s\n", w)
	}
	for _, q := range r.Quarantined {
		fmt.Fprintf(os.Stderr, "mtxdb: warning: %s: quarantined a shard file with a bad header and no acknowledged data: %s\n", dir, q)
	}
	if r.TailNotCut {
		fmt.Fprintf(os.Stderr, "mtxdb: warning: %s: %s has a torn or cut-short tail of %d bytes at offset %d, left on disk (read-only open; index from %s)\n",
			dir, r.TruncatedFile, r.TruncatedBytes, r.TruncatedAt, r.Source)
	} else if r.TruncatedBytes > 0 {
		// Expected after a crash mid-write; with index files missing or damaged
		// it can also be a shard cut short (README, Known limits): say so.
		fmt.Fprintf(os.Stderr, "mtxdb: warning: %s: cut %d bytes of unsynced or damaged tail off %s at offset %d (index from %s)\n",
			dir, r.TruncatedBytes, r.TruncatedFile, r.TruncatedAt, r.Source)
	}
	return eng, roomstate.New(eng), nil
}

// storeStats is the engine's Stats; for a PostgreSQL store DiskBytes is the
// records table's size with its indexes (pgstore.Stats.TableBytes) and Shards 0.
func storeStats(eng storeEngine) (packstore.Stats, error) {
	switch e := eng.(type) {
	case *packstore.PackfileStorage:
		return e.Stats(), nil
	case *pgstore.Store:
		st, err := e.Stats()
		return packstore.Stats{DiskBytes: st.TableBytes, Collections: st.Collections, LiveRecords: int(st.LiveRecords), LiveBytes: st.LiveBytes}, err
	}
	return packstore.Stats{}, fmt.Errorf("no stats for a %T store", eng)
}

// looksLikeStore reports whether dir holds a packstore's files: shard files or
// index files. Commands other than import and demo refuse anything else, rather
// than turning a mistyped directory into a store.
func looksLikeStore(dir string) bool {
	for _, pat := range []string{"shard-*.mtdb", "index.ckpt", "index.delta"} {
		if m, _ := filepath.Glob(filepath.Join(dir, pat)); len(m) > 0 {
			return true
		}
	}
	return false
}

// readAhead is the --read-ahead flag: packstore.Options.ReadAhead of every
// store the command opens.
var readAhead readAheadFlag

// readAheadFlag parses a packstore.ReadAheadMode by its String name.
type readAheadFlag struct{ mode packstore.ReadAheadMode }

func (f *readAheadFlag) String() string { return f.mode.String() }
func (f *readAheadFlag) Type() string   { return "random|kernel" }

func (f *readAheadFlag) Set(s string) error {
	for _, m := range []packstore.ReadAheadMode{packstore.ReadAheadRandom, packstore.ReadAheadKernel} {
		if m.String() == s {
			f.mode = m
			return nil
		}
	}
	return fmt.Errorf("unknown read-ahead mode %q (random or kernel)", s)
}

// corruptError marks a store that failed a check: the command exits with status 2.
type corruptError struct{ error }

func (c corruptError) Unwrap() error { return c.error }

// eventsFile resolves an import argument: a file, or a room directory holding
// events.jsonl.
func eventsFile(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if fi.IsDir() {
		p := filepath.Join(path, "events.jsonl")
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s is a directory without events.jsonl", path)
		}
		return p, nil
	}
	return path, nil
}

func importCmd() *cobra.Command {
	var store, roomVersion string
	var rf repackFlags
	var batch int
	var anyOrder, repack bool
	c := &cobra.Command{
		Use:   "import --store DIR [--any-order [--room-version V]] [--repack [--plan KIND] [--liveness all|every-k [--every K]]] PATH...",
		Short: "Import PDUs (JSON lines or a JSON array; or room directories with events.jsonl)",
		Long: `Import reads PDUs and stores each new one with its prev/auth edges. Every PDU's
prev_events and auth_events must be in the store or earlier in the input; a room's
first PDU must be its m.room.create. Events already stored are skipped, so a failed
import can be re-run. On bad input it stops with the file, line and event; what came
before that line is kept and synced. With --any-order, PDUs may come before their
prev/auth events (a backfill, newest first): replay then sorts them and leaves out as
outliers events whose ancestors never arrive; --room-version names the version of a
room whose m.room.create comes later. --repack replays and repacks the rooms just
imported, with --plan, --liveness and --every as in mtxdb repack.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if batch <= 0 {
				return fmt.Errorf("--batch must be positive, not %d", batch)
			}
			if roomVersion != "" && !anyOrder {
				return fmt.Errorf("--room-version only applies with --any-order")
			}
			if err := needFlag(cmd, "repack", repack, "plan", "liveness", "every"); err != nil {
				return err
			}
			opts, err := rf.options(cmd)
			if err != nil {
				return err
			}
			var paths []string
			for _, a := range args {
				path, err := eventsFile(a)
				if err != nil {
					return err
				}
				paths = append(paths, path)
			}
			eng, st, err := openStore(store, true)
			if err != nil {
				return err
			}
			defer eng.Close()
			out := cmd.OutOrStdout()
			touched := map[string]bool{}
			for _, path := range paths {
				res, err := importFile(st, path, roomstate.ImportOptions{BatchSize: batch, AnyOrder: anyOrder, RoomVersion: roomVersion}, out)
				fmt.Fprintf(out, "import %s: read=%d imported=%d skipped=%d variants=%d rooms=%d\n",
					path, res.Read, res.Imported, res.Skipped, res.Variants, len(res.Rooms))
				if err != nil {
					return err
				}
				for _, id := range res.Rooms {
					touched[id] = true
				}
			}
			if !repack {
				return nil
			}
			// An exported room goes in whole: replay it, then lay it out in walk order.
			var rooms []*roomstate.Room
			for _, id := range sortedSet(touched) {
				r, err := st.Room(id)
				if err != nil {
					return err
				}
				rooms = append(rooms, r)
			}
			tot, err := replayRooms(rooms, false, out, nil)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "replay: rooms=%d events=%d computed=%d rejected=%d outliers=%d\n",
				len(rooms), tot.Events, tot.Computed, tot.Rejected, tot.Outliers)
			_, err = repackSummary(out, eng, rooms, opts)
			return err
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp+" (created if missing)")
	c.Flags().IntVar(&batch, "batch", 1000, "events written and synced per batch")
	c.Flags().BoolVar(&anyOrder, "any-order", false, "accept PDUs before their prev/auth events (backfill order)")
	c.Flags().BoolVar(&repack, "repack", false, "after importing, replay the rooms imported and repack them (an exported room)")
	rf.register(c, "plan kind for --repack")
	c.Flags().StringVar(&roomVersion, "room-version", "", "room version of rooms whose m.room.create is not first (with --any-order)")
	return c
}

func importFile(st *roomstate.Store, path string, opts roomstate.ImportOptions, out io.Writer) (roomstate.ImportResult, error) {
	f, err := os.Open(path)
	if err != nil {
		return roomstate.ImportResult{}, err
	}
	defer f.Close()
	var bar *progress
	if fi, err := f.Stat(); err == nil {
		name := filepath.Base(path)
		if name == "events.jsonl" {
			name = filepath.Base(filepath.Dir(path))
		}
		bar = newProgress(out, fi.Size(), "import "+name, true)
	}
	defer bar.finish()
	return st.Import(countingReader{f, bar}, path, opts)
}

// countingReader advances a byte-based progress bar as the import reads.
type countingReader struct {
	r   io.Reader
	bar *progress
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.bar.add(n)
	return n, err
}

func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// openRooms opens an existing store and selects every room, or the one named.
func openRooms(store, roomID string, readOnly bool) (storeEngine, []*roomstate.Room, error) {
	eng, st, err := openStoreMode(store, false, readOnly)
	if err != nil {
		return nil, nil, err
	}
	rooms, err := selectRooms(st, roomID)
	if err != nil {
		eng.Close()
		return nil, nil, err
	}
	return eng, rooms, nil
}

// selectRooms returns every room, or the one named.
func selectRooms(st *roomstate.Store, roomID string) ([]*roomstate.Room, error) {
	if roomID != "" {
		r, err := st.Room(roomID)
		if err != nil {
			return nil, err
		}
		return []*roomstate.Room{r}, nil
	}
	return st.Rooms()
}

func replayCmd() *cobra.Command {
	var store, room string
	var force bool
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
(rederived). --force writes every state record again and clears the every-k rule.
It prints one summary line; use verify --expected to compare with recorded state.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			eng, rooms, err := openRooms(store, room, false)
			if err != nil {
				return err
			}
			defer eng.Close()
			var durs []time.Duration
			tot, err := replayRooms(rooms, force, cmd.OutOrStdout(), &durs)
			if err != nil {
				return err
			}
			p50, p99 := percentile(durs, 0.50), percentile(durs, 0.99)
			fmt.Fprintf(cmd.OutOrStdout(), "replay: rooms=%d events=%d computed=%d rejected=%d outliers=%d state_not_kept=%d rederived=%d resolutions=%d conflicted_keys=%d auth_difference=%d resolution_p50_us=%d resolution_p99_us=%d\n",
				len(rooms), tot.Events, tot.Computed, tot.Rejected, tot.Outliers, tot.NotKept, tot.Rederived, tot.Resolutions, tot.ConflictedKeys, tot.AuthDifference,
				p50.Microseconds(), p99.Microseconds())
			return nil
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp)
	c.Flags().StringVar(&room, "room", "", "replay only this room ID")
	c.Flags().BoolVar(&force, "force", false, "recompute every event, not only those without a state record")
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
// resolution that was computed (not those answered from the resolver's memo).
func replayRooms(rooms []*roomstate.Room, force bool, out io.Writer, times *[]time.Duration) (resolver.ReplayResult, error) {
	var tot resolver.ReplayResult
	total := 0
	for _, r := range rooms {
		total += int(r.Head().Events)
	}
	bar := newProgress(out, int64(total), "replay", false)
	defer bar.finish()
	for _, r := range rooms {
		res, err := resolver.Replay(r, resolver.ReplayOptions{Force: force, Progress: func(done, _ int) { bar.add(1) }, ResolutionTimes: times})
		if err != nil {
			return tot, fmt.Errorf("replay room %s: %w", r.ID(), err)
		}
		tot.Events += res.Events
		tot.Computed += res.Computed
		tot.Outliers += res.Outliers
		tot.NotKept += res.NotKept
		tot.Rederived += res.Rederived
		tot.AuthDifference += res.AuthDifference
		tot.Rejected += res.Rejected
		tot.Resolutions += res.Resolutions
		tot.ConflictedKeys += res.ConflictedKeys
	}
	return tot, nil
}

func verifyCmd() *cobra.Command {
	var store, room string
	var expected []string
	c := &cobra.Command{
		Use:   "verify --store DIR [--room ROOM_ID] [--expected DIR]...",
		Short: "Check every record and snapshot; compare with recorded state",
		Long: `Verify reads every record of each room: PDUs, metadata, state records, every
distinct snapshot (node hashes, canonical CHAMP shape, entries naming state events of
their key). With --expected (a room directory with expected_state.jsonl, or a directory
of such rooms) it also compares the state after every event and the current state with
what the origin server recorded, printing each mismatch with room, event, key, ours,
recorded. Events whose state an every-k repack dropped (mtxdb repack --liveness
every-k) are counted as state_not_kept and not compared. A recorded room directory needs meta.json naming its room_id. Exit status 2
when anything is wrong: a mismatch, a room that fails its check, a recorded room the
store lacks, or a store that fails to open as corrupt; 1 for usage and I/O errors.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			eng, rooms, err := openRooms(store, room, true)
			if err != nil {
				return err
			}
			defer eng.Close()
			exps, err := loadExpectedDirs(expected)
			if err != nil {
				return err
			}
			if room != "" { // compare only the selected room
				exps = map[string][]*testrooms.Expected{room: exps[room]}
				if len(exps[room]) == 0 {
					delete(exps, room)
				}
			}
			v, err := verifyRooms(rooms, exps, cmd.OutOrStdout())
			if err != nil {
				return err
			}
			if pf, ok := eng.(*packstore.PackfileStorage); ok && pf.OpenReport().TruncatedBytes > 0 {
				r := pf.OpenReport()
				// A bad tail (opened read-only, it stays on disk): after a crash
				// that is unsynced data, but verify cannot tell it from lost data
				// (README, Known limits).
				v.problems++
				fmt.Fprintf(cmd.OutOrStdout(), "problem store: %s has a torn or cut-short tail of %d bytes at offset %d, left on disk (index from %s)\n",
					r.TruncatedFile, r.TruncatedBytes, r.TruncatedAt, r.Source)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "verify: rooms=%d events=%d snapshots=%d state_not_kept=%d compared_events=%d compared_room_dirs=%d mismatches=%d problems=%d\n",
				len(rooms), v.events, v.snapshots, v.notKept, v.compared, v.comparedRooms, v.mismatches, v.problems)
			if v.mismatches > 0 || v.problems > 0 {
				return exitError(2)
			}
			return nil
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp)
	c.Flags().StringVar(&room, "room", "", "verify only this room ID")
	c.Flags().StringArrayVar(&expected, "expected", nil, "room directory, or directory of rooms, with recorded state")
	return c
}

// loadExpectedDirs reads recorded state from room directories or directories of
// rooms, keyed by room ID. Several directories may hold versions of one room (the
// real rooms' room004 and room004_union): all of them are kept, in directory order.
func loadExpectedDirs(paths []string) (map[string][]*testrooms.Expected, error) {
	out := map[string][]*testrooms.Expected{}
	for _, p := range paths {
		dirs := []string{p}
		if _, err := os.Stat(filepath.Join(p, "expected_state.jsonl")); err != nil {
			if dirs, err = testrooms.RealRoomDirs(p); err != nil {
				return nil, err
			}
		}
		if len(dirs) == 0 {
			return nil, fmt.Errorf("%s holds no room directory (events.jsonl, expected_state.jsonl, meta.json)", p)
		}
		for _, d := range dirs {
			exp, err := testrooms.LoadExpected(d)
			if err != nil {
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
func sortedExpected(exps map[string][]*testrooms.Expected) []*testrooms.Expected {
	var out []*testrooms.Expected
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
}

// verifyRooms checks every room and compares those with recorded state. A room that
// fails its check or comparison is printed as a problem and counted; the other rooms
// are still verified. A recorded room the store does not hold is a problem too.
func verifyRooms(rooms []*roomstate.Room, exps map[string][]*testrooms.Expected, out io.Writer) (verifyTotals, error) {
	var v verifyTotals
	inStore := map[string]bool{}
	for _, r := range rooms {
		inStore[r.ID()] = true
		cr, err := r.Check()
		if err != nil {
			v.problems++
			fmt.Fprintf(out, "problem room=%s: %v\n", r.ID(), err)
			continue
		}
		v.events += cr.Events
		v.snapshots += cr.Snapshots
		v.notKept += cr.NotKept
		for _, exp := range exps[r.ID()] {
			res, err := testrooms.Compare(r, exp, func(m testrooms.Mismatch) { fmt.Fprintln(out, m) })
			if err != nil {
				v.problems++
				fmt.Fprintf(out, "problem room=%s against %s: %v\n", r.ID(), exp.Dir, err)
				continue
			}
			v.compared += res.Events
			v.comparedRooms++
			v.mismatches += res.Mismatches
		}
	}
	for id, es := range exps {
		if !inStore[id] {
			for _, exp := range es {
				v.problems++
				fmt.Fprintf(out, "problem room=%s: recorded in %s but not in the store\n", id, exp.Dir)
			}
		}
	}
	return v, nil
}

func repackCmd() *cobra.Command {
	var store, room string
	var rf repackFlags
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
record again. K may only grow to a multiple of the K of an earlier every-k repack.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, err := rf.options(cmd)
			if err != nil {
				return err
			}
			eng, rooms, err := openRooms(store, room, false)
			if err != nil {
				return err
			}
			defer eng.Close()
			_, err = repackSummary(cmd.OutOrStdout(), eng, rooms, opts)
			return err
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp)
	c.Flags().StringVar(&room, "room", "", "repack only this room ID")
	rf.register(c, "plan kind ("+fmt.Sprint(repackplan.Kinds)+")")
	return c
}

// needFlag fails when a flag that only applies with --on is given without it.
func needFlag(c *cobra.Command, on string, set bool, dependents ...string) error {
	if set {
		return nil
	}
	for _, d := range dependents {
		if c.Flags().Changed(d) {
			return fmt.Errorf("--%s only applies with --%s", d, on)
		}
	}
	return nil
}

// repackFlags are the plan and liveness flags of repack and import --repack.
type repackFlags struct {
	plan, liveness string
	every          uint32
}

func (f *repackFlags) register(c *cobra.Command, planHelp string) {
	c.Flags().StringVar(&f.plan, "plan", string(repackplan.ReverseTopological), planHelp)
	c.Flags().StringVar(&f.liveness, "liveness", "all", "what stays live: all (every event's state snapshots) or every-k (snapshots of forward extremities, state events, rejected events and every --every-th event by arrival)")
	c.Flags().Uint32Var(&f.every, "every", 16, "K of --liveness every-k")
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
		return o, fmt.Errorf("--plan must be one of %v, not %q", repackplan.Kinds, f.plan)
	}
	return o, nil
}

// planRooms plans every room (under every-k this writes each room's head: the keep
// rule) and returns the repack plan and the plans' stats summed.
func planRooms(rooms []*roomstate.Room, opts repackplan.Options, out io.Writer) (packstore.RepackPlan, repackplan.Stats, error) {
	var plan packstore.RepackPlan
	var tot repackplan.Stats
	bar := newProgress(out, int64(len(rooms)), "planning", false)
	defer bar.finish()
	for _, r := range rooms {
		cp, ps, err := repackplan.Plan(r, opts)
		if err != nil {
			return plan, tot, err
		}
		tot.Events += ps.Events
		tot.Nodes += ps.Nodes
		tot.Records += ps.Records
		tot.Walked += ps.Walked
		tot.StatesDropped += ps.StatesDropped
		plan.Collections = append(plan.Collections, cp)
		bar.add(1)
	}
	return plan, tot, nil
}

// repackRooms plans every room and repacks them through one output stream.
func repackRooms(eng storeEngine, rooms []*roomstate.Room, opts repackplan.Options, out io.Writer) (packstore.RepackStats, error) {
	plan, _, err := planRooms(rooms, opts, out)
	if err != nil {
		return packstore.RepackStats{}, err
	}
	return eng.Repack(plan)
}

// repackSummary repacks the rooms (one plan per room, one output stream) and
// prints what it did: disk and live bytes before (after planning, which under
// every-k rewrites the room heads) and after, records copied, garbage dropped
// (records no plan kept, of which state records the liveness policy dropped; dead
// frames of superseded or deleted records go with the retired shards), shards
// retired and the bytes returned.
func repackSummary(out io.Writer, eng storeEngine, rooms []*roomstate.Room, opts repackplan.Options) (packstore.RepackStats, error) {
	plan, ps, err := planRooms(rooms, opts, out)
	if err != nil {
		return packstore.RepackStats{}, err
	}
	before, err := storeStats(eng)
	if err != nil {
		return packstore.RepackStats{}, err
	}
	rs, err := eng.Repack(plan)
	if err != nil {
		return rs, err
	}
	after, err := storeStats(eng)
	if err != nil {
		return rs, err
	}
	liveness := string(opts.Liveness)
	if liveness == "" {
		liveness = string(repackplan.AllSnapshots)
	}
	if opts.Liveness == repackplan.EveryK {
		liveness = fmt.Sprintf("every-%d", opts.Every)
	}
	fmt.Fprintf(out, "repack: plan=%s rooms=%d liveness=%s records_copied=%d bytes_copied=%d garbage_records_dropped=%d state_records_dropped=%d garbage_live_bytes_dropped=%d shards_retired=%d bytes_retired=%d\n",
		opts.Kind, rs.CollectionsRepacked, liveness, rs.RecordsCopied, rs.BytesCopied, rs.RecordsDropped, ps.StatesDropped, max(0, before.LiveBytes-after.LiveBytes), rs.ShardsRetired, rs.BytesRetired)
	fmt.Fprintf(out, "repack: disk_bytes_before=%d disk_bytes_after=%d returned=%d shards_before=%d shards_after=%d live_bytes_before=%d live_bytes_after=%d\n",
		before.DiskBytes, after.DiskBytes, before.DiskBytes-after.DiskBytes, before.Shards, after.Shards, before.LiveBytes, after.LiveBytes)
	return rs, nil
}

func statsCmd() *cobra.Command {
	var store, room, walks string
	var reads, cold bool
	var limit int
	c := &cobra.Command{
		Use:   "stats --store DIR [--reads [--room ROOM_ID] [--walks W,...] [--cold]]",
		Short: "Print shard, byte and room counts; with --reads, the read budget of the server walks",
		Long: `Stats prints shard, byte and room counts. With --reads it runs the walks a server does
(current-state, auth-chain, backfill of --limit events, resolve-extremities) over the
room named by --room, or every replayed room, and prints for each walk the read budget
by kind (node, pdu, meta, other): physical reads, frame bytes, distinct 4 KiB pages,
seeks (a read not in the pages of the previous read or the next one) and node-cache
hits. Each walk runs on a freshly opened store (empty node cache); --cold also evicts
the shard files from the page cache first (posix_fadvise DONTNEED). The counters are
this process's: another process's reads cannot be seen.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := needFlag(cmd, "reads", reads, "room", "walks", "limit", "cold"); err != nil {
				return err
			}
			if limit <= 0 {
				return fmt.Errorf("--limit must be positive, not %d", limit)
			}
			if reads {
				return statsReads(cmd.OutOrStdout(), store, room, walks, limit, cold)
			}
			eng, st, err := openStoreMode(store, false, true)
			if err != nil {
				return err
			}
			defer eng.Close()
			s, err := storeStats(eng)
			if err != nil {
				return err
			}
			rooms, err := st.Rooms()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "shards=%d disk_bytes=%d collections=%d live_records=%d live_bytes=%d rooms=%d\n",
				s.Shards, s.DiskBytes, s.Collections, s.LiveRecords, s.LiveBytes, len(rooms))
			sort.Slice(rooms, func(i, j int) bool { return rooms[i].Head().Events > rooms[j].Head().Events })
			for i, r := range rooms {
				if i == 10 {
					fmt.Fprintf(out, "... %d more rooms\n", len(rooms)-10)
					break
				}
				h := r.Head()
				fmt.Fprintf(out, "room %s version=%s events=%d replayed=%t forward_extremities=%d\n",
					h.RoomID, h.RoomVersion, h.Events, h.Replayed, len(h.ForwardExtremities))
			}
			return nil
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp)
	c.Flags().BoolVar(&reads, "reads", false, "run the server walks and print their read budget by kind")
	c.Flags().StringVar(&room, "room", "", "with --reads: only this room ID")
	c.Flags().StringVar(&walks, "walks", "all", "with --reads: comma-separated walks ("+fmt.Sprint(repackplan.WalkKinds)+")")
	c.Flags().IntVar(&limit, "limit", 1000, "with --reads: events of the backfill walk")
	c.Flags().BoolVar(&cold, "cold", false, "with --reads: evict the shard files from the page cache before each walk")
	return c
}

// statsReads runs the walks over the selected replayed rooms and prints their read
// budgets.
func statsReads(out io.Writer, store, roomID, walkList string, limit int, cold bool) error {
	ws, err := parseWalks(walkList)
	if err != nil {
		return err
	}
	if pgstore.IsURL(store) {
		return fmt.Errorf("stats --reads counts packfile reads (pages, seeks); a PostgreSQL store has none to count")
	}
	eng, st, err := openStoreMode(store, false, true)
	if err != nil {
		return err
	}
	rooms, err := selectRooms(st, roomID)
	var ids []string
	for _, r := range rooms {
		if r.Head().Replayed {
			ids = append(ids, r.ID())
		}
	}
	if cerr := eng.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return fmt.Errorf("no replayed room to walk (mtxdb replay first)")
	}
	var total packstore.ReadCounters
	for _, id := range ids {
		fmt.Fprintf(out, "room %s\n", id)
		for _, w := range ws {
			wb, err := measureWalk(store, id, w, limit, cold)
			if err != nil {
				return err
			}
			printBudget(out, "  ", wb)
			total = total.Add(wb.Total)
		}
	}
	fmt.Fprintf(out, "reads: rooms=%d walks=%d reads=%d bytes=%d pages=%d seeks=%d cache_hits=%d\n",
		len(ids), len(ws), total.Reads, total.Bytes, total.Pages, total.Seeks, total.CacheHits)
	return nil
}
