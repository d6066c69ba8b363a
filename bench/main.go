// Command mtxdb-bench is the cross-engine benchmark: one
// workload (workload.go) run on packstore (three checksum modes), bbolt,
// pebble v2, badger v4, SQLite (mattn/go-sqlite3) and libmdbx (mdbx-go),
// with 1 and with 32 collections, fsync per batch, in alternating order, each
// cell in its own child process (own peak RSS, own page cache state), with
// the filesystem's physical limits measured before and after on the same
// directory. Writes raw JSON, a Markdown table and PNG plots.
//
// It is its own Go module so that the core module's dependencies stay those
// of the design card and a user importing packstore needs no C compiler.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Run is everything one invocation measured: the JSON file's content.
type Run struct {
	Started  string             `json:"started"`
	Finished string             `json:"finished"`
	Machine  Machine            `json:"machine"`
	Workload map[string]any     `json:"workload"`
	Settings map[string]string  `json:"engine_settings"`
	Sizes    []SizeRun          `json:"sizes"`
	Zstd     float64            `json:"zstd_ratio_sample"`
	Extra    map[string]float64 `json:"extra,omitempty"`
}

// SizeRun is the measurements at one payload size: the payload in MiB (-sizes),
// the filesystem limits measured before and after the engines ran, the cells in
// the order they ran, and one Result per cell.
type SizeRun struct {
	PayloadMB int      `json:"payload_mb"`
	Limits    []Limits `json:"limits"` // before and after the engines
	Order     []string `json:"order"`  // cells in the order they ran
	Results   []Result `json:"results"`
}

// Machine describes where a run took place: CPU model and count, MemTotal as
// /proc/meminfo gives it ("16384000 kB"), kernel release, the data directory's
// filesystem ("ext4 on /dev/sda1"), Go version, the repository's short commit,
// and /proc/loadavg before and after the run.
type Machine struct {
	CPUModel   string `json:"cpu_model"`
	NumCPU     int    `json:"nproc"`
	MemTotal   string `json:"mem_total"`
	Kernel     string `json:"kernel"`
	Filesystem string `json:"filesystem"` // df -T of the data directory
	GoVersion  string `json:"go_version"`
	Commit     string `json:"commit"`
	LoadBefore string `json:"loadavg_before"`
	LoadAfter  string `json:"loadavg_after"`
	DataDir    string `json:"data_dir"`
}

// flags are the command's flags.
type flags struct {
	child, sizes, engines, colls, out, dataDir, profile, report string
	reps, batch, appBatch, appBatches, coldGets, warmGets       int
	gmKeys, gmReps                                              int
	seed                                                        uint64
	timeout                                                     time.Duration
}

// parseFlags parses the command line.
func parseFlags() *flags {
	f := &flags{}
	flag.StringVar(&f.child, "child", "", "internal: run one cell with these JSON params")
	flag.StringVar(&f.sizes, "sizes", "64", "payload sizes in MB, comma-separated (e.g. 64,256,1024)")
	flag.IntVar(&f.reps, "reps", 1, "passes per shape; the engine order alternates between passes")
	flag.StringVar(&f.engines, "engines", strings.Join(engineNames, ","), "engines to run")
	flag.StringVar(&f.colls, "colls", "1,32", "collection counts")
	flag.StringVar(&f.out, "out", "../docs/bench", "output directory for JSON, Markdown and PNGs")
	flag.StringVar(&f.dataDir, "dir", ".work", "data directory (the filesystem under test)")
	flag.Uint64Var(&f.seed, "seed", 1, "workload seed")
	flag.IntVar(&f.batch, "batch", 1000, "records per bulk batch (one fsync each)")
	flag.IntVar(&f.appBatch, "append-batch", 16, "records per steady append batch")
	flag.IntVar(&f.appBatches, "append-batches", 500, "steady append batches (after the first)")
	flag.IntVar(&f.coldGets, "cold-gets", 200, "cold point gets after the evicted reopen")
	flag.IntVar(&f.warmGets, "warm-gets", 2000, "distinct keys of the warm point-get passes")
	flag.IntVar(&f.gmKeys, "get-many", 1000, "keys per get_many")
	flag.IntVar(&f.gmReps, "get-many-reps", 10, "warm get_many repeats")
	flag.StringVar(&f.profile, "profile", "", "write a CPU profile of each cell's bulk write into this directory")
	flag.DurationVar(&f.timeout, "timeout", 15*time.Minute, "per-cell timeout")
	flag.StringVar(&f.report, "report", "", "rewrite the Markdown table and plots of this results JSON under -out, running nothing")
	flag.Parse()
	return f
}

func main() {
	f := parseFlags()
	switch {
	case f.report != "":
		rewriteReport(f.report, f.out)
	case f.child != "":
		childCell(f.child)
	default:
		runAll(f)
	}
}

// rewriteReport writes the Markdown table and plots of the results JSON report
// under out.
func rewriteReport(report, out string) {
	b, err := os.ReadFile(report)
	if err != nil {
		fatal(err)
	}
	var run Run
	if err := json.Unmarshal(b, &run); err != nil {
		fatal(fmt.Errorf("%s: %w", report, err))
	}
	if err := writeOutputs(out, &run); err != nil {
		fatal(err)
	}
}

// childCell runs the cell whose JSON params the parent passed (runChild) and
// writes its Result, with the error in it, as JSON to standard output.
func childCell(params string) {
	var w struct {
		Params
		Dir string `json:"dir"`
	}
	if err := json.Unmarshal([]byte(params), &w); err != nil {
		fatal(err)
	}
	p := w.Params
	p.Dir = w.Dir
	res, err := runCell(p)
	if err != nil {
		res.Error = err.Error()
	}
	json.NewEncoder(os.Stdout).Encode(res)
}

// runAll measures every size, shape and engine the flags name and writes the
// JSON, the Markdown table and the plots.
func runAll(f *flags) {
	abs, _ := filepath.Abs(f.dataDir)
	if err := os.MkdirAll(abs, 0o755); err != nil {
		fatal(err)
	}
	if err := os.MkdirAll(f.out, 0o755); err != nil {
		fatal(err)
	}
	run := Run{Started: time.Now().UTC().Format(time.RFC3339), Machine: machine(abs), Settings: engineSettings}
	run.Workload = map[string]any{
		"record_sizes":         "20% 64..255 B, 60% 256..767 B, 20% 768..1023 B (HAMT-node-like mix)",
		"compressible_pct":     CompressiblePct,
		"keys":                 "16-byte random record IDs; 16-byte collection IDs (prefix for pebble/badger)",
		"bulk_batch_records":   f.batch,
		"append_batch_records": f.appBatch,
		"append_batches":       f.appBatches,
		"durability":           "fsync (or the engine's durable commit) once per batch",
		"seed":                 f.seed,
	}
	run.Zstd, run.Workload["mean_record_bytes"] = zstdRatio(f.seed, 20000)
	fmt.Fprintf(os.Stderr, "machine: %d x %s, %s, load %s\n", run.Machine.NumCPU, run.Machine.CPUModel, run.Machine.Filesystem, run.Machine.LoadBefore)
	fmt.Fprintf(os.Stderr, "workload: mean record %.0f B, zstd ratio of a 20k-record sample %.2f\n", run.Workload["mean_record_bytes"], run.Zstd)
	var collsList []int
	for _, s := range strings.Split(f.colls, ",") {
		c, err := strconv.Atoi(s)
		if err != nil {
			fatal(err)
		}
		collsList = append(collsList, c)
	}
	for _, s := range strings.Split(f.sizes, ",") {
		mb, err := strconv.Atoi(s)
		if err != nil {
			fatal(err)
		}
		run.Sizes = append(run.Sizes, runSize(f, abs, mb, collsList))
	}
	run.Machine.LoadAfter = loadavg()
	run.Finished = time.Now().UTC().Format(time.RFC3339)
	if err := writeOutputs(f.out, &run); err != nil {
		fatal(err)
	}
}

// runSize measures one payload size of mb MB: the filesystem's limits, every
// engine with each collection count (the engine order reversed every other
// pass), f.reps passes, then the limits again.
func runSize(f *flags, abs string, mb int, collsList []int) SizeRun {
	sr := SizeRun{PayloadMB: mb}
	lim, err := measureLimits(abs, "before", max(int64(mb)<<20, 64<<20), 2000)
	if err != nil {
		fatal(fmt.Errorf("limits: %w", err))
	}
	sr.Limits = append(sr.Limits, lim)
	logLimits(lim)
	names := strings.Split(f.engines, ",")
	pass := 0
	for rep := 0; rep < f.reps; rep++ {
		for _, colls := range collsList {
			order := slices.Clone(names)
			if pass%2 == 1 {
				slices.Reverse(order)
			}
			pass++
			for _, name := range order {
				p := Params{Engine: name, Colls: colls, PayloadBytes: int64(mb) << 20, Seed: f.seed,
					Batch: f.batch, AppendBatch: f.appBatch, AppendBatches: f.appBatches,
					ColdGets: f.coldGets, WarmGets: f.warmGets, GetManyKeys: f.gmKeys, GetManyReps: f.gmReps, Profile: f.profile,
					Dir: filepath.Join(abs, fmt.Sprintf("%s-%d-%dMB", name, colls, mb))}
				res := runChild(p, f.timeout)
				sr.Order = append(sr.Order, fmt.Sprintf("%s/%d", name, colls))
				sr.Results = append(sr.Results, res)
				logResult(res)
				os.RemoveAll(p.Dir)
			}
		}
	}
	lim, err = measureLimits(abs, "after", max(int64(mb)<<20, 64<<20), 2000)
	if err != nil {
		fatal(fmt.Errorf("limits: %w", err))
	}
	sr.Limits = append(sr.Limits, lim)
	logLimits(lim)
	return sr
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "mtxdb-bench:", err)
	os.Exit(1)
}

func runChild(p Params, timeout time.Duration) Result {
	pj, _ := json.Marshal(struct {
		Params
		Dir string `json:"dir"`
	}{p, p.Dir})
	cmd := exec.Command(os.Args[0], "-child", string(pj))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	os.RemoveAll(p.Dir)
	if err := cmd.Start(); err != nil {
		return Result{Params: p, Error: err.Error()}
	}
	timer := time.AfterFunc(timeout, func() { cmd.Process.Kill() })
	err := cmd.Wait()
	timer.Stop()
	var res Result
	if jerr := json.Unmarshal(stdout.Bytes(), &res); jerr != nil {
		msg := fmt.Sprintf("child: %v / %v; stderr: %s", err, jerr, tail(stderr.String(), 2000))
		return Result{Params: p, Settings: engineSettings[p.Engine], Error: msg}
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		res.PeakRSSKiB = ru.Maxrss
	}
	return res
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func logLimits(l Limits) {
	fmt.Fprintf(os.Stderr, "limits (%s): seq write %.0f MB/s (fdatasync per 512 KiB), %.0f MB/s (at end); seq read %.0f MB/s; 4K rand read p50 %.0f us (%.0f IOPS); 4K append+fdatasync p50 %.0f us; cold mmap fault %.0f KiB read in %.0f us (MADV_RANDOM: %.0f KiB, %.0f us)\n",
		l.When, l.SeqWriteSyncMBs, l.SeqWriteEndMBs, l.SeqReadMBs, l.RandRead4K.P50, l.RandRead4KIOPS, l.Append4KSync.P50,
		l.MmapFaultKiB, l.MmapFaultUs, l.MmapRandomFaultKiB, l.MmapRandomFaultUs)
}

func logResult(r Result) {
	if r.Error != "" {
		fmt.Fprintf(os.Stderr, "%-20s colls=%-2d ERROR %s\n", r.Engine, r.Colls, r.Error)
		return
	}
	fmt.Fprintf(os.Stderr, "%-20s colls=%-2d bulk %6.1f MB/s  append p50 %6.0f us p99 %6.0f us  warm get %6.0f ns  cold get p50 %6.0f us  reopen %6.1f ms  disk %5.1f MB  rss %4d MiB\n",
		r.Engine, r.Colls, r.BulkMBs, r.Append.P50, r.Append.P99, r.WarmGetNs, r.ColdGet.P50, r.ReopenColdUs/1e3, float64(r.DiskAlloc)/1e6, r.PeakRSSKiB>>10)
}

func machine(dir string) Machine {
	m := Machine{NumCPU: runtime.NumCPU(), GoVersion: runtime.Version(), LoadBefore: loadavg(), DataDir: dir}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m.CPUModel = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		m.MemTotal = strings.Join(strings.Fields(strings.SplitN(string(b), "\n", 2)[0])[1:], " ")
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := exec.Command("df", "-T", dir).Output(); err == nil {
		ls := strings.Split(strings.TrimSpace(string(b)), "\n")
		f := strings.Fields(ls[len(ls)-1])
		if len(f) >= 2 {
			m.Filesystem = f[1] + " on " + f[0]
		}
	}
	if b, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		m.Commit = strings.TrimSpace(string(b))
	}
	return m
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
