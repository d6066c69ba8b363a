package main

import (
	"math"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestMemoryLimitFlag: sizes with units parse, "none" turns the default off, and
// a bare small number or a word is refused with the value quoted.
func TestMemoryLimitFlag(t *testing.T) {
	for _, c := range []struct {
		in      string
		want    int64
		none    bool
		errPart string
	}{
		{in: "1.5GiB", want: 3 << 29},
		{in: "800MiB", want: 800 << 20},
		{in: "2GB", want: 2_000_000_000},
		{in: "none", none: true},
		{in: " None ", none: true},
		{in: "12", errPart: `"12" has no unit`},
		{in: "1.5", errPart: `"1.5" has no unit`},
		{in: "10MB", errPart: `"10MB" is 10000000 bytes, below`},
		{in: "63.9MiB", errPart: `"63.9MiB" is 67004006 bytes, below the smallest limit of 64 MiB (67108864 bytes`},
		{in: "1,5GiB", errPart: `"1,5GiB" has a comma`},
		{in: "9223372036854775807", want: math.MaxInt64},
		{in: "9223372036854775806B", want: math.MaxInt64 - 1},
		{in: "99999999999999999999", errPart: "more than the largest limit, 9223372036854775807 bytes"},
		{in: "2000000000", want: 2_000_000_000},
		{in: "8EiB", errPart: `"8EiB" is more than the largest limit`},
		{in: "9223372036854775808B", errPart: "more than the largest limit"},
		{in: "8000PiB", want: 8000 << 50},
		{in: "99999999999999999999GiB", errPart: "more than the largest limit"},
		{in: "lots", errPart: `"lots" is not a size`},
		{in: "", errPart: `"" is not a size`},
	} {
		var f memoryLimitFlag
		err := f.Set(c.in)
		switch {
		case c.errPart != "":
			if err == nil || !strings.Contains(err.Error(), c.errPart) {
				t.Errorf("Set(%q) = %v, want an error containing %q", c.in, err, c.errPart)
			}
		case err != nil:
			t.Errorf("Set(%q): %v", c.in, err)
		case f.none != c.none || (!c.none && f.bytes != c.want):
			t.Errorf("Set(%q) = %+v, want %d bytes (none %v)", c.in, f, c.want, c.none)
		}
	}
}

// TestApplyMemoryLimit: streaming commands get the 1.5 GiB default, replay
// its 900 MiB, gen its 2.25 GiB, others keep the runtime's, the flag wins over both, and GOMEMLIMIT
// over the default.
func TestApplyMemoryLimit(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(old)
	saved := memoryLimit
	defer func() { memoryLimit = saved }()
	cmd := func(name string) *cobra.Command { return &cobra.Command{Use: name} }

	t.Setenv("GOMEMLIMIT", "")
	memoryLimit = memoryLimitFlag{}
	if got := applyMemoryLimit(cmd("replay")); got != 900<<20 || debug.SetMemoryLimit(-1) != 900<<20 {
		t.Fatalf("replay: limit %d, runtime %d", got, debug.SetMemoryLimit(-1))
	}
	debug.SetMemoryLimit(old)
	if got := applyMemoryLimit(cmd("import")); got != defaultStreamLimit || debug.SetMemoryLimit(-1) != defaultStreamLimit {
		t.Fatalf("import: limit %d, runtime %d", got, debug.SetMemoryLimit(-1))
	}
	debug.SetMemoryLimit(old)
	if got := applyMemoryLimit(cmd("gen")); got != defaultGenLimit || debug.SetMemoryLimit(-1) != defaultGenLimit {
		t.Fatalf("gen: limit %d, runtime %d", got, debug.SetMemoryLimit(-1))
	}
	debug.SetMemoryLimit(old)
	if got := applyMemoryLimit(cmd("stats")); got != -1 || debug.SetMemoryLimit(-1) != old {
		t.Fatalf("stats: limit %d, runtime %d (want it left at %d)", got, debug.SetMemoryLimit(-1), old)
	}
	memoryLimit = memoryLimitFlag{set: true, bytes: 900 << 20}
	if got := applyMemoryLimit(cmd("gen")); got != 900<<20 || debug.SetMemoryLimit(-1) != 900<<20 {
		t.Fatalf("gen --memory-limit 900MiB: limit %d", got)
	}
	debug.SetMemoryLimit(old)
	memoryLimit = memoryLimitFlag{}
	t.Setenv("GOMEMLIMIT", "3GiB")
	if got := applyMemoryLimit(cmd("verify")); got != -1 || debug.SetMemoryLimit(-1) != old {
		t.Fatalf("verify under GOMEMLIMIT: limit %d", got)
	}
}

// TestReplayGC: replay and import collect at replayGCPercent and
// importGCPercent only under a soft heap limit and when GOGC is not set.
func TestReplayGC(t *testing.T) {
	oldLimit, oldPercent := debug.SetMemoryLimit(-1), debug.SetGCPercent(100)
	defer func() { debug.SetMemoryLimit(oldLimit); debug.SetGCPercent(oldPercent) }()
	t.Setenv("GOGC", "")
	for _, cmd := range []struct {
		name    string
		set     func()
		percent int
	}{{"replay", replayGC, replayGCPercent}, {"import", importGC, importGCPercent}} {
		for _, c := range []struct {
			name  string
			limit int64
			gogc  string
			want  int
		}{
			{"limit", 1 << 30, "", cmd.percent},
			{"no limit", math.MaxInt64, "", 100},
			{"GOGC set", 1 << 30, "100", 100},
		} {
			debug.SetMemoryLimit(c.limit)
			debug.SetGCPercent(100)
			t.Setenv("GOGC", c.gogc)
			cmd.set()
			if got := debug.SetGCPercent(100); got != c.want {
				t.Errorf("%s, %s: GOGC %d, want %d", cmd.name, c.name, got, c.want)
			}
		}
	}
}
