package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/mtxdb/mtxdb/pdu"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/testrooms/gen"
)

// benchResolverCmd measures state resolution over a generated room: ours during a
// replay (per resolution: conflicted keys, auth difference, events loaded, nodes
// read, time) and, side by side on a sample of the same merges, the naive path a
// Dendrite-style server takes (load the whole state maps and hand every state event
// and the auth chains to gomatrixserverlib's ResolveConflicts).
func benchResolverCmd() *cobra.Command {
	opts := gen.DefaultOptions()
	opts.Events, opts.Members, opts.RoomVersion = 100_000, 10_000, "10"
	var dir string
	var samples int
	c := &cobra.Command{
		Use:   "bench-resolver [--events N] [--members N] [--servers N] [--seed N] [--room-version V] [--naive-samples N] [--dir DIR]",
		Short: "Benchmark state resolution on a generated room, ours against the naive full-state path",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return benchResolver(ctx, cmd.OutOrStdout(), opts, dir, samples)
		},
	}
	f := c.Flags()
	f.IntVar(&opts.Events, "events", opts.Events, "events in the generated room")
	f.IntVar(&opts.Members, "members", opts.Members, "members the room grows towards")
	f.IntVar(&opts.Servers, "servers", opts.Servers, "simulated homeservers")
	f.Uint64Var(&opts.Seed, "seed", opts.Seed, "generator seed")
	f.StringVar(&opts.RoomVersion, "room-version", opts.RoomVersion, "room version (10, 11, 12)")
	f.IntVar(&samples, "naive-samples", 50, "merges resolved again by the naive path (evenly spaced)")
	f.StringVar(&dir, "dir", "", "work directory (default: a temporary directory, removed afterwards)")
	return c
}

func benchResolver(ctx context.Context, out io.Writer, opts gen.Options, dir string, samples int) error {
	if dir == "" {
		tmp, err := os.MkdirTemp("", "mtxdb-bench-resolver-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	roomDir := filepath.Join(dir, "room")
	t0 := time.Now()
	if _, err := gen.Generate(opts, roomDir, nil); err != nil {
		return err
	}
	fmt.Fprintf(out, "generated events=%d members=%d servers=%d room_version=%s seed=%d in %.1fs\n",
		opts.Events, opts.Members, opts.Servers, opts.RoomVersion, opts.Seed, time.Since(t0).Seconds())

	eng, st, err := openStore(filepath.Join(dir, "store"), true)
	if err != nil {
		return err
	}
	defer eng.Close()
	t0 = time.Now()
	res, err := importFile(ctx, st, filepath.Join(roomDir, "events.jsonl"), roomstate.ImportOptions{}, io.Discard)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "imported %d events in %.1fs\n", res.Imported, time.Since(t0).Seconds())
	room, err := st.Room(ctx, res.Rooms[0])
	if err != nil {
		return err
	}

	var ours []resolver.ResolutionStats
	t0 = time.Now()
	rep, err := resolver.Replay(ctx, room, resolver.ReplayOptions{OnResolve: func(s resolver.ResolutionStats) { ours = append(ours, s) }})
	if err != nil {
		return err
	}
	replayTime := time.Since(t0)
	fmt.Fprintf(out, "replayed events=%d rejected=%d resolutions=%d in %.1fs; peak RSS so far %d MiB\n",
		rep.Events, rep.Rejected, rep.Resolutions, replayTime.Seconds(), peakRSSMiB())

	// The naive path on evenly spaced merge events.
	merges, err := mergeEvents(room)
	if err != nil {
		return err
	}
	step := max(1, len(merges)/max(samples, 1))
	var naive []naiveStats
	for i := 0; i < len(merges) && len(naive) < samples; i += step {
		ns, err := naiveResolve(ctx, room, merges[i])
		if err != nil {
			return fmt.Errorf("naive path at %s: %w", merges[i], err)
		}
		naive = append(naive, ns)
	}

	fmt.Fprintf(out, "\nper resolution, ours (all %d resolutions during replay):\n\n", len(ours))
	fmt.Fprintln(out, "| metric | p50 | p90 | max |")
	fmt.Fprintln(out, "|---|---:|---:|---:|")
	row := func(name string, get func(resolver.ResolutionStats) float64) {
		v := make([]float64, len(ours))
		for i, s := range ours {
			v[i] = get(s)
		}
		fmt.Fprintf(out, "| %s | %s | %s | %s |\n", name, pct(v, 50), pct(v, 90), pct(v, 100))
	}
	row("input states", func(s resolver.ResolutionStats) float64 { return float64(s.InputStates) })
	row("conflicted keys", func(s resolver.ResolutionStats) float64 { return float64(s.ConflictedKeys) })
	row("auth difference", func(s resolver.ResolutionStats) float64 { return float64(s.AuthDifference) })
	row("full conflicted set", func(s resolver.ResolutionStats) float64 { return float64(s.FullConflicted) })
	row("events used (PDUs)", func(s resolver.ResolutionStats) float64 { return float64(s.EventsTouched) })
	row("events loaded from store", func(s resolver.ResolutionStats) float64 { return float64(s.EventsLoaded) })
	row("HAMT nodes read", func(s resolver.ResolutionStats) float64 { return float64(s.NodesRead) })
	row("time (µs)", func(s resolver.ResolutionStats) float64 { return float64(s.Duration.Microseconds()) })

	fmt.Fprintf(out, "\nnaive path on %d sampled merges (whole state maps + full auth chains to gomatrixserverlib.ResolveConflicts):\n\n", len(naive))
	fmt.Fprintln(out, "| metric | p50 | p90 | max |")
	fmt.Fprintln(out, "|---|---:|---:|---:|")
	nrow := func(name string, get func(naiveStats) float64) {
		v := make([]float64, len(naive))
		for i, s := range naive {
			v[i] = get(s)
		}
		fmt.Fprintf(out, "| %s | %s | %s | %s |\n", name, pct(v, 50), pct(v, 90), pct(v, 100))
	}
	nrow("state entries handed over", func(s naiveStats) float64 { return float64(s.stateEvents) })
	nrow("auth events handed over", func(s naiveStats) float64 { return float64(s.authEvents) })
	nrow("events loaded from store", func(s naiveStats) float64 { return float64(s.loaded) })
	nrow("time (µs)", func(s naiveStats) float64 { return float64(s.d.Microseconds()) })
	fmt.Fprintf(out, "\npeak RSS %d MiB (whole process: generation, import, replay, naive path)\n", peakRSSMiB())
	return nil
}

type naiveStats struct {
	stateEvents, authEvents, loaded int
	d                               time.Duration
}

// mergeEvents lists the events whose prev_events give two or more distinct states.
func mergeEvents(room *roomstate.Room) ([]string, error) {
	ids, err := room.EventIDs()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, id := range ids {
		m, err := room.Meta(id)
		if err != nil {
			return nil, err
		}
		if len(m.PrevEvents) < 2 {
			continue
		}
		roots := map[[16]byte]bool{}
		for _, p := range m.PrevEvents {
			r, err := room.StateAfter(p)
			if err != nil {
				return nil, err
			}
			roots[r] = true
		}
		if len(roots) > 1 {
			out = append(out, id)
		}
	}
	return out, nil
}

// naiveResolve loads the whole state after each prev_event of an event, every state
// event and the auth chains of all of them, and hands them to gomatrixserverlib.
func naiveResolve(ctx context.Context, room *roomstate.Room, eventID string) (ns naiveStats, err error) {
	start := time.Now()
	m, err := room.Meta(eventID)
	if err != nil {
		return ns, err
	}
	loaded := map[string]gomatrixserverlib.PDU{}
	load := func(id string) (gomatrixserverlib.PDU, error) {
		if p, ok := loaded[id]; ok {
			return p, nil
		}
		p, err := room.Event(id)
		if err == nil {
			loaded[id] = p
		}
		return p, err
	}
	rd := room.NewReader()
	var events []gomatrixserverlib.PDU
	for _, p := range m.PrevEvents {
		root, err := room.StateAfter(p)
		if err != nil {
			return ns, err
		}
		entries, err := room.State(ctx, rd, root)
		if err != nil {
			return ns, err
		}
		for _, id := range entries {
			pdu, err := load(id)
			if err != nil {
				return ns, err
			}
			events = append(events, pdu)
		}
	}
	var auth []gomatrixserverlib.PDU
	seen := map[string]bool{}
	stack := make([]string, 0, len(events))
	for _, e := range events {
		stack = append(stack, e.AuthEventIDs()...)
	}
	for len(stack) > 0 {
		id := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[id] {
			continue
		}
		seen[id] = true
		p, err := load(id)
		if err != nil {
			return ns, err
		}
		auth = append(auth, p)
		stack = append(stack, p.AuthEventIDs()...)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("gomatrixserverlib panicked: %v", r)
		}
	}()
	if _, err := gomatrixserverlib.ResolveConflicts(gomatrixserverlib.RoomVersion(room.Head().RoomVersion), events, auth, pdu.UserIDForSender,
		func(string) bool { return false }); err != nil {
		return ns, err
	}
	return naiveStats{stateEvents: len(events), authEvents: len(auth), loaded: len(loaded), d: time.Since(start)}, nil
}

func pct(v []float64, p int) string {
	if len(v) == 0 {
		return "-"
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := (len(s) - 1) * p / 100
	return fmt.Sprintf("%.0f", s[i])
}

// peakRSSMiB is this process's peak resident set size (getrusage, Linux KiB).
func peakRSSMiB() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return ru.Maxrss / 1024
}
