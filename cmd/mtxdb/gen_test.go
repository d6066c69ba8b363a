package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mtxdb/mtxdb/testrooms/gen"
)

// TestCLIGenRefuses: each bad flag value exits 1 with a message naming the flag,
// before anything is written; an --out that is not empty is refused, so no stale
// room from an earlier run stays beside the new ones; a new or empty --out works.
func TestCLIGenRefuses(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	for _, tc := range []struct{ flag, value string }{
		{"--servers", "1000"},
		{"--servers", "0"},
		{"--members", "-1"},
		{"--members", "100001"},
		{"--loss", "1"},
		{"--loss", "-0.1"},
		{"--bad-rate", "1.5"},
		{"--bad-rate", "-0.01"},
		{"--max-delay", "0"},
		{"--max-prev-events", "0"},
		{"--max-prev-events", "21"},
		{"--backfill-batch", "0"},
		{"--rooms", "0"},
		{"--mix-kick", "-1"},
		{"--mix-message", "NaN"},
	} {
		o, code := run(t, "gen", "--out", out, "--events", "20", "--backfill", tc.flag, tc.value)
		if code != 1 || !strings.Contains(o, tc.flag+" "+tc.value) {
			t.Errorf("%s %s: exit %d\n%s", tc.flag, tc.value, code, o)
		}
	}
	zero := []string{"gen", "--out", out, "--events", "20"}
	mix := gen.DefaultMix()
	for _, w := range mix.Weights() {
		zero = append(zero, "--mix-"+w.Name, "0")
	}
	if o, code := run(t, zero...); code != 1 || !strings.Contains(o, "--mix-") {
		t.Errorf("all mix weights 0: exit %d\n%s", code, o)
	}
	if o, code := run(t, "gen", "--out", out, "--events", "20", "--backfill-batch", "5"); code != 1 || !strings.Contains(o, "--backfill-batch applies only with --backfill") {
		t.Errorf("--backfill-batch without --backfill: exit %d\n%s", code, o)
	}
	if o, code := run(t, "gen", "--out", out, "--events", "20", "--mix-message", "1e308", "--mix-join", "1e308"); code != 1 || !strings.Contains(o, "add up to more than") {
		t.Errorf("mix weights overflowing their sum: exit %d\n%s", code, o)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("a refused gen created --out")
	}

	if o, code := run(t, "gen", "--out", out, "--events", "20", "--servers", "2", "--rooms", "3"); code != 0 {
		t.Fatalf("--rooms 3: exit %d\n%s", code, o)
	}
	if o, code := run(t, "gen", "--out", out, "--events", "20", "--servers", "2", "--rooms", "2"); code != 1 || !strings.Contains(o, "is not empty") {
		t.Fatalf("--rooms 2 into the --rooms 3 output: exit %d\n%s", code, o)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	if o, code := run(t, "gen", "--out", empty, "--events", "20", "--servers", "2"); code != 0 {
		t.Fatalf("empty --out: exit %d\n%s", code, o)
	}
}

// TestCLIGenSignalCleansUp: SIGTERM while gen writes its files (a real process,
// stopped once its directory beside --out holds events.jsonl) exits 143 and leaves
// nothing: neither --out nor the directory beside it.
func TestCLIGenSignalCleansUp(t *testing.T) {
	parent := t.TempDir()
	cmd := exec.Command(bin, "gen", "--seed", "3", "--events", "20000", "--out", filepath.Join(parent, "out"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	caught := false
	for !caught {
		select {
		case err := <-done:
			t.Fatalf("gen finished (%v) before its writing phase was seen", err)
		case <-time.After(2 * time.Millisecond):
		}
		m, _ := filepath.Glob(filepath.Join(parent, ".out.gen-*", "events.jsonl"))
		caught = len(m) > 0
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := <-done
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 143 {
		t.Fatalf("after SIGTERM: %v, want exit status 143", err)
	}
	ents, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("left behind: %s", e.Name())
	}
}

// TestCLIVerifyDamagedExpectations: recorded state that lost lines, or records
// nothing at all, is refused instead of passing with fewer (or no) comparisons
// (compared_events=0 mismatches=0, exit 0).
func TestCLIVerifyDamagedExpectations(t *testing.T) {
	dir := t.TempDir()
	roomDir, store := filepath.Join(dir, "r"), filepath.Join(dir, "s")
	if o, code := run(t, "gen", "--out", roomDir, "--events", "200", "--servers", "2"); code != 0 {
		t.Fatalf("gen: exit %d\n%s", code, o)
	}
	if o, code := run(t, "import", "--store", store, roomDir); code != 0 {
		t.Fatalf("import: exit %d\n%s", code, o)
	}
	if o, code := run(t, "replay", "--store", store); code != 0 {
		t.Fatalf("replay: exit %d\n%s", code, o)
	}
	exp := filepath.Join(roomDir, "expected_state.jsonl")
	b, err := os.ReadFile(exp)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	if err := os.WriteFile(exp, []byte(strings.Join(lines[1:], "")), 0o644); err != nil {
		t.Fatal(err)
	}
	if o, code := run(t, "verify", "--store", store, "--expected", roomDir); code != 2 || !strings.Contains(o, "expected_state.lines says") {
		t.Errorf("one line dropped: exit %d\n%s", code, o)
	}
	if err := os.WriteFile(exp, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(roomDir, "current_state.json")); err != nil {
		t.Fatal(err)
	}
	if o, code := run(t, "verify", "--store", store, "--expected", roomDir); code != 2 || !strings.Contains(o, "has 0 states") {
		t.Errorf("nothing recorded: exit %d\n%s", code, o)
	}
}
