package main

import (
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/mtxdb/mtxdb/bench/internal/cmdrun"
)

// interleaved is the per-event cost ratio measured side by side: replays of
// the small and the large room (-ratio-rooms), each on a store imported afresh
// for it, in the order small, large, small, ..., large, small, with no profiler.
// Each large replay is set against the mean of the small replays just before and
// just after it, so that the machine's drift between the rooms' rows of the run
// (half an hour apart at 1M, as the 1M room's generation runs in between) does
// not enter the ratio.
type interleaved struct {
	Small string `json:"small"` // VERSION:EVENTS
	Large string `json:"large"`
	// Runs are the replays in the order they ran (Events says which room).
	Runs []interleavedRun `json:"runs"`
	// WallRatios and CPURatios hold, per large replay, its per-event wall (CPU)
	// time over the mean per-event time of the small replays around it.
	WallRatios []float64 `json:"wall_ratios"`
	CPURatios  []float64 `json:"cpu_ratios"`
}

// interleavedRun is one replay of the interleaved measurement.
type interleavedRun struct {
	Events int  `json:"events"`
	Replay step `json:"replay"`
}

// roomSpec is a -rooms entry parsed: room version and events.
type roomSpec struct {
	ver    string
	events int
}

func parseRoomSpec(s string) (roomSpec, error) {
	ver, n, ok := strings.Cut(s, ":")
	events, err := strconv.Atoi(n)
	switch {
	case !ok || err != nil:
		return roomSpec{}, fmt.Errorf("%q is not VERSION:EVENTS", s)
	case events <= 0:
		return roomSpec{}, fmt.Errorf("%q: the events must be a positive number", s)
	case ver != "10" && ver != "11" && ver != "12":
		return roomSpec{}, fmt.Errorf("%q: room version %q is not one mtxdb gen generates (10, 11, 12)", s, ver)
	}
	return roomSpec{ver, events}, nil
}

func (r roomSpec) String() string { return r.ver + ":" + strconv.Itoa(r.events) }

// roomDir is where measure keeps a room's generated directory.
func roomDir(work string, r roomSpec) string {
	return filepath.Join(work, fmt.Sprintf("v%s-%d", r.ver, r.events)) + "-room"
}

// measureInterleaved runs pairs large replays between pairs+1 small ones, each
// on a fresh import of the room measure generated in work.
func measureInterleaved(bin, work string, small, large roomSpec, pairs int) (*interleaved, error) {
	out := &interleaved{Small: small.String(), Large: large.String()}
	replay := func(r roomSpec) (float64, float64, error) {
		store := filepath.Join(work, "interleaved-store")
		os.RemoveAll(store)
		defer os.RemoveAll(store)
		if _, err := cmdrun.Run(bin, "import", "--store", store, roomDir(work, r)); err != nil {
			return 0, 0, err
		}
		st, err := cmdrun.Run(bin, "replay", "--store", store)
		if err != nil {
			return 0, 0, err
		}
		out.Runs = append(out.Runs, interleavedRun{Events: r.events, Replay: st})
		log.Printf("interleaved: v%s %d events: replay %.1f s, %.1f s CPU, %.0f MB", r.ver, r.events, st.Wall, st.CPU, st.PeakMB)
		return st.Wall / float64(r.events), st.CPU / float64(r.events), nil
	}
	prevWall, prevCPU, err := replay(small)
	if err != nil {
		return nil, err
	}
	for range pairs {
		wall, cpu, err := replay(large)
		if err != nil {
			return nil, err
		}
		nextWall, nextCPU, err := replay(small)
		if err != nil {
			return nil, err
		}
		out.WallRatios = append(out.WallRatios, wall/((prevWall+nextWall)/2))
		out.CPURatios = append(out.CPURatios, cpu/((prevCPU+nextCPU)/2))
		prevWall, prevCPU = nextWall, nextCPU
	}
	return out, nil
}

// median returns the median of vs (the mean of the middle two for an even
// count), 0 for none.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(vs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// largePeakMB is the largest peak RSS of the large room's interleaved replays.
func (iv *interleaved) largePeakMB() float64 {
	large, err := parseRoomSpec(iv.Large)
	if err != nil {
		return 0
	}
	peak := 0.0
	for _, r := range iv.Runs {
		if r.Events == large.events {
			peak = max(peak, r.Replay.PeakMB)
		}
	}
	return peak
}

// section describes the interleaved replays in replay.md.
func (iv *interleaved) section() string {
	if iv == nil || len(iv.WallRatios) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## Per-event cost, side by side\n\n")
	small, large := roomName(iv.Small), roomName(iv.Large)
	fmt.Fprintf(&b, "After the rooms above, the run replayed the %s and %s rooms again in turn (the %s room first and last, each replay on a store imported afresh for it, no profiler), and set each large replay's per-event time against the mean of the small replays just before and after it. The rooms' rows above can be far apart in time (in the default set half an hour: the 1M room's generation runs between them), and the measuring VM's speed drifts by 15-25%% within an hour; the ratio of neighbouring runs does not carry that drift.\n\n",
		small, large, small)
	b.WriteString("| order | room events | replay wall | replay CPU | peak RSS |\n|---:|---:|---:|---:|---:|\n")
	for i, r := range iv.Runs {
		fmt.Fprintf(&b, "| %d | %s | %.3f s | %.3f s | %.0f MB |\n", i+1, thousands(float64(r.Events)), r.Replay.Wall, r.Replay.CPU, r.Replay.PeakMB)
	}
	fmt.Fprintf(&b, "\nPer-event cost of each large replay over its neighbours': wall %s (median %.2fx), CPU %s (median %.2fx).\n",
		ratioList(iv.WallRatios), median(iv.WallRatios), ratioList(iv.CPURatios), median(iv.CPURatios))
	return b.String()
}

func ratioList(vs []float64) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprintf("%.2fx", v)
	}
	return strings.Join(s, ", ")
}

// runPlan is what a run measures, from its flags, checked before anything
// runs: the rooms in order, those also run on PostgreSQL, and the interleaved
// pair (pairs 0: none).
type runPlan struct {
	rooms, pg    []roomSpec
	small, large roomSpec
	pairs        int
}

// parseRoomList parses a comma-separated list of VERSION:EVENTS (spaces around
// entries allowed; empty: none); flagName names the flag in errors.
func parseRoomList(flagName, list string) ([]roomSpec, error) {
	var out []roomSpec
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	for _, f := range strings.Split(list, ",") {
		r, err := parseRoomSpec(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%s: %w (entries are VERSION:EVENTS, separated by commas)", flagName, err)
		}
		if slices.Contains(out, r) {
			return nil, fmt.Errorf("%s: %s is listed twice", flagName, r)
		}
		out = append(out, r)
	}
	return out, nil
}

// planRun checks the flags: every room parses and is listed once, the
// PostgreSQL rooms (with a server) and the ratio rooms (with pairs > 0) are
// among the rooms, the ratio's small room has fewer events than its large.
func planRun(rooms, ratioRooms string, pairs int, pgRooms string, withPG bool) (runPlan, error) {
	var p runPlan
	var err error
	if p.rooms, err = parseRoomList("-rooms", rooms); err != nil {
		return p, err
	}
	if len(p.rooms) == 0 {
		return p, fmt.Errorf("-rooms: no room given")
	}
	if withPG {
		if p.pg, err = parseRoomList("-postgres-rooms", pgRooms); err != nil {
			return p, err
		}
		for _, r := range p.pg {
			if !slices.Contains(p.rooms, r) {
				return p, fmt.Errorf("-postgres-rooms: %s is not among -rooms (%s)", r, rooms)
			}
		}
	}
	if pairs < 0 {
		return p, fmt.Errorf("-ratio-pairs: %d is negative (0: no interleaved replays)", pairs)
	}
	if pairs == 0 {
		return p, nil
	}
	pair, err := parseRoomList("-ratio-rooms", ratioRooms)
	if err != nil {
		return p, err
	}
	if len(pair) != 2 {
		return p, fmt.Errorf("-ratio-rooms: %q names %d rooms, not two (SMALL,LARGE; or -ratio-pairs 0)", ratioRooms, len(pair))
	}
	p.small, p.large, p.pairs = pair[0], pair[1], pairs
	if p.small.events >= p.large.events {
		return p, fmt.Errorf("-ratio-rooms: %q: the small room (first) must have fewer events than the large", ratioRooms)
	}
	for _, r := range pair {
		if !slices.Contains(p.rooms, r) {
			return p, fmt.Errorf("-ratio-rooms: %s is not among -rooms (%s); give both rooms there, or -ratio-pairs 0", r, rooms)
		}
	}
	return p, nil
}

// roomName renders a VERSION:EVENTS room as "v12 100,000-event".
func roomName(spec string) string {
	r, err := parseRoomSpec(spec)
	if err != nil {
		return spec
	}
	return "v" + r.ver + " " + thousands(float64(r.events)) + "-event"
}
