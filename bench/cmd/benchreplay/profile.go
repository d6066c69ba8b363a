package main

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/google/pprof/profile"
)

// The phases a sample of the replay's CPU profile is put in, in the order the
// profile summary lists them.
const (
	phaseResolution  = "state resolution"
	phaseAuthorize   = "authorisation on the replay goroutine"
	phaseSnapshot    = "snapshot writes"
	phasePrefetch    = "PDU parsing and checks ahead"
	phaseWriteBehind = "store writes behind"
	phaseGC          = "garbage collection"
	phaseOther       = "other"
)

// phaseOrder is the order of profileSummary.Phases.
var phaseOrder = []string{phaseResolution, phaseAuthorize, phaseSnapshot, phasePrefetch, phaseWriteBehind, phaseGC, phaseOther}

// modulePath prefixes the project's function names in a profile; the
// summary's tables leave it out.
const modulePath = "github.com/mtxdb/mtxdb/"

// computeFunc is the replay goroutine's work on one event; the summary's top
// functions are those on the stack under it.
const computeFunc = modulePath + "resolver.(*replay).compute"

// phaseFuncs are the functions that put a sample in a phase: the outermost of
// them on the sample's stack (the one nearest the goroutine's start) decides.
// So Apply called by resolve is state resolution, and Apply called by compute
// a snapshot write.
var phaseFuncs = map[string]string{
	modulePath + "resolver.(*roomResolver).resolve":     phaseResolution,
	modulePath + "resolver.(*roomResolver).authorize":   phaseAuthorize,
	modulePath + "roomstate.(*StateWriter).Apply":       phaseSnapshot,
	modulePath + "resolver.(*replay).prefetch.func1":    phasePrefetch,
	modulePath + "roomstate.(*writeBehind).flush.func1": phaseWriteBehind,
}

// gcFuncs are the runtime's garbage-collection work: a sample with one of them
// anywhere on its stack is garbage collection, whatever goroutine it ran on
// (an allocation's assist or sweep on the replay goroutine included).
var gcFuncs = map[string]bool{
	"runtime.gcBgMarkWorker":    true,
	"runtime.gcAssistAlloc":     true,
	"runtime.gcAssistAlloc1":    true,
	"runtime.gcStart":           true,
	"runtime.gcMarkDone":        true,
	"runtime.gcMarkTermination": true,
	"runtime.bgsweep":           true,
	"runtime.sweepone":          true,
}

// topCompute is how many functions under compute the summary lists.
const topCompute = 8

// profileSummary is what the measured replay's CPU profile says of one room.
type profileSummary struct {
	Samples int64   `json:"samples"`
	CPU     float64 `json:"cpu_s"` // the CPU time the samples stand for
	// Phases holds every phase of phaseOrder, in that order, with its share of
	// the samples' CPU time.
	Phases []share `json:"phases"`
	// Compute is the share of the CPU time whose stack holds compute;
	// ComputeTop the functions under it with the largest cumulative CPU time.
	Compute    float64 `json:"compute_share"`
	ComputeTop []share `json:"compute_top"`
}

// share is a phase's or a function's part of a profile's CPU time.
type share struct {
	Name  string  `json:"name"`
	Share float64 `json:"share"` // of all the profile's CPU time
	// OfCompute is a function's share of the CPU time under compute (zero for
	// a phase).
	OfCompute float64 `json:"share_of_compute,omitempty"`
}

// readProfile parses the CPU profile at path and summarises it.
func readProfile(path string) (*profileSummary, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return summarize(p), nil
}

// stackFuncs names the functions of a sample's stack from the leaf out, the
// functions inlined into a frame before that frame's own.
func stackFuncs(s *profile.Sample) []string {
	var out []string
	for _, loc := range s.Location {
		for _, ln := range loc.Line {
			if ln.Function != nil {
				out = append(out, ln.Function.Name)
			}
		}
	}
	return out
}

// classify is the phase of a stack (function names from the leaf out):
// garbage collection when a gcFuncs function is on it, else the phase of its
// outermost phaseFuncs function, else other.
func classify(stack []string) string {
	phase := phaseOther
	for _, fn := range stack {
		if gcFuncs[fn] {
			return phaseGC
		}
		if p, ok := phaseFuncs[fn]; ok {
			phase = p // a later match is further out
		}
	}
	return phase
}

// summarize weighs each sample by its CPU time (the "cpu" sample type; the last
// type in a profile without one) and adds it to its phase and, when compute is on
// its stack, to compute and once to each distinct function under it.
func summarize(p *profile.Profile) *profileSummary {
	cpuIdx, countIdx := len(p.SampleType)-1, -1
	for i, st := range p.SampleType {
		switch st.Type {
		case "cpu":
			cpuIdx = i
		case "samples":
			countIdx = i
		}
	}
	var total, compute int64
	phases := map[string]int64{}
	under := map[string]int64{}
	sum := &profileSummary{}
	for _, s := range p.Sample {
		if cpuIdx < 0 || cpuIdx >= len(s.Value) {
			continue
		}
		v := s.Value[cpuIdx]
		if countIdx >= 0 {
			sum.Samples += s.Value[countIdx]
		}
		total += v
		stack := stackFuncs(s)
		phases[classify(stack)] += v
		at := slices.Index(stack, computeFunc)
		if at < 0 {
			continue
		}
		compute += v
		seen := map[string]bool{}
		for _, fn := range stack[:at] {
			if !seen[fn] {
				seen[fn] = true
				under[fn] += v
			}
		}
	}
	sum.CPU = float64(total) / 1e9
	frac := func(v, of int64) float64 {
		if of == 0 {
			return 0
		}
		return float64(v) / float64(of)
	}
	for _, ph := range phaseOrder {
		sum.Phases = append(sum.Phases, share{Name: ph, Share: frac(phases[ph], total)})
	}
	sum.Compute = frac(compute, total)
	fns := make([]string, 0, len(under))
	for fn := range under {
		fns = append(fns, fn)
	}
	slices.SortFunc(fns, func(a, b string) int { return cmp.Or(cmp.Compare(under[b], under[a]), strings.Compare(a, b)) })
	for _, fn := range fns[:min(topCompute, len(fns))] {
		sum.ComputeTop = append(sum.ComputeTop, share{Name: fn, Share: frac(under[fn], total), OfCompute: frac(under[fn], compute)})
	}
	return sum
}

// profileSection is replay.md's "Profile summary": how samples are put in
// phases, then per room its phases and compute's top functions ("—" for a room
// whose replay.json has no profile).
func profileSection(rep report) string {
	var b strings.Builder
	b.WriteString("\n## Profile summary\n\n")
	b.WriteString("From the CPU profile of each room's measured replay (`mtxdb replay --cpuprofile`, Go's profiler at its default 100 Hz; the profile files stay in the work directory, not here), where this replay.json has one (—: none, a run from before the harness profiled the replay). ")
	b.WriteString("Each sample is weighed by its CPU time and put in one phase: garbage collection when a GC function of the runtime is on its stack (`runtime.gcBgMarkWorker`, `gcAssistAlloc`, `gcAssistAlloc1`, `gcStart`, `gcMarkDone`, `gcMarkTermination`, `bgsweep`, `sweepone`: an allocation's assist or sweep counts here whatever goroutine made it); ")
	b.WriteString("otherwise the outermost (nearest the goroutine's start) of these functions on its stack decides: `resolver.(*roomResolver).resolve` state resolution, `resolver.(*roomResolver).authorize` authorisation on the replay goroutine, `roomstate.(*StateWriter).Apply` snapshot writes (so Apply under resolve is state resolution), `resolver.(*replay).prefetch.func1` PDU parsing and checks ahead, `roomstate.(*writeBehind).flush.func1` store writes behind; none of them: other. ")
	b.WriteString("The top functions are those on the stack under `resolver.(*replay).compute` (the replay goroutine's work on one event) with the largest cumulative CPU time, each counted once per sample.\n")
	for _, r := range rep.Rooms {
		fmt.Fprintf(&b, "\n### Profile summary: v%s, %s events\n\n", r.Version, thousands(float64(r.Events)))
		ps := r.Profile
		if ps == nil {
			b.WriteString("—\n")
			continue
		}
		fmt.Fprintf(&b, "%s samples, %.1f s of CPU (the replay's rusage: %.1f s).\n\n", thousands(float64(ps.Samples)), ps.CPU, r.Replay.CPU)
		b.WriteString("| phase | share of CPU samples |\n|---|---:|\n")
		for _, ph := range ps.Phases {
			fmt.Fprintf(&b, "| %s | %.1f%% |\n", ph.Name, 100*ph.Share)
		}
		fmt.Fprintf(&b, "\n`resolver.(*replay).compute` is on the stack of %.1f%% of the CPU samples; under it:\n\n", 100*ps.Compute)
		b.WriteString("| function | share of all CPU samples | share of compute's |\n|---|---:|---:|\n")
		for _, fn := range ps.ComputeTop {
			fmt.Fprintf(&b, "| `%s` | %.1f%% | %.1f%% |\n", strings.TrimPrefix(fn.Name, modulePath), 100*fn.Share, 100*fn.OfCompute)
		}
	}
	return b.String()
}
