package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/pprof/profile"
)

// syntheticProfile is a CPU profile of hand-made stacks (leaf first), each
// sample worth its weight in 10 ms ticks. The last frame of a stack may hold
// several functions, the first inlined into the others.
func syntheticProfile(samples []struct {
	stack  [][]string
	weight int64
}) *profile.Profile {
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"},
		Period:     10_000_000,
	}
	funcs := map[string]*profile.Function{}
	fn := func(name string) *profile.Function {
		if f, ok := funcs[name]; ok {
			return f
		}
		f := &profile.Function{ID: uint64(len(funcs) + 1), Name: name}
		funcs[name] = f
		p.Function = append(p.Function, f)
		return f
	}
	for _, s := range samples {
		var locs []*profile.Location
		for _, frame := range s.stack {
			loc := &profile.Location{ID: uint64(len(p.Location) + 1)}
			for _, name := range frame {
				loc.Line = append(loc.Line, profile.Line{Function: fn(name)})
			}
			p.Location = append(p.Location, loc)
			locs = append(locs, loc)
		}
		p.Sample = append(p.Sample, &profile.Sample{Location: locs, Value: []int64{s.weight, s.weight * 10_000_000}})
	}
	return p
}

func TestPhaseClassification(t *testing.T) {
	const m = modulePath
	compute := []string{computeFunc}
	resolve := []string{m + "resolver.(*roomResolver).resolve"}
	authorize := []string{m + "resolver.(*roomResolver).authorize"}
	apply := []string{m + "roomstate.(*StateWriter).Apply"}
	goroutine := []string{m + "resolver.(*roomResolver).Replay", m + "cmd.replay", "runtime.main"}
	frames := func(fs ...[]string) [][]string {
		var out [][]string
		for _, f := range fs {
			for _, name := range f {
				out = append(out, []string{name})
			}
		}
		return out
	}
	p := syntheticProfile([]struct {
		stack  [][]string
		weight int64
	}{
		// Apply under resolve: state resolution, not a snapshot write.
		{frames([]string{"hamtstore.Apply"}, apply, resolve, []string{m + "resolver.(*roomResolver).resolveSnapshots"}, compute, goroutine), 40},
		{frames(authorize, compute, goroutine), 10},
		{frames([]string{"hamtstore.Apply"}, apply, compute, goroutine), 5},
		// A GC assist under resolve is garbage collection.
		{frames([]string{"runtime.gcAssistAlloc1", "runtime.gcAssistAlloc", "runtime.mallocgc"}, resolve, compute, goroutine), 5},
		{frames([]string{"runtime.scanobject", "runtime.gcDrain", "runtime.gcBgMarkWorker"}), 10},
		{frames([]string{"encoding/json.Unmarshal", m + "pdu.Parse", m + "resolver.(*replay).prefetch.func1"}), 15},
		{frames([]string{"syscall.Write", m + "roomstate.(*writeBehind).flush.func1"}), 10},
		// Parsing on the replay goroutine, inlined into compute: other.
		{[][]string{{m + "pdu.Parse", m + "resolver.(*roomResolver).pdu", computeFunc}, {goroutine[0]}}, 5},
	})
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Write(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	sum, err := readProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Samples != 100 || math.Abs(sum.CPU-1.0) > 1e-9 {
		t.Fatalf("samples %d, CPU %v: want 100 and 1 s", sum.Samples, sum.CPU)
	}
	want := map[string]float64{phaseResolution: 0.40, phaseAuthorize: 0.10, phaseSnapshot: 0.05, phasePrefetch: 0.15, phaseWriteBehind: 0.10, phaseGC: 0.15, phaseOther: 0.05}
	if len(sum.Phases) != len(phaseOrder) {
		t.Fatalf("phases %+v: want every one of %v", sum.Phases, phaseOrder)
	}
	for i, ph := range sum.Phases {
		if ph.Name != phaseOrder[i] || math.Abs(ph.Share-want[ph.Name]) > 1e-9 {
			t.Errorf("phase %d: %+v, want %s at %.2f", i, ph, phaseOrder[i], want[phaseOrder[i]])
		}
	}
	if math.Abs(sum.Compute-0.65) > 1e-9 {
		t.Errorf("compute share %v, want 0.65", sum.Compute)
	}
	// Under compute: resolve 45 (40 + the assist's 5), Apply 45, hamtstore.Apply 45,
	// resolveSnapshots 40, authorize 10, ...; compute itself and its callers are not listed.
	if len(sum.ComputeTop) != topCompute {
		t.Fatalf("compute top %+v: want %d functions", sum.ComputeTop, topCompute)
	}
	top := sum.ComputeTop[0]
	if top.Name != m+"resolver.(*roomResolver).resolve" || math.Abs(top.Share-0.45) > 1e-9 || math.Abs(top.OfCompute-45.0/65) > 1e-9 {
		t.Errorf("top function %+v, want resolve at 0.45 (45/65 of compute; first by name of the three at 45)", top)
	}
	for _, s := range sum.ComputeTop {
		if s.Name == computeFunc || s.Name == goroutine[0] {
			t.Errorf("compute top lists %s, which is not under compute", s.Name)
		}
	}
	md := profileSection(report{Rooms: []result{{Version: "12", Events: 100_000, Profile: sum}, {Version: "10", Events: 100_000}}})
	for _, s := range []string{"### Profile summary: v12, 100,000 events", "| state resolution | 40.0% |", "| `roomstate.(*StateWriter).Apply` | 45.0% | 69.2% |", "| `resolver.(*roomResolver).authorize` | 10.0% | 15.4% |", "### Profile summary: v10, 100,000 events\n\n—\n"} {
		if !strings.Contains(md, s) {
			t.Errorf("profile section lacks %q:\n%s", s, md)
		}
	}
}
