package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/klauspost/compress/zstd"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/mtxdb/mtxdb/bench/internal/barplot"
)

// zstdRatio compresses the first n records one by one (as packstore does,
// default level) and returns raw/stored bytes, plus the mean record size.
func zstdRatio(seed uint64, n int) (float64, float64) {
	enc, _ := zstd.NewWriter(nil)
	defer enc.Close()
	var raw, stored int
	for i := 0; i < n; i++ {
		d := recordAt(seed, i, 1).Data
		raw += len(d)
		stored += min(len(d), len(enc.EncodeAll(d, nil)))
	}
	return float64(raw) / float64(stored), float64(raw) / float64(n)
}

func writeOutputs(out string, run *Run) error {
	var mbs []string
	for _, s := range run.Sizes {
		mbs = append(mbs, fmt.Sprintf("%dMB", s.PayloadMB))
	}
	tag := strings.Join(mbs, "-")
	b, err := json.MarshalIndent(run, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "results-"+tag+".json"), b, 0o644); err != nil {
		return err
	}
	md := markdown(run, tag)
	if err := os.WriteFile(filepath.Join(out, "results-"+tag+".md"), []byte(md), 0o644); err != nil {
		return err
	}
	fmt.Print(md)
	for _, s := range run.Sizes {
		if err := plots(out, s); err != nil {
			return err
		}
	}
	return nil
}

// cell aggregates the repeats of one (engine, colls) pair: the median of
// each figure across repeats.
type cell struct {
	name  string
	colls int
	rs    []Result
}

func cells(s SizeRun) []cell {
	var cs []cell
	for _, r := range s.Results {
		i := slices.IndexFunc(cs, func(c cell) bool { return c.name == r.Engine && c.colls == r.Colls })
		if i < 0 {
			cs = append(cs, cell{name: r.Engine, colls: r.Colls})
			i = len(cs) - 1
		}
		cs[i].rs = append(cs[i].rs, r)
	}
	slices.SortStableFunc(cs, func(a, b cell) int {
		if a.colls != b.colls {
			return a.colls - b.colls
		}
		return slices.Index(engineNames, a.name) - slices.Index(engineNames, b.name)
	})
	return cs
}

func (c cell) med(f func(Result) float64) float64 {
	var xs []float64
	for _, r := range c.rs {
		if r.Error == "" {
			xs = append(xs, f(r))
		}
	}
	return summarize(xs).P50
}

func (c cell) err() string {
	for _, r := range c.rs {
		if r.Error != "" {
			return r.Error
		}
	}
	return ""
}

func limitMean(ls []Limits, f func(Limits) float64) float64 {
	var s float64
	for _, l := range ls {
		s += f(l)
	}
	return s / float64(len(ls))
}

func markdown(run *Run, tag string) string {
	var w strings.Builder
	m := run.Machine
	fmt.Fprintf(&w, "# Cross-engine benchmark (%s)\n\n", tag)
	fmt.Fprintf(&w, "Run %s to %s, commit %s, %s.\n\n", run.Started, run.Finished, m.Commit, m.GoVersion)
	fmt.Fprintf(&w, "Machine: %d x %s, %s RAM, Linux %s, data on %s. Load average (1, 5, 15 min) before: %s, after: %s.\n\n",
		m.NumCPU, m.CPUModel, m.MemTotal, m.Kernel, m.Filesystem, m.LoadBefore, m.LoadAfter)
	fmt.Fprintf(&w, "Workload: %v; %d%% of records compressible text, the rest random bytes; mean record %.0f B; zstd ratio over a 20k-record sample %.2f. Bulk batches of %v records, steady appends of %v records x %v batches; one durable commit (fsync) per batch for every engine.\n\n",
		run.Workload["record_sizes"], CompressiblePct, run.Workload["mean_record_bytes"], run.Zstd,
		run.Workload["bulk_batch_records"], run.Workload["append_batch_records"], run.Workload["append_batches"])
	for _, s := range run.Sizes {
		fmt.Fprintf(&w, "## %d MB of payload\n\n", s.PayloadMB)
		w.WriteString("Physical limits of the same filesystem, measured before and after the engines in this run:\n\n")
		w.WriteString("| when | seq write, fdatasync per 512 KiB | seq write, fdatasync at end | seq read (O_DIRECT) | 4 KiB random read QD1 p50 (IOPS) | 4 KiB append + fdatasync p50 / p99 | cold mmap fault: read, time (MADV_RANDOM) |\n|---|---|---|---|---|---|---|\n")
		for _, l := range s.Limits {
			fmt.Fprintf(&w, "| %s | %.0f MB/s | %.0f MB/s | %.0f MB/s | %.0f us (%.0f) | %.0f / %.0f us | %.0f KiB, %.0f us (%.0f KiB, %.0f us) |\n",
				l.When, l.SeqWriteSyncMBs, l.SeqWriteEndMBs, l.SeqReadMBs, l.RandRead4K.P50, l.RandRead4KIOPS, l.Append4KSync.P50, l.Append4KSync.P99,
				l.MmapFaultKiB, l.MmapFaultUs, l.MmapRandomFaultKiB, l.MmapRandomFaultUs)
		}
		seqW := limitMean(s.Limits, func(l Limits) float64 { return l.SeqWriteSyncMBs })
		rr := limitMean(s.Limits, func(l Limits) float64 { return l.RandRead4K.P50 })
		ap := limitMean(s.Limits, func(l Limits) float64 { return l.Append4KSync.P50 })
		fmt.Fprintf(&w, "\nFractions (x) use the mean of the two limit runs: bulk write / %.0f MB/s; steady append p50 as floor / engine with floor = 4 KiB append + fdatasync p50 %.0f us; cold get p50 as floor / engine with floor = 4 KiB random read p50 %.0f us.\n\n", seqW, ap, rr)
		w.WriteString("| engine | colls | bulk write MB/s (x limit) | bulk CPU s | bulk batch p50 / p99 ms | first append ms | steady append p50 / p99 ms (x floor) | warm get ns | cold get p50 / p99 us (x floor) | cold read KiB/get | get_many 1000 cold / warm ms | reopen to first read cold / warm ms | disk MB | peak RSS MiB |\n")
		w.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, c := range cells(s) {
			if e := c.err(); e != "" && len(c.rs) == 1 {
				fmt.Fprintf(&w, "| %s | %d | failed: %s ||||||||||||\n", c.name, c.colls, strings.ReplaceAll(tail(e, 200), "|", "/"))
				continue
			}
			bulk := c.med(func(r Result) float64 { return r.BulkMBs })
			apP50 := c.med(func(r Result) float64 { return r.Append.P50 })
			cg := c.med(func(r Result) float64 { return r.ColdGet.P50 })
			fmt.Fprintf(&w, "| %s | %d | %.1f (%.2f) | %.1f | %.2f / %.2f | %.2f | %.2f / %.2f (%.2f) | %.0f | %.0f / %.0f (%.2f) | %.1f | %.1f / %.2f | %.1f / %.1f | %.1f | %.0f |\n",
				c.name, c.colls, bulk, bulk/seqW, c.med(func(r Result) float64 { return r.BulkCPU }),
				c.med(func(r Result) float64 { return r.BulkBatch.P50 })/1e3, c.med(func(r Result) float64 { return r.BulkBatch.P99 })/1e3,
				c.med(func(r Result) float64 { return r.FirstAppendUs })/1e3,
				apP50/1e3, c.med(func(r Result) float64 { return r.Append.P99 })/1e3, ap/apP50,
				c.med(func(r Result) float64 { return r.WarmGetNs }),
				cg, c.med(func(r Result) float64 { return r.ColdGet.P99 }), rr/cg,
				c.med(func(r Result) float64 { return float64(r.ColdReadBytes) / 1024 / float64(max(1, r.ColdGets)) }),
				c.med(func(r Result) float64 { return r.ColdGetManyUs })/1e3, c.med(func(r Result) float64 { return r.WarmGetMany.P50 })/1e3,
				c.med(func(r Result) float64 { return r.ReopenColdUs })/1e3, c.med(func(r Result) float64 { return r.ReopenWarmUs })/1e3,
				c.med(func(r Result) float64 { return float64(r.DiskAlloc) / 1e6 }),
				c.med(func(r Result) float64 { return float64(r.PeakRSSKiB) / 1024 }))
		}
		ratioTable(&w, cells(s))
		fmt.Fprintf(&w, "\nRun order (alternating between passes): %s.\n\n", strings.Join(s.Order, ", "))
	}
	w.WriteString("Engine settings (defaults unless stated):\n\n")
	for _, n := range engineNames {
		if v, ok := run.Settings[n]; ok {
			fmt.Fprintf(&w, "- %s: %s\n", n, v)
		}
	}
	w.WriteString(`
Definitions: bulk write = payload bytes / time inside the durable batch commits (open excluded); bulk CPU = user + system CPU seconds of the process over the bulk write (record generation included, the same for every engine). First append = the first durable batch of new records after a reopen; steady append = the following batches. Warm get = mean ns per Get over a pass of keys already read once (median of 5 passes). Cold get = Get of distinct random keys after closing the store, evicting and reopening it, with every file of the store evicted again (fsync + posix_fadvise(DONTNEED)) before each get; the engine's own caches and pages it still has mapped are kept, as in a running server. "cold read KiB/get" is /proc/self/io read_bytes per cold get: what the device actually read, read-ahead included (a near-zero value would mean the read was not cold). get_many = 1000 keys of one collection, sorted by ID, cold once after an evicted reopen, then warm (median of repeats). Reopen = Open until the first successful Get, after eviction (cold) and with the files cached (warm). Disk = allocated bytes (st_blocks) after the bulk load and Close. Peak RSS = getrusage max RSS of the child process running that engine (the harness itself is included, and mmap-based engines count the file pages they touch).
`)
	return w.String()
}

func plots(out string, s SizeRun) error {
	cs := cells(s)
	var names []string
	for _, n := range engineNames {
		if slices.ContainsFunc(cs, func(c cell) bool { return c.name == n }) {
			names = append(names, n)
		}
	}
	series := func(colls int, f func(Result) float64) plotter.Values {
		v := make(plotter.Values, len(names))
		for i, n := range names {
			for _, c := range cs {
				if c.name == n && c.colls == colls {
					v[i] = c.med(f)
				}
			}
		}
		return v
	}
	type ser struct {
		label string
		f     func(Result) float64
		colls int
	}
	bar := func(file, title, ylabel string, ss []ser, hline float64, hlabel string) error {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s (%d MB payload)", title, s.PayloadMB)
		p.Y.Label.Text = ylabel
		barplot.Grid(p, false)
		// Each group of bars takes 70% of its slot, so the outer bars stay inside
		// the X range instead of being cut at the edge.
		slot := (8*vg.Inch - vg.Points(60)) / vg.Length(max(1, len(names)))
		w := slot * 0.7 / vg.Length(len(ss))
		var entries []barplot.Entry
		all := []float64{hline}
		for i, x := range ss {
			b := &barplot.Bars{Values: series(x.colls, x.f), Width: w, Color: plotutil.Color(i),
				Offset: w * vg.Length(float64(i)-float64(len(ss)-1)/2)}
			all = append(all, b.Values...)
			p.Add(b)
			if slices.ContainsFunc(b.Values, func(v float64) bool { return v > 0 }) {
				entries = append(entries, barplot.Entry{Label: x.label, Thumb: b}) // a run without this series has no entry
			}
		}
		// Values spanning decades (a 25 ms engine beside 100 µs ones) get a log
		// axis, on which the small bars and the disk's floor stay visible.
		barplot.ScaleY(p, all...)
		if hline > 0 {
			l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: hline}, {X: float64(len(names)) - 0.5, Y: hline}})
			if err != nil {
				return err
			}
			l.Color = color.RGBA{R: 200, A: 255}
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			p.Add(l)
			entries = append(entries, barplot.Entry{Label: hlabel, Thumb: l})
		}
		p.NominalX(names...)
		p.X.Min, p.X.Max = -0.5, float64(len(names))-0.5
		p.X.Tick.Label.Rotation = 0.5
		p.X.Tick.Label.XAlign = -1
		p.X.Tick.Label.YAlign = -0.5
		return barplot.SavePNG(p, entries, 8*vg.Inch, 5*vg.Inch, filepath.Join(out, fmt.Sprintf("%dMB-%s.png", s.PayloadMB, file)))
	}
	seqW := limitMean(s.Limits, func(l Limits) float64 { return l.SeqWriteSyncMBs })
	rr := limitMean(s.Limits, func(l Limits) float64 { return l.RandRead4K.P50 })
	ap := limitMean(s.Limits, func(l Limits) float64 { return l.Append4KSync.P50 })
	bulk := func(r Result) float64 { return r.BulkMBs }
	if err := bar("bulk-write", "Bulk durable write", "MB/s", []ser{{"1 collection", bulk, 1}, {"32 collections", bulk, 32}}, seqW, "seq write + fdatasync per 512 KiB"); err != nil {
		return err
	}
	p50 := func(r Result) float64 { return r.Append.P50 / 1e3 }
	p99 := func(r Result) float64 { return r.Append.P99 / 1e3 }
	if err := bar("append-p50", "Steady append batch latency p50", "ms", []ser{{"1 collection", p50, 1}, {"32 collections", p50, 32}}, ap/1e3, "4 KiB append + fdatasync p50"); err != nil {
		return err
	}
	if err := bar("append-p99", "Steady append batch latency p99", "ms", []ser{{"1 collection", p99, 1}, {"32 collections", p99, 32}}, 0, ""); err != nil {
		return err
	}
	gm := func(r Result) float64 { return r.ColdGetManyUs / 1e3 }
	if err := bar("get-many-cold", "get_many of 1000 keys, cold", "ms", []ser{{"1 collection", gm, 1}, {"32 collections", gm, 32}}, 0, ""); err != nil {
		return err
	}
	cold := func(r Result) float64 { return r.ColdGet.P50 }
	if err := bar("cold-get", "Cold point get p50", "µs", []ser{{"1 collection", cold, 1}, {"32 collections", cold, 32}}, rr, "4 KiB random read QD1 p50"); err != nil {
		return err
	}
	warm := func(r Result) float64 { return r.WarmGetNs }
	if err := bar("warm-get", "Warm point get", "ns", []ser{{"1 collection", warm, 1}, {"32 collections", warm, 32}}, 0, ""); err != nil {
		return err
	}
	rss := func(r Result) float64 { return float64(r.PeakRSSKiB) / 1024 }
	disk := func(r Result) float64 { return float64(r.DiskAlloc) / 1e6 }
	if err := bar("disk", "Disk space after the bulk load", "MB allocated", []ser{{"1 collection", disk, 1}, {"32 collections", disk, 32}}, float64(s.PayloadMB)*1.048576, "payload"); err != nil {
		return err
	}
	return bar("peak-rss", "Peak RSS of the engine's process", "MiB", []ser{{"1 collection", rss, 1}, {"32 collections", rss, 32}}, 0, "")
}

// ratioTable writes each engine's figures divided by packstore-full's with the
// same collection count (medians of the repeats): above 1 means more of that
// figure than packstore-full (faster for bulk write, slower or bigger for the
// rest).
func ratioTable(w *strings.Builder, cs []cell) {
	figures := []struct {
		name string
		f    func(Result) float64
	}{
		{"bulk write MB/s", func(r Result) float64 { return r.BulkMBs }},
		{"steady append p50", func(r Result) float64 { return r.Append.P50 }},
		{"warm get", func(r Result) float64 { return r.WarmGetNs }},
		{"cold get p50", func(r Result) float64 { return r.ColdGet.P50 }},
		{"get_many warm", func(r Result) float64 { return r.WarmGetMany.P50 }},
		{"reopen cold", func(r Result) float64 { return r.ReopenColdUs }},
		{"disk", func(r Result) float64 { return float64(r.DiskAlloc) }},
		{"peak RSS", func(r Result) float64 { return float64(r.PeakRSSKiB) }},
	}
	w.WriteString("\nRatios to packstore-full with the same collection count (engine / packstore-full; for bulk write above 1 is faster, for the others above 1 is slower or bigger):\n\n| engine | colls |")
	for _, f := range figures {
		w.WriteString(" " + f.name + " |")
	}
	w.WriteString("\n|---|---|" + strings.Repeat("---|", len(figures)) + "\n")
	for _, c := range cs {
		i := slices.IndexFunc(cs, func(b cell) bool { return b.name == "packstore-full" && b.colls == c.colls })
		if i < 0 || c.err() != "" || cs[i].err() != "" {
			continue
		}
		fmt.Fprintf(w, "| %s | %d |", c.name, c.colls)
		for _, f := range figures {
			fmt.Fprintf(w, " %.2f |", c.med(f.f)/cs[i].med(f.f))
		}
		w.WriteString("\n")
	}
}
