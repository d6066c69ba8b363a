// Command benchimport measures `mtxdb import --from synapse:DB` on a
// Synapse-layout database (make bench-import-synapse builds one of about 1 GB):
// runs imports into a fresh store each, and writes import-synapse.json and
// import-synapse.md to -out with every run (wall and CPU seconds, peak RSS,
// events per second, the load average before it) and the medians.
//
//	benchimport -mtxdb BIN -db FILE [-runs 3] [-out DIR]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/mtxdb/mtxdb/bench/internal/cmdrun"
)

// target is the import rate the audit issue asks for, events per second.
const target = 20000

// run is one import.
type run struct {
	cmdrun.Step
	LoadBefore string  `json:"load_before"`
	Events     int     `json:"events"`
	Refused    int     `json:"refused"`
	States     int     `json:"recorded_states"`
	EventsPerS float64 `json:"events_per_s"`
	StoreBytes int64   `json:"store_bytes"`
}

type report struct {
	Date      string  `json:"date"`
	Machine   string  `json:"machine"`
	Commit    string  `json:"commit"`
	DB        string  `json:"db"`
	DBBytes   int64   `json:"db_bytes"`
	Runs      []run   `json:"runs"`
	MedianEPS float64 `json:"median_events_per_s"`
	MedianRSS float64 `json:"median_peak_rss_mb"`
	LoadAfter string  `json:"load_after"`
}

func main() {
	bin := flag.String("mtxdb", "../bin/mtxdb", "the mtxdb binary")
	db := flag.String("db", "", "the Synapse-layout SQLite database")
	runs := flag.Int("runs", 3, "imports to run")
	out := flag.String("out", "../docs/bench", "where the report goes")
	flag.Parse()
	if err := measure(*bin, *db, *runs, *out); err != nil {
		fmt.Fprintln(os.Stderr, "benchimport:", err)
		os.Exit(1)
	}
}

func measure(bin, db string, runs int, out string) error {
	fi, err := os.Stat(db)
	if err != nil {
		return err
	}
	if err := warm(db); err != nil {
		return err
	}
	rep := report{Date: time.Now().UTC().Format(time.RFC3339), Machine: cmdrun.Machine(), Commit: cmdrun.Commit(), DB: filepath.Base(db), DBBytes: fi.Size()}
	work, err := os.MkdirTemp(filepath.Dir(db), "import-store-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	for i := range runs {
		store := filepath.Join(work, fmt.Sprintf("run%d", i+1))
		syscall.Sync() // the last run's writes leave the page cache before this one starts
		r := run{LoadBefore: cmdrun.Loadavg()}
		if r.Step, err = cmdrun.Run(bin, "import", "--from", "synapse:"+db, "--store", store); err != nil {
			return err
		}
		r.Events = cmdrun.Field(r.Output, "read")
		r.Refused = cmdrun.Field(r.Output, "refused")
		r.States = cmdrun.Field(r.Output, "recorded_states")
		r.EventsPerS = float64(r.Events) / r.Wall
		if r.StoreBytes, err = cmdrun.DuBytes(store); err != nil {
			return err
		}
		fmt.Printf("run %d: %d events in %.2f s (%.0f events/s, %.1f s CPU, peak RSS %.0f MB), load before %s\n",
			i+1, r.Events, r.Wall, r.EventsPerS, r.CPU, r.PeakMB, r.LoadBefore)
		rep.Runs = append(rep.Runs, r)
		os.RemoveAll(store)
	}
	rep.LoadAfter = cmdrun.Loadavg()
	rep.MedianEPS = median(rep.Runs, func(r run) float64 { return r.EventsPerS })
	rep.MedianRSS = median(rep.Runs, func(r run) float64 { return r.PeakMB })
	return write(rep, out)
}

// warm reads the database once, so that every run finds it in the page cache.
func warm(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(io.Discard, f)
	return err
}

func median(runs []run, f func(run) float64) float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func write(rep report, out string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "import-synapse.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	var md strings.Builder
	fmt.Fprintf(&md, "# Import from a Synapse database\n\n`make bench-import-synapse`: `mtxdb import --from synapse:%s` (%.2f GB, SQLite, in the page cache) into a fresh store, %d runs.\n\n",
		rep.DB, float64(rep.DBBytes)/1e9, len(rep.Runs))
	fmt.Fprintf(&md, "- Date %s, commit %s\n- Machine: %s\n- Load average after the runs: %s\n\n", rep.Date, rep.Commit, rep.Machine, rep.LoadAfter)
	md.WriteString("| run | events | refused | wall s | CPU s | events/s | peak RSS MB | store MB | load before (1 5 15 min) |\n|---|---|---|---|---|---|---|---|---|\n")
	for i, r := range rep.Runs {
		fmt.Fprintf(&md, "| %d | %d | %d | %.2f | %.1f | %.0f | %.0f | %.0f | %s |\n", i+1, r.Events, r.Refused, r.Wall, r.CPU, r.EventsPerS, r.PeakMB, float64(r.StoreBytes)/1e6, r.LoadBefore)
	}
	fmt.Fprintf(&md, "\nMedian: %.0f events/s (%.2fx the %d aimed at), peak RSS %.0f MB.\n", rep.MedianEPS, rep.MedianEPS/target, target, rep.MedianRSS)
	return os.WriteFile(filepath.Join(out, "import-synapse.md"), []byte(md.String()), 0o644)
}
