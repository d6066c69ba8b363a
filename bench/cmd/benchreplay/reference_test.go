package main

import "testing"

func TestReferenceTime(t *testing.T) {
	out := "v12-100: 100 events, ...\n" +
		"v12-100: reference (resolver/specres): 100 events checked (every 1), 61 resolutions, in 1m2.5s (1m58.25s CPU) on 2 workers; mismatches=0 current_state_mismatched_keys=0\n"
	got := referenceTime(out)
	if got.Wall != 62.5 || got.CPU != 118.25 {
		t.Fatalf("referenceTime = %+v, want wall 62.5, CPU 118.25", got)
	}
	if got := referenceTime("v12-100: 100 events\n"); got.Wall != 0 || got.CPU != 0 {
		t.Fatalf("without a reference line: %+v, want zero", got)
	}
	r := result{Gen: step{Wall: 100, CPU: 150}, GenSimulation: step{Wall: 37.5, CPU: 31.75}}
	if b := r.genBase(); b.Wall != 37.5 {
		t.Fatalf("genBase = %+v, want the simulation", b)
	}
	if b := (result{Gen: step{Wall: 100}}).genBase(); b.Wall != 100 {
		t.Fatalf("genBase of an old result = %+v, want the whole generation", b)
	}
}
