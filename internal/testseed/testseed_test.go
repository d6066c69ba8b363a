package testseed

import (
	"fmt"
	"strings"
	"testing"
)

// recorder is a testing.TB that keeps what Seed logs and whether it failed.
type recorder struct {
	testing.TB
	logs   []string
	failed bool
}

func (r *recorder) Helper()      {}
func (r *recorder) Name() string { return "TestX" }
func (r *recorder) Logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = true
	panic("fatal")
}

// seed calls Seed on a recorder, recovering from its Fatalf.
func seed(flagValue uint64, env string) (s uint64, r *recorder) {
	r = &recorder{}
	defer func() {
		if v := recover(); v != nil && v != "fatal" {
			panic(v)
		}
	}()
	return Seed(r, "x.seed", flagValue, env), r
}

func TestSeed(t *testing.T) {
	if s, r := seed(42, "TESTSEED_SEED"); s != 42 || r.failed || len(r.logs) != 1 {
		t.Fatalf("flag 42: seed %d, failed %v, %d log lines", s, r.failed, len(r.logs))
	}
	t.Setenv("TESTSEED_SEED", "7")
	if s, _ := seed(0, "TESTSEED_SEED"); s != 7 {
		t.Fatalf("TESTSEED_SEED=7: seed %d", s)
	}
	if s, _ := seed(3, "TESTSEED_SEED"); s != 3 {
		t.Fatalf("flag 3 beside TESTSEED_SEED=7: seed %d, want the flag's", s)
	}
	if s, _ := seed(0, ""); s == 7 || s == 0 {
		t.Fatalf("no flag, no variable named: seed %d, want the clock's", s)
	}
	t.Setenv("TESTSEED_SEED", "seven")
	if _, r := seed(0, "TESTSEED_SEED"); !r.failed {
		t.Fatal("TESTSEED_SEED=seven: the test did not fail")
	}
	if _, r := seed(9, ""); !strings.Contains(r.logs[0], "-run '^TestX$' -x.seed=9") {
		t.Fatalf("log %q does not give the test and the flag that repeat it", r.logs[0])
	}
}
