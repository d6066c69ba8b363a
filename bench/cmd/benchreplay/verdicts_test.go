package main

import (
	"strings"
	"testing"
)

// verdictReport is a made-up run: the 100k room meets its targets, the 1M room
// misses every one of its own, and a PostgreSQL verification found a mismatch.
func verdictReport() report {
	k100 := result{Version: "12", Events: 100_000, EventsPerS: 16_000, PDUsParsed: 100_000,
		Replay: step{Wall: 6.25, CPU: 10}, Gen: step{Wall: 20, CPU: 25}, ReplayByGen: 0.31}
	k100.Postgres = &pgRun{Mismatches: 1}
	m1 := result{Version: "12", Events: 1_000_000, EventsPerS: 9_000, PDUsParsed: 1_000_100,
		Replay: step{Wall: 111, CPU: 130, PeakMB: 1_200}, Import: step{Wall: 50, PeakMB: 2_100},
		Gen: step{PeakMB: 3_500}, Verify: step{PeakMB: 900}, Mismatches: -1}
	return report{Rooms: []result{{Version: "12", Events: 10_000, PDUsParsed: 10_000}, k100, m1}}
}

func TestVerdicts(t *testing.T) {
	got := verdicts(verdictReport())
	for _, want := range []string{
		"- v12 100k: replay at least 15,000 events/s (wall): 16,000, met.\n",
		"- v12 1M: replay at least 10,000 events/s (wall): 9,000, NOT met.\n",
		// wall per event 111 µs over 62.5 µs, CPU 130 µs over 100 µs
		"- Per-event replay cost at 1M at most 1.15x that at 100k, from the rooms' rows (no side-by-side replays in this run; the rows can be half an hour apart): wall 1.78x, CPU 1.30x: NOT met",
		"- v12 1M: replay peak RSS at most 1,000 MB (every 1M replay of the run): 1,200 MB, NOT met.\n",
		"- v12 1M: import at least 25,000 events/s (events / import wall): 20,000, NOT met.\n",
		"- v12 1M: `mtxdb gen` peak RSS at most 3,000 MB: 3,500 MB, NOT met.\n",
		"- 0 mismatches everywhere (verify --expected runs: 4): v12 100000 on PostgreSQL: 1; v12 1000000 on packfiles: not printed, NOT met.\n",
		"- PDUs parsed equal to events in every room (replay parses each PDU once): v12 1000000: 1000100 PDUs parsed for 1000000 events, NOT met.\n",
		"verify 900 MB, import 2,100 MB, NOT met.\n",
		"Information (no longer a target): the v12 100k replay took 0.31x its generation's wall time and 0.40x its CPU.\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("verdicts lack %q:\n%s", want, got)
		}
	}

	rep := verdictReport()
	m1 := &rep.Rooms[2]
	rep.Rooms[1].Postgres.Mismatches = 0
	m1.EventsPerS, m1.Replay, m1.PDUsParsed, m1.Mismatches = 14_286, step{Wall: 70, CPU: 110, PeakMB: 950}, 1_000_000, 0
	m1.Import, m1.Gen.PeakMB = step{Wall: 40, PeakMB: 1_500}, 2_900
	got = verdicts(rep)
	if strings.Contains(got, "NOT met") {
		t.Errorf("every target is met, yet:\n%s", got)
	}
	if n := strings.Count(got, ", met.") + strings.Count(got, ": met.") + strings.Count(got, "met (both"); n != 9 {
		t.Errorf("%d targets met, want 9:\n%s", n, got)
	}

	// Without the 1M room its targets are left out.
	rep.Rooms = rep.Rooms[:2]
	if got = verdicts(rep); strings.Contains(got, "1M") {
		t.Errorf("a run without the 1M room states its targets:\n%s", got)
	}
}

// TestVerdictsInterleaved: with interleaved replays the per-event cost target
// reads their median ratios, and the peak RSS target every 1M replay's peak.
func TestVerdictsInterleaved(t *testing.T) {
	rep := verdictReport()
	run := func(events int, wall, cpu, mb float64) interleavedRun {
		return interleavedRun{Events: events, Replay: step{Wall: wall, CPU: cpu, PeakMB: mb}}
	}
	rep.Interleaved = &interleaved{Small: "12:100000", Large: "12:1000000",
		Runs:       []interleavedRun{run(100_000, 6, 10, 400), run(1_000_000, 66, 110, 1_300), run(100_000, 6, 10, 400)},
		WallRatios: []float64{1.12, 1.30, 1.10}, CPURatios: []float64{1.14, 1.2, 1.0}}
	got := verdicts(rep)
	for _, want := range []string{
		"side by side (median of 3 interleaved pairs, below): wall 1.12x, CPU 1.14x: met (both must hold). From the rooms' rows, run up to half an hour apart: wall 1.78x, CPU 1.30x.\n",
		"- v12 1M: replay peak RSS at most 1,000 MB (every 1M replay of the run): 1,300 MB, NOT met.\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("verdicts lack %q:\n%s", want, got)
		}
	}
	sec := rep.Interleaved.section()
	for _, want := range []string{"replayed the v12 100,000-event and v12 1,000,000-event rooms again in turn (the v12 100,000-event room first and last", "| 2 | 1,000,000 | 66.000 s | 110.000 s | 1300 MB |", "wall 1.12x, 1.30x, 1.10x (median 1.12x), CPU 1.14x, 1.20x, 1.00x (median 1.14x)"} {
		if !strings.Contains(sec, want) {
			t.Errorf("section lacks %q:\n%s", want, sec)
		}
	}
	if (*interleaved)(nil).section() != "" {
		t.Error("a run without interleaved replays has a section")
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 2, 3}, 2.5}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// TestPlanRun: flags are checked before anything is measured.
func TestPlanRun(t *testing.T) {
	p, err := planRun(" 12:10000, 12:100000,12:1000000,10:100000", "12:100000,12:1000000", 3, "12:10000", true)
	if err != nil || len(p.rooms) != 4 || p.pairs != 3 || p.small != (roomSpec{"12", 100_000}) || p.large != (roomSpec{"12", 1_000_000}) || len(p.pg) != 1 {
		t.Fatalf("default set: %+v, %v", p, err)
	}
	if p, err := planRun("12:10000", "12:100000,12:1000000", 0, "", false); err != nil || p.pairs != 0 {
		t.Errorf("no pairs: %+v, %v", p, err)
	}
	if _, err := planRun("12:10000", "12:100000,12:1000000", 0, "12:100000", false); err != nil {
		t.Errorf("PostgreSQL rooms without a server are not checked: %v", err)
	}
	for _, c := range []struct {
		rooms, ratio string
		pairs        int
		pg           string
		want         string
	}{
		{"12:500,", "", 0, "", `-rooms: "" is not VERSION:EVENTS`},
		{"12:500,12:abc", "", 0, "", `-rooms: "12:abc" is not VERSION:EVENTS`},
		{"12:500,12:500", "", 0, "", "-rooms: 12:500 is listed twice"},
		{"", "", 0, "", "-rooms: no room given"},
		{"12:0", "", 0, "", `-rooms: "12:0": the events must be a positive number`},
		{"99:500", "12:500,12:1000", 1, "", `-rooms: "99:500": room version "99" is not one mtxdb gen generates`},
		{"12:500,12:1000", "12:1000", 2, "", `-ratio-rooms: "12:1000" names 1 rooms, not two`},
		{"12:500,12:1000", "12:500,12:1000,12:2000", 2, "", "names 3 rooms"},
		{"12:500,12:1000", "12:1000,12:500", 2, "", "the small room (first) must have fewer events"},
		{"12:500,12:1000", "12:500,12:3000", 2, "", "-ratio-rooms: 12:3000 is not among -rooms"},
		{"12:500,12:1000", "10:500,12:1000", 2, "", "-ratio-rooms: 10:500 is not among -rooms"},
		{"12:500,12:1000", "", -1, "", "-ratio-pairs: -1 is negative"},
		{"12:500,12:1000", "", 0, "12:oops", `-postgres-rooms: "12:oops" is not VERSION:EVENTS`},
		{"12:500,12:1000", "", 0, "12:2000", "-postgres-rooms: 12:2000 is not among -rooms"},
	} {
		_, err := planRun(c.rooms, c.ratio, c.pairs, c.pg, true)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("planRun(%q, %q, %d, %q) = %v, want an error with %q", c.rooms, c.ratio, c.pairs, c.pg, err, c.want)
		}
	}
}

func TestPerCore(t *testing.T) {
	if got := perCore(7_420); got != "7,420 (0.37x)" {
		t.Errorf("perCore(7420) = %q", got)
	}
	if got := perCore(0); got != "—" {
		t.Errorf("perCore of an old replay.json = %q, want —", got)
	}
}
