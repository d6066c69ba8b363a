package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/repackplan"
	"github.com/mtxdb/mtxdb/roomstate"
)

// repackBench is the published result of bench-repack (docs/bench/repack.json).
type repackBench struct {
	Machine string    `json:"machine"`
	LoadAvg [2]string `json:"loadavg_start_end"`
	// ReadAhead is the --read-ahead setting the stores were opened with.
	ReadAhead string               `json:"read_ahead"`
	Runs      int                  `json:"cold_runs"`
	Store     string               `json:"store"` // how the store was built
	Repacks   []repackResult       `json:"repacks"`
	Measured  []measuredRoom       `json:"rooms"`
	Cells     []repackBenchCell    `json:"cells"`
	Targets   []repackBenchVerdict `json:"targets"`
}

type repackResult struct {
	Plan  string                `json:"plan"`
	Stats packstore.RepackStats `json:"stats"`
	// Disk bytes and shards before and after.
	DiskBefore, DiskAfter     int64 `json:"-"`
	ShardsBefore, ShardsAfter int   `json:"-"`
	Seconds                   float64
}

type measuredRoom struct {
	Label  string `json:"label"`
	RoomID string `json:"room_id"`
	Events int64  `json:"events"`
}

// repackBenchCell is one (room, walk, layout) measurement: the counters of one
// run (they do not vary) and the cold and warm wall times over the runs.
type repackBenchCell struct {
	Room    string                            `json:"room"`
	Walk    repackplan.WalkKind               `json:"walk"`
	Layout  string                            `json:"layout"` // "before" or the plan kind
	Events  int                               `json:"events"`
	Total   packstore.ReadCounters            `json:"total"`
	Kinds   map[string]packstore.ReadCounters `json:"kinds"`
	ColdMs  []float64                         `json:"cold_ms"`
	WarmMs  []float64                         `json:"warm_ms"`
	ColdMed float64                           `json:"cold_ms_median"`
	WarmMed float64                           `json:"warm_ms_median"`
	// ResidentBefore is the largest count of shard pages found in the page cache
	// after eviction, over the cold runs (0: the cold runs were cold).
	ResidentBefore int64 `json:"resident_pages_after_eviction_max"`
	// CountersVary: the walk's reads + cache hits differed between runs.
	CountersVary bool `json:"counters_vary,omitempty"`
}

type repackBenchVerdict struct {
	Room, Plan, Target, Value string
	Met                       bool
}

func benchRepackCmd() *cobra.Command {
	var gens []string
	var real, out, work, plans, label string
	var runs, limit, realRooms int
	c := &cobra.Command{
		Use:   "bench-repack --gen DIR... [--real DIR] --out DIR",
		Short: "Measure the server walks before and after repack (counters and cold-cache wall time)",
		Long: `Bench-repack builds a store as a homeserver would: every room under --real (in
their arrival order) and every generated room (--gen, a mtxdb gen directory, in its
backfill_order.jsonl order when present: newest first, as a server backfilling from
the extremities receives them) interleaved event by event into one shared pool,
imported with AnyOrder and replayed. It copies the store once per plan kind and
repacks each copy (all rooms, one output stream). Then, for every generated room and
the largest real room, it runs each walk on the store before repack and on each
repacked copy: the read budget by kind (counters of one run), and --runs cold runs
(store closed, shard files evicted with posix_fadvise DONTNEED, reopened, evicted
again, resident pages checked with mincore) and warm runs, alternating the layouts.
It writes DIR/repack.json and DIR/repack.md (repack<label>.* with --label). The
default --out, docs/bench, is relative to the current directory: run from the
repository root, it replaces the published docs/bench/repack.json and repack.md.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if len(gens) == 0 && real == "" {
				return fmt.Errorf("give --gen or --real")
			}
			kinds := []repackplan.Kind{}
			for _, p := range strings.Split(plans, ",") {
				kinds = append(kinds, repackplan.Kind(p))
			}
			if work == "" {
				d, err := os.MkdirTemp("", "mtxdb-bench-repack-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(d)
				work = d
			} else if err := os.MkdirAll(work, 0o755); err != nil {
				return err
			}
			res, err := benchRepack(ctx, cmd.OutOrStdout(), gens, real, realRooms, work, kinds, runs, limit)
			if err != nil {
				return err
			}
			return writeRepackBench(out, label, res)
		},
	}
	c.Flags().StringSliceVar(&gens, "gen", nil, "generated room directory (mtxdb gen --backfill); repeatable")
	c.Flags().StringVar(&real, "real", "", "directory of real rooms (testrooms/real)")
	c.Flags().IntVar(&realRooms, "real-rooms", 0, "import only the first N real rooms (0: all)")
	c.Flags().StringVar(&out, "out", "docs/bench", "directory for repack<label>.json and repack<label>.md, relative to the current directory")
	c.Flags().StringVar(&label, "label", "", "suffix of the output file names")
	c.Flags().StringVar(&work, "work", "", "work directory for the stores (default: a temporary one, removed)")
	c.Flags().StringVar(&plans, "plans", "reverse-topological,auth-chain,edges-first,mixed", "plan kinds to compare")
	c.Flags().IntVar(&runs, "runs", 5, "cold (and warm) runs per cell")
	c.Flags().IntVar(&limit, "limit", 1000, "events of the backfill walk")
	return c
}

// source is one room's PDU lines in the order the server receives them.
type source struct {
	lines [][]byte
	next  int
}

func readLines(path string) ([][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		if len(strings.TrimSpace(sc.Text())) > 0 {
			out = append(out, append([]byte(nil), sc.Bytes()...))
		}
	}
	return out, sc.Err()
}

// genSource returns a generated room's lines in backfill order when the directory
// has backfill_order.jsonl, else in arrival order; and its room version.
func genSource(dir string) (*source, string, error) {
	lines, err := readLines(filepath.Join(dir, "events.jsonl"))
	if err != nil {
		return nil, "", err
	}
	var meta struct {
		RoomVersion string `json:"room_version"`
	}
	if b, err := os.ReadFile(filepath.Join(dir, "meta.json")); err == nil {
		_ = json.Unmarshal(b, &meta)
	}
	order, err := readLines(filepath.Join(dir, "backfill_order.jsonl"))
	if os.IsNotExist(err) {
		return &source{lines: lines}, meta.RoomVersion, nil
	}
	if err != nil {
		return nil, "", err
	}
	byID := make(map[string][]byte, len(lines))
	for _, l := range lines {
		var e struct {
			EventID string `json:"event_id"`
		}
		if err := json.Unmarshal(l, &e); err != nil {
			return nil, "", fmt.Errorf("%s: %w", dir, err)
		}
		byID[e.EventID] = l
	}
	s := &source{}
	for _, o := range order {
		var e struct {
			EventID string `json:"event_id"`
		}
		if err := json.Unmarshal(o, &e); err != nil {
			return nil, "", err
		}
		if l, ok := byID[e.EventID]; ok {
			s.lines = append(s.lines, l)
			delete(byID, e.EventID)
		}
	}
	for _, l := range lines { // events the backfill never reached arrive last
		var e struct {
			EventID string `json:"event_id"`
		}
		_ = json.Unmarshal(l, &e)
		if _, ok := byID[e.EventID]; ok {
			s.lines = append(s.lines, l)
		}
	}
	return s, meta.RoomVersion, nil
}

// interleave writes the sources' lines spread evenly over one stream: at each step
// the source with the smallest fraction consumed goes next.
func interleave(w io.Writer, srcs []*source) error {
	bw := bufio.NewWriter(w)
	for {
		best, frac := -1, 2.0
		for i, s := range srcs {
			if s.next < len(s.lines) {
				if f := float64(s.next) / float64(len(s.lines)); f < frac {
					best, frac = i, f
				}
			}
		}
		if best < 0 {
			return bw.Flush()
		}
		s := srcs[best]
		bw.Write(s.lines[s.next])
		bw.WriteByte('\n')
		s.next++
	}
}

func copyDir(src, dst string) error {
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("cp %s %s: %v: %s", src, dst, err, out)
	}
	return nil
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}

// benchRepack builds the store (benchRepackInput, benchRepackStore), repacks one
// copy of it per plan kind (benchRepackLayouts) and measures the walks of every
// generated room and the largest real room on each layout (benchRepackCells).
// work holds the input stream and the stores.
func benchRepack(ctx context.Context, out io.Writer, gens []string, real string, realRooms int, work string, kinds []repackplan.Kind, runs, limit int) (*repackBench, error) {
	res := &repackBench{Runs: runs, LoadAvg: [2]string{loadAvg()}, ReadAhead: readAhead.String()}
	if u, err := exec.Command("uname", "-srm").Output(); err == nil {
		res.Machine = fmt.Sprintf("%s, %d CPUs (GOMAXPROCS %d)", strings.TrimSpace(string(u)), runtime.NumCPU(), runtime.GOMAXPROCS(0))
	}
	input := filepath.Join(work, "interleaved.jsonl")
	version, store, err := benchRepackInput(input, gens, real, realRooms)
	if err != nil {
		return nil, err
	}
	res.Store = store
	fmt.Fprintf(out, "bench-repack: %s\n", res.Store)
	base := filepath.Join(work, "before")
	if res.Measured, err = benchRepackStore(ctx, out, base, input, version, gens); err != nil {
		return nil, err
	}
	layouts, dirs, err := benchRepackLayouts(ctx, out, res, base, work, kinds)
	if err != nil {
		return nil, err
	}
	// The walks: counters once, then cold and warm runs alternating the layouts.
	for _, m := range res.Measured {
		for _, w := range repackplan.WalkKinds {
			cells, err := benchRepackCells(ctx, m, w, layouts, dirs, runs, limit)
			if err != nil {
				return nil, err
			}
			for _, c := range cells {
				res.Cells = append(res.Cells, *c)
				fmt.Fprintf(out, "%-24s %-20s %-20s reads=%-6d pages=%-6d seeks=%-6d bytes=%-9d cold=%.2fms warm=%.2fms\n",
					m.Label, w, c.Layout, c.Total.Reads, c.Total.Pages, c.Total.Seeks, c.Total.Bytes, c.ColdMed, c.WarmMed)
			}
		}
	}
	res.LoadAvg[1] = loadAvg()
	res.Targets = repackTargets(res)
	return res, nil
}

// benchRepackInput writes to input one stream of every room's PDUs: the first
// realRooms rooms under real (all for 0) in arrival order and the generated rooms
// in gens in backfill order, interleaved evenly. It returns the generated rooms'
// room version (they must share one) and a sentence saying how the store is built.
func benchRepackInput(input string, gens []string, real string, realRooms int) (version, store string, err error) {
	var realDirs []string
	if real != "" {
		ents, err := os.ReadDir(real)
		if err != nil {
			return "", "", err
		}
		for _, e := range ents {
			if _, err := os.Stat(filepath.Join(real, e.Name(), "events.jsonl")); e.IsDir() && err == nil {
				realDirs = append(realDirs, filepath.Join(real, e.Name()))
			}
		}
		if realRooms > 0 && realRooms < len(realDirs) {
			realDirs = realDirs[:realRooms]
		}
	}
	var srcs []*source
	events := 0
	for _, d := range realDirs {
		lines, err := readLines(filepath.Join(d, "events.jsonl"))
		if err != nil {
			return "", "", err
		}
		srcs = append(srcs, &source{lines: lines})
		events += len(lines)
	}
	for _, d := range gens {
		s, v, err := genSource(d)
		if err != nil {
			return "", "", err
		}
		if version != "" && v != version {
			return "", "", fmt.Errorf("generated rooms of different room versions (%s, %s): give one version", version, v)
		}
		version = v
		srcs = append(srcs, s)
		events += len(s.lines)
	}
	f, err := os.Create(input)
	if err != nil {
		return "", "", err
	}
	if err := interleave(f, srcs); err != nil {
		f.Close()
		return "", "", err
	}
	f.Close()
	store = fmt.Sprintf("%d real rooms (arrival order) and %d generated rooms (backfill order, newest first), %d events interleaved evenly into one shared pool, imported with AnyOrder (batches of 1000) and replayed", len(realDirs), len(gens), events)
	return version, store, nil
}

// benchRepackStore creates the store base from input (AnyOrder, version for rooms
// whose m.room.create comes late), replays every room, and returns the rooms to
// measure: every generated room of gens (by the room ID in its meta.json) and the
// largest real room.
func benchRepackStore(ctx context.Context, out io.Writer, base, input, version string, gens []string) ([]measuredRoom, error) {
	eng, st, err := openStore(base, true)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if _, err := importFile(ctx, st, input, roomstate.ImportOptions{BatchSize: 1000, AnyOrder: true, RoomVersion: version}, out); err != nil {
		eng.Close()
		return nil, err
	}
	rooms, err := st.Rooms(ctx)
	if err == nil {
		var problems roomProblems
		if _, problems, err = replayRooms(ctx, rooms, false, out, nil); err == nil && len(problems) > 0 {
			err = fmt.Errorf("bench-repack: room %s: %s", problems[0].room, problems[0].what)
		}
	}
	if err != nil {
		eng.Close()
		return nil, err
	}
	fmt.Fprintf(out, "bench-repack: imported and replayed in %s\n", time.Since(t0).Round(time.Second))
	genIDs := map[string]string{}
	for _, d := range gens {
		var meta struct {
			RoomID string `json:"room_id"`
		}
		b, err := os.ReadFile(filepath.Join(d, "meta.json"))
		if err == nil {
			err = json.Unmarshal(b, &meta)
		}
		if err != nil {
			eng.Close()
			return nil, err
		}
		genIDs[meta.RoomID] = fmt.Sprintf("generated %s", filepath.Base(d))
	}
	var measured []measuredRoom
	var largestReal *roomstate.Room
	for _, r := range rooms {
		if label, ok := genIDs[r.ID()]; ok {
			measured = append(measured, measuredRoom{Label: label, RoomID: r.ID(), Events: int64(r.Head().Events)})
		} else if largestReal == nil || r.Head().Events > largestReal.Head().Events {
			largestReal = r
		}
	}
	if largestReal != nil {
		measured = append(measured, measuredRoom{Label: "largest real", RoomID: largestReal.ID(), Events: int64(largestReal.Head().Events)})
	}
	if err := eng.Close(); err != nil {
		return nil, err
	}
	return measured, nil
}

// benchRepackLayouts copies the store base to work/KIND once per plan kind and
// repacks each copy (every room, one output stream), appending what each repack
// did to res.Repacks. It returns the layouts ("before", then the kinds) and the
// store directory of each.
func benchRepackLayouts(ctx context.Context, out io.Writer, res *repackBench, base, work string, kinds []repackplan.Kind) ([]string, map[string]string, error) {
	layouts := []string{"before"}
	dirs := map[string]string{"before": base}
	for _, k := range kinds {
		dir := filepath.Join(work, string(k))
		if err := copyDir(base, dir); err != nil {
			return nil, nil, err
		}
		eng, st, err := openStore(dir, false)
		if err != nil {
			return nil, nil, err
		}
		rooms, err := st.Rooms(ctx)
		if err != nil {
			eng.Close()
			return nil, nil, err
		}
		t := time.Now()
		rs, problems, err := repackSummary(ctx, out, eng, rooms, repackplan.Options{Kind: k})
		sec := time.Since(t).Seconds()
		if err == nil && len(problems) > 0 {
			err = fmt.Errorf("bench-repack: room %s: %s", problems[0].room, problems[0].what)
		}
		if cerr := eng.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, nil, err
		}
		res.Repacks = append(res.Repacks, repackResult{Plan: string(k), Stats: rs, Seconds: sec})
		layouts = append(layouts, string(k))
		dirs[string(k)] = dir
	}
	return layouts, dirs, nil
}

// benchRepackCells measures walk w of room m on every layout (store directory
// dirs[layout]): the counters of one warm run, then runs cold and warm runs each,
// the layouts in turn (reversed every other run), with the medians set. The cells
// are in the order of layouts.
func benchRepackCells(ctx context.Context, m measuredRoom, w repackplan.WalkKind, layouts []string, dirs map[string]string, runs, limit int) ([]*repackBenchCell, error) {
	cells := map[string]*repackBenchCell{}
	for _, l := range layouts {
		wb, err := measureWalk(ctx, dirs[l], m.RoomID, w, limit, false)
		if err != nil {
			return nil, err
		}
		cells[l] = &repackBenchCell{Room: m.Label, Walk: w, Layout: l, Events: wb.Events, Total: wb.Total, Kinds: wb.Kinds}
	}
	for r := range runs {
		order := slices.Clone(layouts)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, l := range order {
			c := cells[l]
			wb, err := measureWalk(ctx, dirs[l], m.RoomID, w, limit, true)
			if err != nil {
				return nil, err
			}
			c.ColdMs = append(c.ColdMs, ms(wb.Wall))
			c.ResidentBefore = max(c.ResidentBefore, wb.Resident)
			if wb.Total.Reads+wb.Total.CacheHits != c.Total.Reads+c.Total.CacheHits {
				// The node cache (ristretto) admits entries asynchronously and
				// probabilistically: a walk that rereads records splits them
				// differently between hits and reads from run to run.
				c.CountersVary = true
			}
			wb, err = measureWalk(ctx, dirs[l], m.RoomID, w, limit, false)
			if err != nil {
				return nil, err
			}
			c.WarmMs = append(c.WarmMs, ms(wb.Wall))
		}
	}
	out := make([]*repackBenchCell, 0, len(layouts))
	for _, l := range layouts {
		c := cells[l]
		c.ColdMed, c.WarmMed = median(c.ColdMs), median(c.WarmMs)
		out = append(out, c)
	}
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// repackTargets checks the repack's targets (docs/benchmarks.md) for the auth-chain walk of
// each generated room, after each plan.
func repackTargets(res *repackBench) []repackBenchVerdict {
	var out []repackBenchVerdict
	find := func(room, layout string) *repackBenchCell {
		for i := range res.Cells {
			c := &res.Cells[i]
			if c.Room == room && c.Walk == repackplan.WalkAuthChain && c.Layout == layout {
				return c
			}
		}
		return nil
	}
	for _, m := range res.Measured {
		if !strings.HasPrefix(m.Label, "generated") {
			continue
		}
		b := find(m.Label, "before")
		for _, rp := range res.Repacks {
			a := find(m.Label, rp.Plan)
			if a == nil || b == nil {
				continue
			}
			ideal := float64(a.Total.Bytes) / ReadPageSizeF
			pr := float64(a.Total.Pages) / ideal
			sr := float64(b.Total.Seeks) / float64(max(1, a.Total.Seeks))
			wr := b.ColdMed / max(a.ColdMed, 1e-3)
			out = append(out,
				repackBenchVerdict{m.Label, rp.Plan, "pages <= 1.2 x reachable bytes / 4096", fmt.Sprintf("%d pages / %.0f = %.2fx", a.Total.Pages, ideal, pr), pr <= 1.2},
				repackBenchVerdict{m.Label, rp.Plan, "seeks reduced >= 10x", fmt.Sprintf("%d -> %d = %.1fx", b.Total.Seeks, a.Total.Seeks, sr), sr >= 10},
				repackBenchVerdict{m.Label, rp.Plan, "cold wall time >= 5x lower", fmt.Sprintf("%.2f -> %.2f ms = %.1fx", b.ColdMed, a.ColdMed, wr), wr >= 5})
		}
	}
	return out
}

// ReadPageSizeF is packstore.ReadPageSize as a float.
const ReadPageSizeF = float64(packstore.ReadPageSize)

func writeRepackBench(dir, label string, res *repackBench) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "repack"+label+".json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "# bench-repack%s\n\nMachine: %s. Load average at start: %s; at end: %s. Cold runs per cell: %d (median shown). Read-ahead: %s.\n\nStore: %s.\n\n", label, res.Machine, res.LoadAvg[0], res.LoadAvg[1], res.Runs, res.ReadAhead, res.Store)
	sb.WriteString("## Repacks (all rooms, one output stream)\n\n| plan | records copied | bytes copied | garbage records dropped | shards retired | bytes retired | seconds |\n|---|---|---|---|---|---|---|\n")
	for _, r := range res.Repacks {
		fmt.Fprintf(&sb, "| %s | %d | %d | %d | %d | %d | %.1f |\n", r.Plan, r.Stats.RecordsCopied, r.Stats.BytesCopied, r.Stats.RecordsDropped, r.Stats.ShardsRetired, r.Stats.BytesRetired, r.Seconds)
	}
	sb.WriteString("\n## Walks\n\nCounters are of one run; they repeat exactly except where the node cache (ristretto, asynchronous probabilistic admission) splits rereads differently between cache hits and physical reads (resolve-extremities rereads; marked ~). pages: distinct 4 KiB pages; seeks: physical reads not in the previous read's pages or the next page of the same shard; cold: shard files evicted (posix_fadvise DONTNEED) before the walk, store freshly opened; resident: most shard pages found cached after eviction (mincore).\n\n")
	sb.WriteString("| room | walk | layout | events | reads (node/pdu/meta/other) | bytes | pages | ideal pages | seeks | cold ms | warm ms | resident |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range res.Cells {
		var per []string
		for _, k := range roomrecord.ReadKinds {
			per = append(per, fmt.Sprint(c.Kinds[roomrecord.ReadKindName(k)].Reads))
		}
		vary := ""
		if c.CountersVary {
			vary = "~"
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %d | %s%d (%s) | %d | %d | %.0f | %d | %.2f | %.2f | %d |\n", c.Room, c.Walk, c.Layout, c.Events, vary, c.Total.Reads, strings.Join(per, "/"), c.Total.Bytes, c.Total.Pages, float64(c.Total.Bytes)/ReadPageSizeF, c.Total.Seeks, c.ColdMed, c.WarmMed, c.ResidentBefore)
	}
	sb.WriteString("\n## Targets (auth-chain walk, docs/benchmarks.md)\n\n| room | plan | target | value | met |\n|---|---|---|---|---|\n")
	for _, t := range res.Targets {
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s |\n", t.Room, t.Plan, t.Target, t.Value, map[bool]string{true: "yes", false: "**no**"}[t.Met])
	}
	return os.WriteFile(filepath.Join(dir, "repack"+label+".md"), []byte(sb.String()), 0o644)
}
