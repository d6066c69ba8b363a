// Command complement-compare reads the go test -json output of Complement runs
// against the stock and the mtxdb-patched Dendrite and applies the pass rule: every
// test and subtest that passed on stock passes on patched. It prints the counts per
// build, every test whose result differs, and exits 1 when the rule fails.
//
//	complement-compare -excluded FILE STOCK.json[,RERUN.json] PATCHED.json[,RERUN.json]
//	complement-compare -rerun-regex STOCK.json PATCHED.json
//	complement-compare -skip-regex FILE
//	complement-compare -report NAME=RUN.json ...
//
// A comma-separated list of runs is read in order, a later run's results of a
// top-level test (and its subtests) replacing the earlier ones: a rerun of the
// tests that broke the rule. -rerun-regex prints the go test -run pattern of
// those tests (nothing when the rule holds), -skip-regex the -skip pattern of
// FILE's tests, -report each run's results without a rule.
//
// FILE lists excluded tests, one a line: a test name (TestX, or TestX/sub for a
// subtest), white space, and the reason; # starts a comment line.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
)

// Result is a test's outcome: the last action go test reported for it, or
// "incomplete" for a test that started and never ended (a panic, a timeout).
type Result string

// The results: go test's pass, fail and skip actions, a test that never ended,
// and a test the run does not have.
const (
	Pass       Result = "pass"
	Fail       Result = "fail"
	Skip       Result = "skip"
	Incomplete Result = "incomplete"
	Absent     Result = "absent" // not in the run at all
)

// Run is one go test -json stream: each test's result by key ("pkg TestX/sub",
// pkg the path inside Complement's module), and the packages that failed with no
// failed test of their own (a build failure, a panic in TestMain), with the end
// of their output.
type Run struct {
	Tests      map[string]Result
	PkgFailure []string
}

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

const complementModule = "github.com/matrix-org/complement/"

// Parse reads a go test -json stream. Lines that are not JSON events (a build
// error printed before the stream) are ignored.
func Parse(r io.Reader) (*Run, error) {
	run := &Run{Tests: map[string]Result{}}
	pkgOutput := map[string][]string{}
	testFailed := map[string]bool{} // packages with a failed or unfinished test
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1024*1024), 64*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil {
			continue
		}
		pkg := strings.TrimPrefix(ev.Package, complementModule)
		if ev.Test == "" {
			switch ev.Action {
			case "output":
				pkgOutput[pkg] = append(pkgOutput[pkg], ev.Output)
			case "fail":
				for k, res := range run.Tests {
					if strings.HasPrefix(k, pkg+" ") && (res == Fail || res == Incomplete) {
						testFailed[pkg] = true
					}
				}
				if !testFailed[pkg] {
					run.PkgFailure = append(run.PkgFailure, pkg+": "+lastLines(pkgOutput[pkg], 5))
				}
			}
			continue
		}
		key := pkg + " " + ev.Test
		switch ev.Action {
		case "run":
			run.Tests[key] = Incomplete
		case "pass", "fail", "skip":
			run.Tests[key] = Result(ev.Action)
		}
	}
	return run, sc.Err()
}

func lastLines(out []string, n int) string {
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return strings.TrimSpace(strings.Join(out, ""))
}

// Counts are a run's results, top-level tests and subtests apart.
type Counts struct {
	Tests, Subtests map[Result]int
}

// Counts counts the run's tests by result, a key with a "/" after its test name
// as a subtest.
func (r *Run) Counts() Counts {
	c := Counts{Tests: map[Result]int{}, Subtests: map[Result]int{}}
	for k, res := range r.Tests {
		if topLevel(k) != k {
			c.Subtests[res]++
		} else {
			c.Tests[res]++
		}
	}
	return c
}

// String gives the counts on one line: "tests: 11 pass, 0 fail, 0 skip; subtests:
// 33 pass, 0 fail, 1 skip", with ", N incomplete" where there are any.
func (c Counts) String() string {
	f := func(m map[Result]int) string {
		s := fmt.Sprintf("%d pass, %d fail, %d skip", m[Pass], m[Fail], m[Skip])
		if m[Incomplete] > 0 {
			s += fmt.Sprintf(", %d incomplete", m[Incomplete])
		}
		return s
	}
	return "tests: " + f(c.Tests) + "; subtests: " + f(c.Subtests)
}

// Difference is a test whose result is not the same on both builds. Broken is
// true when it passed on stock and not on patched: the pass rule fails.
type Difference struct {
	Key            string
	Stock, Patched Result
	Broken         bool
}

// Compare lists the tests whose results differ, sorted by key.
func Compare(stock, patched *Run) []Difference {
	keys := map[string]bool{}
	for k := range stock.Tests {
		keys[k] = true
	}
	for k := range patched.Tests {
		keys[k] = true
	}
	var diffs []Difference
	for k := range keys {
		s, p := result(stock, k), result(patched, k)
		if s != p {
			diffs = append(diffs, Difference{Key: k, Stock: s, Patched: p, Broken: s == Pass})
		}
	}
	sort.Slice(diffs, func(i, j int) bool { return diffs[i].Key < diffs[j].Key })
	return diffs
}

func result(r *Run, key string) Result {
	if res, ok := r.Tests[key]; ok {
		return res
	}
	return Absent
}

// Exclusion is a test excluded from the runs, with the reason.
type Exclusion struct {
	Test, Reason string
}

var testName = regexp.MustCompile(`^Test[A-Za-z0-9_]*(/[^\s]+)*$`)

// ReadExcluded parses an exclusion list.
func ReadExcluded(r io.Reader) ([]Exclusion, error) {
	var out []Exclusion
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name := strings.Fields(line)[0]
		reason := strings.TrimSpace(line[len(name):])
		if !testName.MatchString(name) {
			return nil, fmt.Errorf("line %d: %q is not a test name", n, name)
		}
		if reason == "" {
			return nil, fmt.Errorf("line %d: %s has no reason", n, name)
		}
		out = append(out, Exclusion{Test: name, Reason: reason})
	}
	return out, sc.Err()
}

// SkipRegex is the go test -skip pattern that leaves out every excluded test:
// alternatives of anchored names, one element per subtest level.
func SkipRegex(ex []Exclusion) string {
	var alts []string
	for _, e := range ex {
		var parts []string
		for _, p := range strings.Split(e.Test, "/") {
			parts = append(parts, "^"+regexp.QuoteMeta(p)+"$")
		}
		alts = append(alts, strings.Join(parts, "/"))
	}
	return strings.Join(alts, "|")
}

// excludedKey reports whether a result key ("pkg TestX/sub") is an excluded test
// or one of its subtests.
func excludedKey(ex []Exclusion, key string) (Exclusion, bool) {
	_, name, _ := strings.Cut(key, " ")
	for _, e := range ex {
		if name == e.Test || strings.HasPrefix(name, e.Test+"/") {
			return e, true
		}
	}
	return Exclusion{}, false
}

// ranIn reports whether a run has a result for the test or one of its subtests.
func ranIn(r *Run, test string) bool {
	for k := range r.Tests {
		_, name, _ := strings.Cut(k, " ")
		if name == test || strings.HasPrefix(name, test+"/") {
			return true
		}
	}
	return false
}

func readRun(path string) (*Run, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Parse(f)
}

// readRuns reads a comma-separated list of runs into one (see Overlay).
func readRuns(paths string) (*Run, error) {
	var run *Run
	for _, p := range strings.Split(paths, ",") {
		r, err := readRun(p)
		if err != nil {
			return nil, err
		}
		if run == nil {
			run = r
		} else {
			run.Overlay(r)
		}
	}
	return run, nil
}

// topLevel is the "pkg TestX" part of a result key.
func topLevel(key string) string {
	pkg, name, _ := strings.Cut(key, " ")
	if i := strings.IndexByte(name, '/'); i >= 0 {
		return pkg + " " + name[:i]
	}
	return key
}

// Overlay replaces r's results of every top-level test that later ran (its
// subtests included) with later's, and takes later's package failures.
func (r *Run) Overlay(later *Run) {
	rerun := map[string]bool{}
	for k := range later.Tests {
		rerun[topLevel(k)] = true
	}
	for k := range r.Tests {
		if rerun[topLevel(k)] {
			delete(r.Tests, k)
		}
	}
	for k, res := range later.Tests {
		r.Tests[k] = res
	}
	r.PkgFailure = append(r.PkgFailure, later.PkgFailure...)
}

// RerunRegex is the go test -run pattern of the top-level tests that break the
// pass rule ("" when none does).
func RerunRegex(stock, patched *Run) string {
	seen := map[string]bool{}
	var names []string
	for _, d := range Compare(stock, patched) {
		_, name, _ := strings.Cut(topLevel(d.Key), " ")
		if d.Broken && !seen[name] {
			seen[name] = true
			names = append(names, regexp.QuoteMeta(name))
		}
	}
	if len(names) == 0 {
		return ""
	}
	sort.Strings(names)
	return "^(" + strings.Join(names, "|") + ")$"
}

func readExcludedFile(path string) ([]Exclusion, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ex, err := ReadExcluded(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ex, nil
}

func main() {
	excluded := flag.String("excluded", "", "the exclusion list")
	skipRegex := flag.String("skip-regex", "", "print the -skip pattern of this exclusion list and exit")
	report := flag.Bool("report", false, "print each NAME=RUN.json's results, apply no rule")
	rerunRegex := flag.Bool("rerun-regex", false, "print the -run pattern of the tests that break the rule")
	flag.Parse()
	var err error
	switch {
	case *rerunRegex:
		var stock, patched *Run
		if flag.NArg() != 2 {
			err = fmt.Errorf("-rerun-regex takes STOCK.json PATCHED.json")
		} else if stock, err = readRuns(flag.Arg(0)); err == nil {
			if patched, err = readRuns(flag.Arg(1)); err == nil {
				fmt.Println(RerunRegex(stock, patched))
			}
		}
	case *skipRegex != "":
		var ex []Exclusion
		if ex, err = readExcludedFile(*skipRegex); err == nil {
			fmt.Println(SkipRegex(ex))
		}
	case *report:
		err = reportRuns(os.Stdout, flag.Args())
	default:
		if flag.NArg() != 2 {
			fmt.Fprintln(os.Stderr, "usage: complement-compare -excluded FILE STOCK.json[,RERUN.json] PATCHED.json[,RERUN.json]")
			os.Exit(2)
		}
		var ok bool
		ok, err = compareFiles(os.Stdout, *excluded, flag.Arg(0), flag.Arg(1))
		if err == nil && !ok {
			os.Exit(1)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "complement-compare:", err)
		os.Exit(2)
	}
}

// reportRuns prints, for each NAME=PATH, every test's result and the counts.
func reportRuns(w io.Writer, args []string) error {
	for _, a := range args {
		name, path, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("%q: want NAME=RUN.json", a)
		}
		run, err := readRun(path)
		if err != nil {
			return err
		}
		keys := make([]string, 0, len(run.Tests))
		for k := range run.Tests {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "%s: %s %s\n", name, k, run.Tests[k])
		}
		for _, f := range run.PkgFailure {
			fmt.Fprintf(w, "%s: package failed: %s\n", name, f)
		}
		if len(keys) == 0 {
			fmt.Fprintf(w, "%s: no test ran\n", name)
		}
	}
	return nil
}

// compareFiles prints the comparison of two runs and reports whether the pass
// rule holds.
func compareFiles(w io.Writer, excludedPath, stockPath, patchedPath string) (bool, error) {
	var ex []Exclusion
	if excludedPath != "" {
		var err error
		if ex, err = readExcludedFile(excludedPath); err != nil {
			return false, err
		}
	}
	stock, err := readRuns(stockPath)
	if err != nil {
		return false, err
	}
	patched, err := readRuns(patchedPath)
	if err != nil {
		return false, err
	}
	return Report(w, ex, stock, patched), nil
}

// Report prints the counts, the package failures, the differences and the tests
// that failed on both builds (excluded or not), and reports whether the pass rule
// holds: every test stock passed, patched passed, and stock ran at least one test.
func Report(w io.Writer, ex []Exclusion, stock, patched *Run) bool {
	fmt.Fprintf(w, "stock:   %s\n", stock.Counts())
	fmt.Fprintf(w, "patched: %s\n", patched.Counts())
	for _, f := range stock.PkgFailure {
		fmt.Fprintf(w, "stock package failed: %s\n", f)
	}
	for _, f := range patched.PkgFailure {
		fmt.Fprintf(w, "patched package failed: %s\n", f)
	}
	ok := len(stock.Tests) > 0
	if !ok {
		fmt.Fprintln(w, "FAIL: no test ran on stock")
	}
	diffs := Compare(stock, patched)
	fmt.Fprintf(w, "differences: %d\n", len(diffs))
	for _, d := range diffs {
		mark := " "
		if d.Broken {
			mark, ok = "!", false
		}
		fmt.Fprintf(w, "%s %s: stock %s, patched %s\n", mark, d.Key, d.Stock, d.Patched)
	}
	var bothFailed []string
	for k, s := range stock.Tests {
		if s != Pass && s != Skip && result(patched, k) == s {
			if e, isEx := excludedKey(ex, k); isEx {
				bothFailed = append(bothFailed, fmt.Sprintf("%s (excluded: %s)", k, e.Reason))
			} else {
				bothFailed = append(bothFailed, k+" (not in the exclusion list)")
			}
		}
	}
	sort.Strings(bothFailed)
	fmt.Fprintf(w, "failed on both builds: %d\n", len(bothFailed))
	for _, b := range bothFailed {
		fmt.Fprintf(w, "  %s\n", b)
	}
	notRun := 0
	for _, e := range ex {
		if !ranIn(stock, e.Test) && !ranIn(patched, e.Test) {
			notRun++
		}
	}
	fmt.Fprintf(w, "excluded and not run on either build: %d of %d listed\n", notRun, len(ex))
	if ok {
		fmt.Fprintln(w, "PASS: patched passed every test stock passed")
	} else {
		fmt.Fprintln(w, "FAIL: the pass rule does not hold (lines marked !)")
	}
	return ok
}
