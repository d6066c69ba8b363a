package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"syscall"
	"time"
)

// Params of one cell (engine x shape x size); the parent passes them to a
// child process so each engine's peak RSS and page-cache state are its own.
type Params struct {
	Engine        string `json:"engine"`
	Colls         int    `json:"collections"`
	PayloadBytes  int64  `json:"payload_bytes"`
	Seed          uint64 `json:"seed"`
	Batch         int    `json:"bulk_batch_records"`
	AppendBatch   int    `json:"append_batch_records"`
	AppendBatches int    `json:"append_batches"`
	ColdGets      int    `json:"cold_gets"`
	WarmGets      int    `json:"warm_gets"`
	GetManyKeys   int    `json:"get_many_keys"`
	GetManyReps   int    `json:"get_many_reps"`
	Profile       string `json:"profile,omitempty"` // write a CPU profile of the bulk write here
	Dir           string `json:"-"`
}

// Result of one cell. Latencies in microseconds unless named otherwise.
type Result struct {
	Params
	Settings      string    `json:"settings"`
	Records       int       `json:"records"`
	BulkSeconds   float64   `json:"bulk_seconds"`
	BulkMBs       float64   `json:"bulk_mb_s"`
	BulkCPU       float64   `json:"bulk_cpu_seconds"` // user+system CPU of the process during the bulk write
	BulkBatchUs   []float64 `json:"bulk_batch_us"`
	BulkBatch     Summary   `json:"bulk_batch_summary_us"`
	CloseSeconds  float64   `json:"close_after_bulk_seconds"`
	DiskAlloc     int64     `json:"disk_bytes_allocated"`
	DiskApparent  int64     `json:"disk_bytes_apparent"`
	ReopenColdUs  float64   `json:"reopen_cold_to_first_read_us"`
	ReopenWarmUs  float64   `json:"reopen_warm_to_first_read_us"`
	ReopenReadB   int64     `json:"reopen_cold_storage_read_bytes"`
	OpenReport    string    `json:"open_report,omitempty"`
	ColdGetUs     []float64 `json:"cold_get_us"`
	ColdGet       Summary   `json:"cold_get_summary_us"`
	ColdReadBytes int64     `json:"cold_get_storage_read_bytes"` // /proc/self/io read_bytes summed over the timed cold gets
	ColdGetManyUs float64   `json:"cold_get_many_us"`
	ColdGMBytes   int64     `json:"cold_get_many_storage_read_bytes"`
	WarmGetManyUs []float64 `json:"warm_get_many_us"`
	WarmGetMany   Summary   `json:"warm_get_many_summary_us"`
	WarmGetNsPass []float64 `json:"warm_get_ns_per_pass"` // mean ns/get of each timed pass
	WarmGetNs     float64   `json:"warm_get_ns"`          // median of the passes
	FirstAppendUs float64   `json:"first_append_us"`
	AppendUs      []float64 `json:"steady_append_us"`
	Append        Summary   `json:"steady_append_summary_us"`
	BaseRSSKiB    int64     `json:"harness_rss_before_open_kib"`
	PeakRSSKiB    int64     `json:"peak_rss_kib"` // filled in by the parent (getrusage of the child)
	Error         string    `json:"error,omitempty"`
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func check(r rec, got []byte, what string) error {
	if !bytes.Equal(got, r.Data) {
		return fmt.Errorf("%s: record %x: got %d bytes, want %d", what, r.ID, len(got), len(r.Data))
	}
	return nil
}

// runCell measures one cell in phases, each on the store the one before left:
// bulkWrite, coldReopen, coldGets, getMany, warmGets, warmReopen, appends.
func runCell(p Params) (res Result, err error) {
	res.Params = p
	res.Settings = engineSettings[p.Engine]
	res.BaseRSSKiB = vmRSS()
	n := recordsFor(p.Seed, p.PayloadBytes)
	res.Records = n
	if err := os.MkdirAll(p.Dir, 0o755); err != nil {
		return res, err
	}
	e, err := newEngine(p.Engine)
	if err != nil {
		return res, err
	}
	if err := e.Open(p.Dir, p.Colls); err != nil {
		return res, fmt.Errorf("open: %w", err)
	}
	c := &cellRun{p: p, e: e, res: &res, n: n}
	if err := c.bulkWrite(); err != nil {
		return res, err
	}
	c.rng = rand.New(rand.NewPCG(p.Seed^0x9e3779b97f4a7c15, 1))
	c.first = recordAt(p.Seed, c.rng.IntN(n), p.Colls)
	for _, phase := range []func() error{c.coldReopen, c.coldGets, c.getMany, c.warmGets, c.warmReopen, c.appends} {
		if err := phase(); err != nil {
			return res, err
		}
	}
	return res, e.Close()
}

// cellRun is one cell's run: its parameters, its engine, the result being filled
// in, and what the phases share.
type cellRun struct {
	p     Params
	e     Engine
	res   *Result
	n     int        // records of the bulk write
	batch []rec      // the write batch, reused
	rng   *rand.Rand // picks the records read, after the bulk write
	first rec        // the record the reopens read first
}

// bulkWrite is phase 1, the bulk durable write: batches of p.Batch records,
// fsync per batch (a CPU profile of it with p.Profile); then the close and the
// disk usage.
func (c *cellRun) bulkWrite() error {
	p, e, res, n := c.p, c.e, c.res, c.n
	var payload int64
	var total time.Duration
	c.batch = make([]rec, 0, p.Batch)
	cpu0 := cpuSeconds()
	if p.Profile != "" {
		f, err := os.Create(filepath.Join(p.Profile, fmt.Sprintf("bulk-%s-%d.pprof", p.Engine, p.Colls)))
		if err != nil {
			return err
		}
		defer f.Close()
		pprof.StartCPUProfile(f)
	}
	for i := 0; i < n; {
		c.batch = c.batch[:0]
		for ; i < n && len(c.batch) < p.Batch; i++ {
			r := recordAt(p.Seed, i, p.Colls)
			payload += int64(len(r.Data))
			c.batch = append(c.batch, r)
		}
		t := time.Now()
		if err := e.Write(c.batch); err != nil {
			return fmt.Errorf("bulk write: %w", err)
		}
		d := time.Since(t)
		total += d
		res.BulkBatchUs = append(res.BulkBatchUs, us(d))
	}
	res.BulkCPU = cpuSeconds() - cpu0
	if p.Profile != "" {
		pprof.StopCPUProfile()
	}
	res.BulkSeconds = total.Seconds()
	res.BulkMBs = float64(payload) / 1e6 / total.Seconds()
	res.BulkBatch = summarize(res.BulkBatchUs)
	t := time.Now()
	if err := e.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	res.CloseSeconds = time.Since(t).Seconds()
	if d, ok := e.(interface{ Disk() (int64, int64, error) }); ok {
		var err error
		if res.DiskAlloc, res.DiskApparent, err = d.Disk(); err != nil {
			return fmt.Errorf("disk: %w", err)
		}
	} else {
		res.DiskAlloc, res.DiskApparent = diskUsage(p.Dir)
	}
	return nil
}

// coldReopen is phase 2: evict the files, open, time to the first successful
// read.
func (c *cellRun) coldReopen() error {
	p, e, res := c.p, c.e, c.res
	if err := evict(e, p.Dir); err != nil {
		return fmt.Errorf("evict: %w", err)
	}
	r0, _ := procIO()
	t := time.Now()
	if err := e.Open(p.Dir, p.Colls); err != nil {
		return fmt.Errorf("reopen: %w", err)
	}
	got, err := e.Get(c.first.Coll, c.first.ID)
	res.ReopenColdUs = us(time.Since(t))
	r1, _ := procIO()
	res.ReopenReadB = r1 - r0
	if rp, ok := e.(interface{ Report() string }); ok {
		res.OpenReport = rp.Report()
	}
	if err != nil {
		return fmt.Errorf("first read: %w", err)
	}
	return check(c.first, got, "first read")
}

// coldGets is phase 3, cold point gets: distinct random records, right after the
// reopen, each after evicting the store's files from the page cache.
func (c *cellRun) coldGets() error {
	p, e, res := c.p, c.e, c.res
	for k := 0; k < p.ColdGets; k++ {
		r := recordAt(p.Seed, c.rng.IntN(c.n), p.Colls)
		// Evict before every get: with the device's read-ahead (8 MiB here)
		// one faulting read can pull most of a small store into the cache.
		// Pages the process has mapped and the engine's own caches stay.
		if err := evict(e, p.Dir); err != nil {
			return err
		}
		b0, _ := procIO()
		t := time.Now()
		got, err := e.Get(r.Coll, r.ID)
		d := time.Since(t)
		b1, _ := procIO()
		if err != nil {
			return fmt.Errorf("cold get: %w", err)
		}
		res.ColdReadBytes += b1 - b0
		if err := check(r, got, "cold get"); err != nil {
			return err
		}
		res.ColdGetUs = append(res.ColdGetUs, us(d))
	}
	res.ColdGet = summarize(res.ColdGetUs)
	return nil
}

// getMany is phase 4: close, evict, warm-free reopen, then get_many of
// p.GetManyKeys keys of collection 0 (cold once, then warm repeats).
func (c *cellRun) getMany() error {
	p, e, res, n := c.p, c.e, c.res, c.n
	if err := e.Close(); err != nil {
		return err
	}
	if err := evict(e, p.Dir); err != nil {
		return err
	}
	if err := e.Open(p.Dir, p.Colls); err != nil {
		return err
	}
	var many []rec
	for i := c.rng.IntN(n); len(many) < p.GetManyKeys && len(many) < n; i = (i + 1) % n {
		if r := recordAt(p.Seed, i, p.Colls); r.Coll == 0 {
			many = append(many, r)
		}
	}
	slices.SortFunc(many, func(a, b rec) int { return bytes.Compare(a.ID[:], b.ID[:]) })
	ids := make([][16]byte, len(many))
	for i, r := range many {
		ids[i] = r.ID
	}
	getMany := func() (time.Duration, error) {
		t := time.Now()
		out, err := e.GetMany(0, ids)
		d := time.Since(t)
		if err != nil {
			return d, err
		}
		for i, r := range many {
			if err := check(r, out[i], "get_many"); err != nil {
				return d, err
			}
		}
		return d, nil
	}
	r0, _ := procIO()
	d, err := getMany()
	if err != nil {
		return err
	}
	r1, _ := procIO()
	res.ColdGetManyUs, res.ColdGMBytes = us(d), r1-r0
	for k := 0; k < p.GetManyReps; k++ {
		d, err := getMany()
		if err != nil {
			return err
		}
		res.WarmGetManyUs = append(res.WarmGetManyUs, us(d))
	}
	res.WarmGetMany = summarize(res.WarmGetManyUs)
	return nil
}

// warmGets is phase 5, warm point gets: p.WarmGets random records, one untimed
// pass to load them, then five timed passes (mean ns per get of each).
func (c *cellRun) warmGets() error {
	p, e, res := c.p, c.e, c.res
	warm := make([]rec, p.WarmGets)
	for k := range warm {
		r := recordAt(p.Seed, c.rng.IntN(c.n), p.Colls)
		r.Data = nil
		warm[k] = r
	}
	for pass := 0; pass < 6; pass++ {
		t := time.Now()
		for _, r := range warm {
			if _, err := e.Get(r.Coll, r.ID); err != nil {
				return fmt.Errorf("warm get: %w", err)
			}
		}
		if pass > 0 {
			res.WarmGetNsPass = append(res.WarmGetNsPass, float64(time.Since(t).Nanoseconds())/float64(len(warm)))
		}
	}
	res.WarmGetNs = summarize(res.WarmGetNsPass).P50
	return nil
}

// warmReopen is phase 6: close and reopen with the files in the page cache, time
// to the first read.
func (c *cellRun) warmReopen() error {
	p, e := c.p, c.e
	if err := e.Close(); err != nil {
		return err
	}
	t := time.Now()
	if err := e.Open(p.Dir, p.Colls); err != nil {
		return err
	}
	if _, err := e.Get(c.first.Coll, c.first.ID); err != nil {
		return err
	}
	c.res.ReopenWarmUs = us(time.Since(t))
	return nil
}

// appends is phase 7, appends after the reopen: the first batch, then steady
// batches of p.AppendBatch new records, each durable; the last record is read
// back.
func (c *cellRun) appends() error {
	p, e, res := c.p, c.e, c.res
	next := c.n
	for k := 0; k <= p.AppendBatches; k++ {
		c.batch = c.batch[:0]
		for j := 0; j < p.AppendBatch; j++ {
			c.batch = append(c.batch, recordAt(p.Seed, next, p.Colls))
			next++
		}
		t := time.Now()
		if err := e.Write(c.batch); err != nil {
			return fmt.Errorf("append: %w", err)
		}
		d := us(time.Since(t))
		if k == 0 {
			res.FirstAppendUs = d
		} else {
			res.AppendUs = append(res.AppendUs, d)
		}
	}
	res.Append = summarize(res.AppendUs)
	last := c.batch[len(c.batch)-1]
	got, err := e.Get(last.Coll, last.ID)
	if err != nil {
		return fmt.Errorf("read after append: %w", err)
	}
	return check(last, got, "read after append")
}

// evict drops the store from every cache the cold measurements must miss: the
// engine's own way (pgstore: restart the server) or its files from the page
// cache.
func evict(e Engine, dir string) error {
	if ev, ok := e.(interface{ Evict() error }); ok {
		return ev.Evict()
	}
	return evictDir(dir)
}
