package main

import (
	"regexp"
	"strings"
	"testing"
)

// jsonRun writes a go test -json stream: each entry "Test action" becomes a run
// event and, unless action is "-", a final one.
func jsonRun(entries ...string) string {
	return jsonRunIn("tests", entries...)
}

// jsonRunIn is jsonRun for the package pkg of Complement's module.
func jsonRunIn(pkg string, entries ...string) string {
	var b strings.Builder
	b.WriteString("# a line that is not JSON\n")
	for _, e := range entries {
		name, action, _ := strings.Cut(e, " ")
		b.WriteString(`{"Action":"run","Package":"github.com/matrix-org/complement/` + pkg + `","Test":"` + name + `"}` + "\n")
		if action != "-" {
			b.WriteString(`{"Action":"` + action + `","Package":"github.com/matrix-org/complement/` + pkg + `","Test":"` + name + `"}` + "\n")
		}
	}
	return b.String()
}

func parse(t *testing.T, s string) *Run {
	t.Helper()
	r, err := Parse(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestParseAndCounts(t *testing.T) {
	r := parse(t, jsonRun("TestA pass", "TestA/x pass", "TestA/y skip", "TestB fail", "TestC skip", "TestD -")+
		`{"Action":"output","Package":"github.com/matrix-org/complement/tests","Output":"panic: boom\n"}`+"\n"+
		`{"Action":"fail","Package":"github.com/matrix-org/complement/tests"}`+"\n")
	if got := r.Tests["tests TestD"]; got != Incomplete {
		t.Errorf("TestD: %s, want incomplete", got)
	}
	if got := r.Tests["tests TestA/y"]; got != Skip {
		t.Errorf("TestA/y: %s, want skip", got)
	}
	want := "tests: 1 pass, 1 fail, 1 skip, 1 incomplete; subtests: 1 pass, 0 fail, 1 skip"
	if got := r.Counts().String(); got != want {
		t.Errorf("counts %q, want %q", got, want)
	}
	if len(r.PkgFailure) != 0 {
		t.Errorf("package failures %q beside a failed test", r.PkgFailure)
	}
	r = parse(t, jsonRun("TestA pass")+
		`{"Action":"output","Package":"github.com/matrix-org/complement/tests","Output":"panic: boom\n"}`+"\n"+
		`{"Action":"fail","Package":"github.com/matrix-org/complement/tests"}`+"\n")
	if len(r.PkgFailure) != 1 || !strings.Contains(r.PkgFailure[0], "panic: boom") {
		t.Errorf("package failures %q", r.PkgFailure)
	}
}

func TestPassRule(t *testing.T) {
	stock := parse(t, jsonRun("TestA pass", "TestA/x pass", "TestB fail", "TestC skip", "TestE pass"))
	for _, c := range []struct {
		name    string
		patched string
		ok      bool
		diffs   int
	}{
		{"same", jsonRun("TestA pass", "TestA/x pass", "TestB fail", "TestC skip", "TestE pass"), true, 0},
		{"patched passes more", jsonRun("TestA pass", "TestA/x pass", "TestB pass", "TestC pass", "TestE pass"), true, 2},
		{"subtest fails", jsonRun("TestA pass", "TestA/x fail", "TestB fail", "TestC skip", "TestE pass"), false, 1},
		{"skipped instead", jsonRun("TestA pass", "TestA/x pass", "TestB fail", "TestC skip", "TestE skip"), false, 1},
		{"missing", jsonRun("TestA pass", "TestA/x pass", "TestB fail", "TestC skip"), false, 1},
		{"incomplete", jsonRun("TestA pass", "TestA/x pass", "TestB fail", "TestC skip", "TestE -"), false, 1},
	} {
		patched := parse(t, c.patched)
		if d := Compare(stock, patched); len(d) != c.diffs {
			t.Errorf("%s: %d differences %v, want %d", c.name, len(d), d, c.diffs)
		}
		var out strings.Builder
		if ok := Report(&out, nil, stock, patched); ok != c.ok {
			t.Errorf("%s: rule %v, want %v\n%s", c.name, ok, c.ok, out.String())
		}
	}
	var out strings.Builder
	if Report(&out, nil, parse(t, ""), parse(t, "")) {
		t.Error("two empty runs pass the rule")
	}
}

func TestExcluded(t *testing.T) {
	ex, err := ReadExcluded(strings.NewReader("# comment\n\nTestA   room version 12\nTestB/sub.x\tneeds hs1 as a name\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ex) != 2 || ex[0] != (Exclusion{"TestA", "room version 12"}) || ex[1] != (Exclusion{"TestB/sub.x", "needs hs1 as a name"}) {
		t.Fatalf("parsed %q", ex)
	}
	skip := SkipRegex(ex)
	if skip != `^TestA$|^TestB$/^sub\.x$` {
		t.Errorf("skip pattern %q", skip)
	}
	for _, alt := range strings.Split(skip, "|") {
		for _, el := range strings.Split(alt, "/") {
			regexp.MustCompile(el)
		}
	}
	if _, ok := excludedKey(ex, "tests TestA/y"); !ok {
		t.Error("TestA/y is not excluded")
	}
	if _, ok := excludedKey(ex, "tests TestAB"); ok {
		t.Error("TestAB is excluded")
	}
	for _, bad := range []string{"TestA\n", "Foo reason\n"} {
		if _, err := ReadExcluded(strings.NewReader(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestRerun(t *testing.T) {
	stock := parse(t, jsonRun("TestA pass", "TestA/x pass", "TestB pass", "TestC fail"))
	patched := parse(t, jsonRun("TestA pass", "TestA/x fail", "TestB fail", "TestC fail"))
	if got := RerunRegex(stock, patched); got != "^(TestA|TestB)$" {
		t.Errorf("rerun pattern %q", got)
	}
	var out strings.Builder
	if Report(&out, nil, stock, patched) {
		t.Fatal("rule holds before the rerun")
	}
	patched.Overlay(parse(t, jsonRun("TestA pass", "TestA/x pass", "TestB pass")))
	if got := RerunRegex(stock, patched); got != "" {
		t.Errorf("rerun pattern after the rerun %q", got)
	}
	if !Report(&out, nil, stock, patched) {
		t.Errorf("rule fails after the rerun\n%s", out.String())
	}
	if patched.Tests["tests TestC"] != Fail {
		t.Errorf("TestC, not rerun, lost its result")
	}
	// A rerun replaces the subtests too: one that does not run again is gone.
	stock.Overlay(parse(t, jsonRun("TestA pass")))
	if _, ok := stock.Tests["tests TestA/x"]; ok {
		t.Error("TestA/x kept from before the rerun")
	}
}

// A package path with a slash (tests/csapi) is not a subtest level.
func TestNestedPackage(t *testing.T) {
	stock := parse(t, jsonRunIn("tests/csapi", "TestA pass", "TestA/x pass", "TestB pass"))
	patched := parse(t, jsonRunIn("tests/csapi", "TestA pass", "TestA/x pass", "TestB fail"))
	want := "tests: 2 pass, 0 fail, 0 skip; subtests: 1 pass, 0 fail, 0 skip"
	if got := stock.Counts().String(); got != want {
		t.Errorf("counts %q, want %q", got, want)
	}
	if got := RerunRegex(stock, patched); got != "^(TestB)$" {
		t.Errorf("rerun pattern %q", got)
	}
	patched.Overlay(parse(t, jsonRunIn("tests/csapi", "TestB pass")))
	if len(patched.Tests) != 3 || patched.Tests["tests/csapi TestB"] != Pass || patched.Tests["tests/csapi TestA/x"] != Pass {
		t.Errorf("after the rerun %v", patched.Tests)
	}
}
