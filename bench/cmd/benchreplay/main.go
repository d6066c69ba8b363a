// Command benchreplay measures the main job at room scale: for each
// room size it generates a room with `mtxdb gen` (seed 1), imports it, replays it
// and runs `verify --expected`, each as its own process, and records wall time,
// user+system CPU and peak RSS (the child's rusage), events/s, replay events per
// CPU second (events/s per core, beside the 20,000 of gomatrixserverlib's parse
// and hash check), bytes on disk per event and the resolution p50/p99 that replay
// prints. The measured replay runs with --cpuprofile; its profile is summarised
// per room (the CPU time's share by phase, and the functions under the replay
// goroutine's compute with the largest cumulative share: profile.go) in
// replay.json and replay.md. After the rooms, the small and the large room of
// -ratio-rooms are replayed again in turn (-ratio-pairs large replays, each
// between two small ones: interleaved.go), and the per-event cost target reads
// the median ratio of each large replay to its neighbours. The generation time of the
// same room in the same run, less the time its reference checks took (the line
// `mtxdb gen` prints for them), is the denominator of the replay/gen ratio.
//
// Usage (from bench/, the module that has gonum/plot; `make bench-replay`):
//
//	go run ./cmd/benchreplay -mtxdb ../bin/mtxdb -rooms 12:10000,12:100000,12:1000000,10:100000 -out ../docs/bench
//
// The 1M-event room takes about half an hour of the run (generation 26 min and
// 2.7 GB of memory, import, replay and verify a minute or two each), the
// interleaved replays about 7 minutes more.
//
// -from FILE writes replay.md and replay.png again from a replay.json ("—" for
// what a replay.json from before the per-core rate and the profile lacks); -plot
// FILE draws only replay.png (`make plots`). replay.md's "Targets" states issue
// 31's targets as met or NOT met (verdicts).
//
// It writes replay.json, replay.md and replay.png (replay events/s and peak RSS
// against room size, in two panels) in -out. -work holds the generated rooms,
// stores and replay CPU profiles (removed unless -keep). With -postgres URL (a server's URL; `make bench-replay` starts one
// with scripts/pgserver.sh), the rooms listed in -postgres-rooms are also
// imported, replayed and verified on a fresh database of that server (pgstore),
// beside the packfile store.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"log"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mtxdb/mtxdb/bench/internal/cmdrun"

	"github.com/jackc/pgx/v5"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/mtxdb/mtxdb/bench/internal/barplot"
)

// step is one measured command.
type step = cmdrun.Step

// result is one room.
type result struct {
	Version string `json:"room_version"`
	Events  int    `json:"events"`
	Gen     step   `json:"gen"`
	// GenReference is the part of Gen that the reference checks took (wall and
	// CPU; zero when gen printed none); GenSimulation is Gen without it.
	GenReference  step    `json:"gen_reference"`
	GenSimulation step    `json:"gen_simulation"`
	Import        step    `json:"import"`
	Replay        step    `json:"replay"`
	Verify        step    `json:"verify_expected"`
	EventsPerS    float64 `json:"replay_events_per_s"`
	// EventsPerCPU is the events over the replay's CPU seconds (user+system):
	// events/s per core (zero in a replay.json written before it existed).
	EventsPerCPU float64 `json:"replay_events_per_cpu_s,omitempty"`
	ReplayByGen  float64 `json:"replay_over_gen"`
	BytesPerEv   float64 `json:"store_bytes_per_event"`
	ResP50us     int     `json:"resolution_p50_us"`
	ResP99us     int     `json:"resolution_p99_us"`
	Mismatches   int     `json:"mismatches"`
	PDUsParsed   int     `json:"pdus_parsed"`
	Postgres     *pgRun  `json:"postgres,omitempty"`
	// Profile summarises the measured replay's CPU profile (nil in a
	// replay.json written before it existed).
	Profile *profileSummary `json:"profile,omitempty"`
}

// pgRun is the same room imported, replayed and verified on PostgreSQL.
type pgRun struct {
	Import     step    `json:"import"`
	Replay     step    `json:"replay"`
	Verify     step    `json:"verify_expected"`
	EventsPerS float64 `json:"replay_events_per_s"`
	ByPack     float64 `json:"replay_over_packfile_replay"`
	Mismatches int     `json:"mismatches"`
}

type report struct {
	Date    string   `json:"date"`
	Machine string   `json:"machine"`
	LoadAvg []string `json:"loadavg_before_after"`
	Commit  string   `json:"commit"`
	Rooms   []result `json:"rooms"`
	// Interleaved is the per-event cost ratio from replays run side by side
	// (nil when the run made none).
	Interleaved *interleaved `json:"interleaved,omitempty"`
}

// makeVariables names the make variables of `make bench-replay` that set the
// flags its errors name.
const makeVariables = "make bench-replay sets -rooms from BENCH_REPLAY_ROOMS, -ratio-rooms from BENCH_REPLAY_RATIO, " +
	"-ratio-pairs from BENCH_REPLAY_PAIRS, -postgres-rooms from BENCH_REPLAY_PG_ROOMS, -out from BENCH_REPLAY_OUT"

func main() {
	bin := flag.String("mtxdb", "../bin/mtxdb", "the mtxdb binary")
	rooms := flag.String("rooms", "12:10000,12:100000,12:1000000,10:100000", "rooms to measure, VERSION:EVENTS, comma-separated")
	out := flag.String("out", "../docs/bench", "directory for replay.{json,md,png}")
	work := flag.String("work", ".work-replay", "working directory (generated rooms and stores)")
	keep := flag.Bool("keep", false, "keep the working directory")
	from := flag.String("from", "", "measure nothing: write replay.md and replay.png again from this replay.json")
	plotOnly := flag.String("plot", "", "measure nothing: draw replay.png again in -out from this replay.json, writing nothing else")
	pgURL := flag.String("postgres", "", "URL of a PostgreSQL server (superuser) to replay on as well")
	pgRooms := flag.String("postgres-rooms", "12:10000", "with -postgres: the rooms (VERSION:EVENTS) also run on PostgreSQL")
	ratioRooms := flag.String("ratio-rooms", "12:100000,12:1000000", "SMALL,LARGE: the rooms (VERSION:EVENTS, both in -rooms) replayed in turn after the others for the per-event cost ratio")
	ratioPairs := flag.Int("ratio-pairs", 3, "large replays in the interleaved measurement, each between two small ones (0: none)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: benchreplay [flags] (docs/benchmarks.md; %s); -h lists the flags\n", makeVariables)
		if slices.ContainsFunc(os.Args[1:], func(a string) bool { return a == "-h" || a == "-help" || a == "--help" }) {
			flag.PrintDefaults()
		}
	}
	flag.Parse()
	outSet := false
	flag.Visit(func(f *flag.Flag) { outSet = outSet || f.Name == "out" })
	if *from != "" || *plotOnly != "" {
		src := cmp.Or(*from, *plotOnly)
		if !outSet { // beside the replay.json read, never over the published run by default
			*out = filepath.Dir(src)
		}
		b, err := os.ReadFile(src)
		if err != nil {
			log.Fatal(err)
		}
		var rep report
		if err := json.Unmarshal(b, &rep); err != nil {
			log.Fatalf("%s: %v", src, err)
		}
		if *from != "" {
			err = write(rep, *out)
		} else {
			err = plotRooms(rep, filepath.Join(*out, "replay.png"))
		}
		if err != nil {
			log.Fatal(err)
		}
		return
	}
	plan, err := planRun(*rooms, *ratioRooms, *ratioPairs, *pgRooms, *pgURL != "")
	if err != nil {
		log.Fatalf("%v (%s)", err, makeVariables)
	}
	if plan.pairs == 0 {
		log.Printf("no side-by-side replays (-ratio-pairs 0; make: BENCH_REPLAY_PAIRS): a per-event cost ratio comes from the rooms' rows")
	}
	abs, err := filepath.Abs(*bin)
	if err != nil {
		log.Fatal(err)
	}
	rep := report{Date: time.Now().UTC().Format(time.RFC3339), Machine: cmdrun.Machine(), Commit: cmdrun.Commit()}
	rep.LoadAvg = append(rep.LoadAvg, cmdrun.Loadavg())
	if err := os.MkdirAll(*work, 0o755); err != nil {
		log.Fatal(err)
	}
	for _, room := range plan.rooms {
		ver, events := room.ver, room.events
		res, err := measure(abs, *work, ver, events)
		if err != nil {
			log.Fatal(err)
		}
		if *pgURL != "" && slices.Contains(plan.pg, room) {
			if res.Postgres, err = measurePG(abs, *work, *pgURL, &res); err != nil {
				log.Fatal(err)
			}
			log.Printf("v%s %d events on PostgreSQL: import %.1f s, replay %.1f s (%.0f events/s, %.2fx packfiles), verify %.1f s, mismatches %d",
				ver, events, res.Postgres.Import.Wall, res.Postgres.Replay.Wall, res.Postgres.EventsPerS, res.Postgres.ByPack, res.Postgres.Verify.Wall, res.Postgres.Mismatches)
		}
		rep.Rooms = append(rep.Rooms, res)
		// Written after every room, so a run stopped during the 1M room keeps the others.
		partial := rep
		partial.LoadAvg = append(slices.Clone(rep.LoadAvg), cmdrun.Loadavg())
		if err := write(partial, *out); err != nil {
			log.Fatal(err)
		}
		log.Printf("v%s %d events: gen %.1f s, import %.1f s, replay %.1f s (%.0f events/s, %.0f per CPU second, %.2fx gen, %.0f MB), verify %.1f s, mismatches %d",
			ver, events, res.Gen.Wall, res.Import.Wall, res.Replay.Wall, res.EventsPerS, res.EventsPerCPU, res.ReplayByGen, res.Replay.PeakMB, res.Verify.Wall, res.Mismatches)
	}
	if plan.pairs > 0 {
		if rep.Interleaved, err = measureInterleaved(abs, *work, plan.small, plan.large, plan.pairs); err != nil {
			log.Fatal(err)
		}
		log.Printf("interleaved: per-event cost ratios, wall %s, CPU %s", ratioList(rep.Interleaved.WallRatios), ratioList(rep.Interleaved.CPURatios))
	}
	rep.LoadAvg = append(rep.LoadAvg, cmdrun.Loadavg())
	if !*keep {
		os.RemoveAll(*work)
	}
	if err := write(rep, *out); err != nil {
		log.Fatal(err)
	}
	log.Printf("wrote replay.json, replay.md and replay.png in %s", *out)
}

// measure runs the four steps on one room.
func measure(bin, work, ver string, events int) (result, error) {
	res := result{Version: ver, Events: events}
	dir := filepath.Join(work, fmt.Sprintf("v%s-%d", ver, events))
	room, store, prof := dir+"-room", dir+"-store", dir+"-replay.cpu.pprof"
	os.RemoveAll(room)
	os.RemoveAll(store)
	var err error
	if res.Gen, err = cmdrun.Run(bin, "gen", "--seed", "1", "--events", strconv.Itoa(events), "--servers", "5", "--room-version", ver, "--out", room); err != nil {
		return res, err
	}
	if res.Import, err = cmdrun.Run(bin, "import", "--store", store, room); err != nil {
		return res, err
	}
	if res.Replay, err = cmdrun.Run(bin, "replay", "--store", store, "--cpuprofile", prof); err != nil {
		return res, err
	}
	if res.Profile, err = readProfile(prof); err != nil {
		return res, err
	}
	size, err := cmdrun.DuBytes(store)
	if err != nil {
		return res, err
	}
	if res.Verify, err = cmdrun.Run(bin, "verify", "--store", store, "--expected", room); err != nil {
		return res, err
	}
	res.EventsPerS = float64(events) / res.Replay.Wall
	res.EventsPerCPU = float64(events) / res.Replay.CPU
	res.GenReference = referenceTime(res.Gen.Stdout)
	res.GenSimulation = step{Wall: res.Gen.Wall - res.GenReference.Wall, CPU: res.Gen.CPU - res.GenReference.CPU}
	res.ReplayByGen = res.Replay.Wall / res.genBase().Wall
	res.BytesPerEv = float64(size) / float64(events)
	res.ResP50us = cmdrun.Field(res.Replay.Output, "resolution_p50_us")
	res.ResP99us = cmdrun.Field(res.Replay.Output, "resolution_p99_us")
	res.Mismatches = cmdrun.Field(res.Verify.Output, "mismatches")
	res.PDUsParsed = cmdrun.Field(res.Replay.Output, "pdus_parsed")
	return res, nil
}

// measurePG imports, replays and verifies the room measure generated on a
// fresh database of the server at admin (the room directory is kept until then).
func measurePG(bin, work, admin string, res *result) (*pgRun, error) {
	dir := filepath.Join(work, fmt.Sprintf("v%s-%d", res.Version, res.Events))
	room := dir + "-room"
	name := fmt.Sprintf("benchreplay_v%s_%d", res.Version, res.Events)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, err
	}
	defer conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	u, err := url.Parse(admin)
	if err != nil {
		return nil, err
	}
	u.Path = "/" + name
	store := u.String()
	pg := &pgRun{}
	if pg.Import, err = cmdrun.Run(bin, "import", "--store", store, room); err != nil {
		return nil, err
	}
	if pg.Replay, err = cmdrun.Run(bin, "replay", "--store", store); err != nil {
		return nil, err
	}
	if pg.Verify, err = cmdrun.Run(bin, "verify", "--store", store, "--expected", room); err != nil {
		return nil, err
	}
	pg.EventsPerS = float64(res.Events) / pg.Replay.Wall
	pg.ByPack = pg.Replay.Wall / res.Replay.Wall
	pg.Mismatches = cmdrun.Field(pg.Verify.Output, "mismatches")
	return pg, nil
}

// genBase is the ratios' denominator: the generation without its reference
// checks (the whole generation in a replay.json written before they existed).
func (r result) genBase() step {
	if r.GenSimulation.Wall > 0 {
		return r.GenSimulation
	}
	return r.Gen
}

// referenceLine matches the wall and CPU times in the line `mtxdb gen` prints
// for its reference checks: "... in 1m2.5s (1m58s CPU) on 2 workers; ...".
var referenceLine = regexp.MustCompile(`: reference \(resolver/specres\):.* in (\S+) \((\S+) CPU\) on \d+ workers`)

// referenceTime reads the reference checks' wall and CPU time from gen's
// output (zero when it printed none: --no-reference).
func referenceTime(stdout string) step {
	m := referenceLine.FindStringSubmatch(stdout)
	if m == nil {
		return step{}
	}
	wall, err1 := time.ParseDuration(m[1])
	cpu, err2 := time.ParseDuration(m[2])
	if err1 != nil || err2 != nil {
		return step{}
	}
	return step{Wall: wall.Seconds(), CPU: cpu.Seconds()}
}

// write saves replay.json, replay.md and replay.png.
func write(rep report, out string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "replay.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Replay at room scale (`make bench-replay`)\n\n")
	fmt.Fprintf(&b, "Run %s at commit %s on %s; load average before/after: %s. One run per room: each step is its own `mtxdb` process (wall clock, user+system CPU and peak RSS from its rusage; MB are 10^6 bytes). Rooms from `mtxdb gen --seed 1 --servers 5`; the ratios' denominator is the generation of the same room in the same run without its reference checks (gen's reference line gives their wall and CPU time; the gen column shows the whole run and the reference's share). ",
		rep.Date, rep.Commit, rep.Machine, strings.Join(rep.LoadAvg, " / "))
	fmt.Fprintf(&b, "Replay events/s per core is the events over the replay's CPU seconds (user+system), beside its ratio to the anchors' per-core ceiling of %s events/s (gomatrixserverlib parses and hash-checks an event in about 50 µs).", thousands(anchorParsePerS))
	if slices.ContainsFunc(rep.Rooms, func(r result) bool { return r.Profile != nil }) {
		b.WriteString(" The measured replay ran with the CPU profiler at its default 100 Hz (`--cpuprofile`; \"Profile summary\" below): its wall, CPU and RSS include the profiler's cost.")
	}
	b.WriteString("\n\n| room | events | gen wall / CPU (reference) | import wall | replay wall | replay CPU | replay peak RSS | replay events/s | replay events/s per core (vs 20,000) | replay / gen (wall) | replay / gen (CPU) | PDUs parsed | resolution p50 / p99 | verify --expected wall / RSS | mismatches | bytes on disk / event |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rep.Rooms {
		fmt.Fprintf(&b, "| v%s | %d | %.1f s / %.1f s (%.1f s / %.1f s) | %.1f s | %.1f s | %.1f s | %.0f MB | %.0f | %s | %.2fx | %.2fx | %d | %d / %d µs | %.1f s / %.0f MB | %d | %.0f |\n",
			r.Version, r.Events, r.Gen.Wall, r.Gen.CPU, r.GenReference.Wall, r.GenReference.CPU, r.Import.Wall, r.Replay.Wall, r.Replay.CPU, r.Replay.PeakMB, r.EventsPerS, perCore(r.EventsPerCPU), r.ReplayByGen,
			r.Replay.CPU/r.genBase().CPU, r.PDUsParsed, r.ResP50us, r.ResP99us, r.Verify.Wall, r.Verify.PeakMB, r.Mismatches, r.BytesPerEv)
	}
	b.WriteString(verdicts(rep))
	b.WriteString(rep.Interleaved.section())
	var pgRows strings.Builder
	for _, r := range rep.Rooms {
		if pg := r.Postgres; pg != nil {
			fmt.Fprintf(&pgRows, "| v%s | %d | %.1f s | %.1f s / %.1f s | %.1f s | %.0f MB | %.0f | %.2fx | %.1f s | %d |\n",
				r.Version, r.Events, pg.Import.Wall, pg.Replay.Wall, r.Replay.Wall, pg.Replay.CPU, pg.Replay.PeakMB, pg.EventsPerS, pg.ByPack, pg.Verify.Wall, pg.Mismatches)
		}
	}
	if pgRows.Len() > 0 {
		fmt.Fprintf(&b, "\nThe same rooms on PostgreSQL (pgstore, `--store postgres://...`, a fresh database on the local server `make bench-replay` starts with scripts/pgserver.sh, default durable settings), in the same run:\n\n")
		fmt.Fprintf(&b, "| room | events | import wall | replay wall: PostgreSQL / packfiles | replay CPU | replay peak RSS | replay events/s | PostgreSQL / packfiles | verify --expected wall | mismatches |\n")
		fmt.Fprintf(&b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		b.WriteString(pgRows.String())
	}
	fmt.Fprintf(&b, "\nAnchors (published figures, not measured here): gomatrixserverlib parses and hash-checks one event in ~50 us (~20,000 events/s per core); Synapse joins Matrix HQ (28k state events) at about 40 events/s; Dendrite loading HQ's state reached 8 GB RSS.\n")
	b.WriteString(profileSection(rep))
	if err := os.WriteFile(filepath.Join(out, "replay.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	return plotRooms(rep, filepath.Join(out, "replay.png"))
}

// perCore renders events/s per core with its ratio to anchorParsePerS
// ("7,420 (0.37x)"), or "—" when the replay.json has none.
func perCore(v float64) string {
	if v <= 0 {
		return "—"
	}
	return fmt.Sprintf("%s (%.2fx)", thousands(v), v/anchorParsePerS)
}

// thousands rounds v to a whole number and writes it with commas (12,345).
func thousands(v float64) string {
	return barplot.Thousands(math.Round(v))
}

// The published figures drawn beside ours (replay.md's "Anchors").
const (
	anchorParsePerS   = 20_000 // gomatrixserverlib: parse and hash-check, ~50 µs per event, one core
	anchorSynapsePerS = 40     // Synapse joining Matrix HQ (28k state events)
	anchorDendriteMB  = 8_000  // Dendrite loading Matrix HQ's state
)

// The targets verdicts states as met or NOT met.
const (
	target100kPerS     = 15_000 // replay of the v12 100k-event room, events / wall second
	target1MPerS       = 10_000 // replay of the v12 1M-event room, events / wall second
	targetPerEventCost = 1.15   // replay's wall and CPU per event at 1M over those at 100k
	targetReplayMB     = 1_000  // replay's peak RSS at 1M
	targetImportPerS   = 25_000 // import at 1M, events / wall second
	targetGenMB        = 3_000  // mtxdb gen's peak RSS at 1M
	targetOtherPeakMB  = 2_000  // verify's and import's peak RSS at 1M
)

// series is one line of a panel: points joined in X order, or a horizontal
// reference line across the panel when y is set.
type series struct {
	name   string
	xy     plotter.XYs
	y      float64
	colour color.Color
	dashes []vg.Length
	shape  draw.GlyphDrawer
}

// plotRooms draws replay.png from a report: two panels against the room's size in
// events, replay speed (events/s) on the left and peak RSS (MB) on the right, both
// on log axes; the packfile rooms of each room version, PostgreSQL's where the run
// has them, the generation of the same rooms, the targets and the published
// anchors.
func plotRooms(rep report, path string) error {
	var (
		events                                 []float64
		v12, other, pg, gen                    plotter.XYs
		rssReplay, rssVerify, rssImport, rssPG plotter.XYs
		rssGen                                 plotter.XYs
	)
	for _, r := range rep.Rooms {
		x := float64(r.Events)
		events = append(events, x)
		if r.Version != "12" {
			other = append(other, plotter.XY{X: x, Y: r.EventsPerS})
			continue
		}
		v12 = append(v12, plotter.XY{X: x, Y: r.EventsPerS})
		if g := r.genBase(); g.Wall > 0 {
			gen = append(gen, plotter.XY{X: x, Y: x / g.Wall})
		}
		rssReplay = append(rssReplay, plotter.XY{X: x, Y: r.Replay.PeakMB})
		rssVerify = append(rssVerify, plotter.XY{X: x, Y: r.Verify.PeakMB})
		rssImport = append(rssImport, plotter.XY{X: x, Y: r.Import.PeakMB})
		rssGen = append(rssGen, plotter.XY{X: x, Y: r.Gen.PeakMB})
		if r.Postgres != nil {
			pg = append(pg, plotter.XY{X: x, Y: r.Postgres.EventsPerS})
			rssPG = append(rssPG, plotter.XY{X: x, Y: r.Postgres.Replay.PeakMB})
		}
	}
	if len(events) == 0 {
		return fmt.Errorf("no rooms to plot")
	}
	blue, orange, green, grey := color.RGBA{B: 200, A: 255}, color.RGBA{R: 230, G: 120, A: 255}, color.RGBA{G: 150, A: 255}, color.Gray{Y: 110}
	red, purple := color.RGBA{R: 200, A: 255}, color.RGBA{R: 130, B: 160, A: 255}
	dashed, dotted := []vg.Length{vg.Points(5), vg.Points(3)}, []vg.Length{vg.Points(1.5), vg.Points(2.5)}
	speed := []series{
		{name: "replay, packfiles (v12)", xy: v12, colour: blue, shape: draw.RingGlyph{}},
		{name: "replay, packfiles (v10)", xy: other, colour: green, shape: draw.PyramidGlyph{}},
		{name: "replay, PostgreSQL (v12)", xy: pg, colour: orange, shape: draw.SquareGlyph{}},
		{name: "mtxdb gen of the same room", xy: gen, colour: grey, dashes: dashed, shape: draw.CrossGlyph{}},
		{name: "target: 15,000 events/s at 100k (10,000 at 1M)", y: target100kPerS, colour: red, dashes: dashed},
		{name: "published: gomatrixserverlib parse + hash check, one core", y: anchorParsePerS, colour: purple, dashes: dotted},
		{name: "published: Synapse joining Matrix HQ", y: anchorSynapsePerS, colour: grey, dashes: dotted},
	}
	memory := []series{
		{name: "replay, packfiles", xy: rssReplay, colour: blue, shape: draw.RingGlyph{}},
		{name: "verify --expected, packfiles", xy: rssVerify, colour: green, shape: draw.TriangleGlyph{}},
		{name: "import, packfiles", xy: rssImport, colour: purple, shape: draw.PyramidGlyph{}},
		{name: "replay, PostgreSQL", xy: rssPG, colour: orange, shape: draw.SquareGlyph{}},
		{name: "mtxdb gen of the same room", xy: rssGen, colour: grey, dashes: dashed, shape: draw.CrossGlyph{}},
		{name: "target at 1M: replay 1,000 MB", y: targetReplayMB, colour: red, dashes: dashed},
		{name: "target at 1M: verify and import 2,000 MB", y: targetOtherPeakMB, colour: red, dashes: dotted},
		{name: "published: Dendrite loading Matrix HQ's state", y: anchorDendriteMB, colour: grey, dashes: dotted},
	}
	left, err := roomPanel("Speed", "events per second", events, speed)
	if err != nil {
		return err
	}
	right, err := roomPanel("Peak memory", "peak RSS (MB)", events, memory)
	if err != nil {
		return err
	}
	title := fmt.Sprintf("mtxdb replay of generated rooms (seed 1), %s, commit %s", rep.Machine, rep.Commit)
	return savePanels(path, title, []panel{left, right})
}

// panel is a plot and the legend drawn under it (rows entries).
type panel struct {
	p      *plot.Plot
	legend plot.Legend
	rows   int
}

// roomPanel is one panel of replay.png: the series against the room's size, both
// axes on whole decades, and the legend that savePanels draws under it.
func roomPanel(title, ylabel string, events []float64, ss []series) (panel, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "events in the room (log scale)"
	p.Y.Label.Text = ylabel + " (log scale)"
	barplot.Grid(p, true)
	var ys []float64
	for _, s := range ss {
		ys = append(ys, s.y)
		for _, pt := range s.xy {
			ys = append(ys, pt.Y)
		}
	}
	barplot.LogRange(&p.X, true, events...)
	barplot.LogRange(&p.Y, false, ys...)
	out := panel{p: p, legend: plot.NewLegend()}
	for _, s := range ss {
		xy := s.xy
		if s.y > 0 {
			xy = plotter.XYs{{X: p.X.Min, Y: s.y}, {X: p.X.Max, Y: s.y}}
		}
		if len(xy) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(xy)
		if err != nil {
			return out, err
		}
		out.rows++
		l.Color, l.Dashes, l.Width = s.colour, s.dashes, vg.Points(1.2)
		if s.shape == nil {
			p.Add(l)
			out.legend.Add(s.name, l)
			continue
		}
		pts.Color, pts.Shape, pts.Radius = s.colour, s.shape, vg.Points(3.5)
		if len(xy) == 1 {
			p.Add(pts)
		} else {
			p.Add(l, pts)
		}
		out.legend.Add(s.name, l, pts)
	}
	return out, nil
}

// savePanels writes panels side by side under a title, each with its legend in a
// strip of its own beneath it, as a PNG.
func savePanels(path, title string, panels []panel) error {
	const w, h = 12 * vg.Inch, 6.5 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	ts := panels[0].p.Title.TextStyle
	ts.Font.Size = vg.Points(13)
	ts.XAlign, ts.YAlign = draw.XCenter, draw.YTop
	dc.FillText(ts, vg.Point{X: w / 2, Y: h - vg.Millimeter*3}, title)
	rows := 0
	for _, pn := range panels {
		rows = max(rows, pn.rows)
	}
	strip := vg.Length(rows)*panels[0].legend.TextStyle.Height(" ") + vg.Millimeter*4
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Millimeter * 10, PadTop: vg.Millimeter * 10,
		PadBottom: strip, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 5}
	for i, pn := range panels {
		c := tiles.At(dc, i, 0)
		pn.p.Draw(c)
		l := pn.legend
		l.Top, l.Left = true, true
		l.Draw(draw.Canvas{Canvas: dc, Rectangle: vg.Rectangle{
			Min: vg.Point{X: c.Min.X + vg.Millimeter*8, Y: dc.Min.Y + vg.Millimeter*2},
			Max: vg.Point{X: c.Max.X, Y: c.Min.Y - vg.Millimeter*2}}})
	}
	return barplot.WritePNG(img, path)
}

// verdicts states the replay targets (docs/benchmarks.md: rates at 100k and
// 1M, per-event cost, peak RSS of replay, verify, import and gen, import rate,
// mismatches, PDUs parsed) as met or NOT met for the rooms
// this run measured (a target whose rooms were not in the run is left out); the
// 100k room's replay/gen ratio follows as information.
func verdicts(rep report) string {
	find := func(ver string, events int) *result {
		for i := range rep.Rooms {
			if r := &rep.Rooms[i]; r.Version == ver && r.Events == events {
				return r
			}
		}
		return nil
	}
	var b strings.Builder
	b.WriteString("\n## Targets\n\n")
	k100, m1 := find("12", 100_000), find("12", 1_000_000)
	if k100 != nil {
		fmt.Fprintf(&b, "- v12 100k: replay at least %s events/s (wall): %s, %s.\n", thousands(target100kPerS), thousands(k100.EventsPerS), met(k100.EventsPerS >= target100kPerS))
	}
	if m1 != nil {
		fmt.Fprintf(&b, "- v12 1M: replay at least %s events/s (wall): %s, %s.\n", thousands(target1MPerS), thousands(m1.EventsPerS), met(m1.EventsPerS >= target1MPerS))
	}
	if k100 != nil && m1 != nil {
		wall := (m1.Replay.Wall / float64(m1.Events)) / (k100.Replay.Wall / float64(k100.Events))
		cpu := (m1.Replay.CPU / float64(m1.Events)) / (k100.Replay.CPU / float64(k100.Events))
		if iv := rep.Interleaved; iv != nil && iv.Small == "12:100000" && iv.Large == "12:1000000" && len(iv.WallRatios) > 0 {
			mw, mc := median(iv.WallRatios), median(iv.CPURatios)
			fmt.Fprintf(&b, "- Per-event replay cost at 1M at most %.2fx that at 100k, side by side (median of %d interleaved pairs, below): wall %.2fx, CPU %.2fx: %s (both must hold). From the rooms' rows, run up to half an hour apart: wall %.2fx, CPU %.2fx.\n",
				targetPerEventCost, len(iv.WallRatios), mw, mc, met(mw <= targetPerEventCost && mc <= targetPerEventCost), wall, cpu)
		} else {
			fmt.Fprintf(&b, "- Per-event replay cost at 1M at most %.2fx that at 100k, from the rooms' rows (no side-by-side replays in this run; the rows can be half an hour apart): wall %.2fx, CPU %.2fx: %s (both must hold).\n",
				targetPerEventCost, wall, cpu, met(wall <= targetPerEventCost && cpu <= targetPerEventCost))
		}
	}
	if m1 != nil {
		peak := m1.Replay.PeakMB
		if iv := rep.Interleaved; iv != nil && iv.Large == "12:1000000" {
			peak = max(peak, iv.largePeakMB())
		}
		fmt.Fprintf(&b, "- v12 1M: replay peak RSS at most %s MB (every 1M replay of the run): %s MB, %s.\n", thousands(targetReplayMB), thousands(peak), met(peak <= targetReplayMB))
		imp := float64(m1.Events) / m1.Import.Wall
		fmt.Fprintf(&b, "- v12 1M: import at least %s events/s (events / import wall): %s, %s.\n", thousands(targetImportPerS), thousands(imp), met(imp >= targetImportPerS))
		fmt.Fprintf(&b, "- v12 1M: `mtxdb gen` peak RSS at most %s MB: %s MB, %s.\n", thousands(targetGenMB), thousands(m1.Gen.PeakMB), met(m1.Gen.PeakMB <= targetGenMB))
	}
	b.WriteString(everywhere(rep.Rooms))
	if m1 != nil {
		fmt.Fprintf(&b, "- v12 1M: verify --expected and import peak RSS at most %s MB: verify %s MB, import %s MB, %s.\n",
			thousands(targetOtherPeakMB), thousands(m1.Verify.PeakMB), thousands(m1.Import.PeakMB), met(max(m1.Verify.PeakMB, m1.Import.PeakMB) <= targetOtherPeakMB))
	}
	if k100 != nil {
		fmt.Fprintf(&b, "\nInformation (no longer a target): the v12 100k replay took %.2fx its generation's wall time and %.2fx its CPU.\n",
			k100.ReplayByGen, k100.Replay.CPU/k100.genBase().CPU)
	}
	b.WriteString("\nThe load average is the machine's, not this run's: other work beside it inflates wall times (CPU less so).\n")
	return b.String()
}

// met is a verdict's word.
func met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// everywhere states the targets every room must meet: verify --expected found
// 0 mismatches (on PostgreSQL too where the room ran there), and replay parsed
// as many PDUs as the room has events. A count the command did not print (-1) is
// not met.
func everywhere(rooms []result) string {
	if len(rooms) == 0 {
		return ""
	}
	var b strings.Builder
	var bad []string
	runs := 0
	for _, r := range rooms {
		runs++
		if r.Mismatches != 0 {
			bad = append(bad, fmt.Sprintf("v%s %d on packfiles: %s", r.Version, r.Events, count(r.Mismatches)))
		}
		if pg := r.Postgres; pg != nil {
			runs++
			if pg.Mismatches != 0 {
				bad = append(bad, fmt.Sprintf("v%s %d on PostgreSQL: %s", r.Version, r.Events, count(pg.Mismatches)))
			}
		}
	}
	fmt.Fprintf(&b, "- 0 mismatches everywhere (verify --expected runs: %d): %s", runs, failures(bad))
	bad = bad[:0]
	for _, r := range rooms {
		if r.PDUsParsed != r.Events {
			bad = append(bad, fmt.Sprintf("v%s %d: %s PDUs parsed for %d events", r.Version, r.Events, count(r.PDUsParsed), r.Events))
		}
	}
	fmt.Fprintf(&b, "- PDUs parsed equal to events in every room (replay parses each PDU once): %s", failures(bad))
	return b.String()
}

// failures ends a verdict line on the runs that failed it: "met." when none did.
func failures(bad []string) string {
	if len(bad) == 0 {
		return "met.\n"
	}
	return strings.Join(bad, "; ") + ", NOT met.\n"
}

// count renders a count a command printed, "not printed" for -1 (cmdrun.Field's
// absent).
func count(n int) string {
	if n < 0 {
		return "not printed"
	}
	return strconv.Itoa(n)
}
