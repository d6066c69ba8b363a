package packstore

import (
	"bytes"
	"errors"
	dto "github.com/prometheus/client_model/go"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestViewKeepsRetiredShardMapped: a reader inside View holds bytes of the
// old index generation while a repack moves the record and retires its
// shard; the bytes stay correct until the view returns, and the shard file
// is deleted only after it.
func TestViewKeepsRetiredShardMapped(t *testing.T) {
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 8 << 10}
	s := openStore(t, opts)
	defer s.Close()
	c, id := idN(1, 0), idN(2, 0)
	want := bytes.Repeat([]byte("view"), 200)
	s.Put(c, id, want)
	for i := 1; i < 20; i++ {
		s.Put(idN(1, 1), idN(2, i), make([]byte, 700)) // roll past shard 0
	}
	done := make(chan error, 1)
	err := s.View(c, id, func(b []byte) error {
		go func() {
			_, err := s.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: c, Records: []ID{id}}, {Collection: idN(1, 1)}}})
			done <- err
		}()
		time.Sleep(50 * time.Millisecond)
		select {
		case err := <-done:
			t.Errorf("repack finished (%v) while a view of its retired shard was open", err)
		default:
		}
		if _, err := os.Stat(shardPath(opts.Dir, 0)); err != nil {
			t.Errorf("shard 0 deleted under a view: %v", err)
		}
		if !bytes.Equal(b, want) {
			t.Error("view bytes changed during repack")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(shardPath(opts.Dir, 0)); !os.IsNotExist(err) {
		t.Fatalf("shard 0 not retired after the view: %v", err)
	}
	mustGet(t, s, c, id, want)
	sentinel := errors.New("stop")
	if err := s.View(c, id, func([]byte) error { return sentinel }); err != sentinel {
		t.Fatalf("View error %v", err)
	}
	if err := s.View(c, idN(9, 9), func([]byte) error { return nil }); !errors.Is(err, ErrNotFound) {
		t.Fatalf("View missing: %v", err)
	}
	mustCheck(t, s)
}

// TestTornAcross4KiBPage: a frame that straddles a 4 KiB page boundary is
// torn after its first page (the crash kept the first page only); reopen
// truncates it and keeps everything before.
func TestTornAcross4KiBPage(t *testing.T) {
	ffs := newFaultFS()
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 64 << 10, fs: ffs}
	s := openStore(t, opts)
	c := idN(1, 0)
	m := model{}
	r := rand.New(rand.NewPCG(41, 42))
	for i := 0; s.active.size < 2*4096+1000; i++ {
		d := payload(r, 700, false)
		s.Put(c, idN(2, i), d)
		m.put(c, idN(2, i), d)
	}
	s.Sync()
	start := s.active.size
	pageEnd := (start/4096 + 1) * 4096
	s.Put(c, idN(3, 0), payload(r, 6000, false)) // crosses pageEnd
	if s.active.size <= pageEnd {
		t.Fatal("frame does not straddle a page")
	}
	s = crashAndReopen(t, s, ffs, opts, func(path string, synced, size int64) int64 {
		if synced == start {
			return pageEnd // the first page of the frame reached the disk
		}
		return synced
	})
	defer s.Close()
	if rep := s.OpenReport(); rep.TruncatedBytes != pageEnd-start {
		t.Fatalf("report %+v, want %d bytes truncated", rep, pageEnd-start)
	}
	mustNotFound(t, s, c, idN(3, 0))
	compareAll(t, s, m, "after torn page")
}

// TestNoTruncationUnderReaders: readers hammer mapped records while the
// writer's appends keep failing half-way (each failure trims the file back
// to its last good frame). Trimming never goes below a mapping, so no
// reader faults (SIGBUS would kill the test binary).
func TestNoTruncationUnderReaders(t *testing.T) {
	ffs := newFaultFS()
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 1 << 20, fs: ffs}
	s := openStore(t, opts)
	c := idN(1, 0)
	want := map[ID][]byte{}
	for i := range 200 {
		want[idN(2, i)] = bytes.Repeat([]byte{byte(i)}, 300)
		s.Put(c, idN(2, i), want[idN(2, i)])
	}
	s.Close()
	opts.fs = ffs
	s = openStore(t, opts) // maps the active shard up to its size
	defer s.Close()
	var fail atomic.Bool
	ffs.write = func(path string, off int64, n int) (int, error) {
		if fail.Load() {
			return n / 2, errENOSPC
		}
		return n, nil
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Int32
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; ; i = (i + 7) % 200 {
				select {
				case <-stop:
					return
				default:
				}
				if got, err := s.Get(c, idN(2, i)); err != nil || !bytes.Equal(got, want[idN(2, i)]) {
					bad.Add(1)
				}
			}
		}()
	}
	for i := range 300 {
		fail.Store(i%2 == 0)
		s.Put(c, idN(3, i), make([]byte, 5000))
		for j := range s.shards {
			if sh := s.shards[j].Load(); sh != nil && int64(len(sh.mm)) > sh.size {
				t.Fatalf("shard %d mapped %d bytes past its size %d", j, len(sh.mm), sh.size)
			}
		}
	}
	close(stop)
	wg.Wait()
	if bad.Load() > 0 {
		t.Fatalf("%d bad reads", bad.Load())
	}
	fail.Store(false)
	mustCheck(t, s)
}

// TestSlotOffsetLimits: offsets are stored +1 in 28 bits, so 2^28-2 is the
// largest that round-trips; 2^28-1 and 2^28 do not fit, and no frame can
// start there because a shard is at most 2^28-1 bytes and a frame at
// least 45. A record that would cross MaxShardBytes goes to the next shard.
func TestSlotOffsetLimits(t *testing.T) {
	id := idN(2, 7)
	for _, off := range []uint32{HeaderSize, 1<<28 - 2} {
		l := loc{shard: 4095, off: off}
		if got := slotLoc(makeSlot(id, l)); got != l || !slotFits(l) {
			t.Fatalf("offset %d: round trip %+v", off, got)
		}
	}
	for _, off := range []uint32{1<<28 - 1, 1 << 28} {
		if slotFits(loc{shard: 1, off: off}) {
			t.Fatalf("offset %d claimed to fit the slot", off)
		}
	}
	if MaxShardBytesLimit-FrameOverhead >= 1<<28-1 {
		t.Fatal("a frame could start at an offset the slot cannot hold")
	}
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 16 << 10}
	s := openStore(t, opts)
	defer s.Close()
	c := idN(1, 0)
	s.Put(c, idN(2, 0), make([]byte, 16<<10-HeaderSize-FrameOverhead-100))
	room := opts.MaxShardBytes - s.active.size
	s.Put(c, idN(2, 1), make([]byte, room-FrameOverhead)) // exactly fills shard 0
	if s.active.id != 0 || s.active.size != opts.MaxShardBytes {
		t.Fatalf("exact fit: shard %d size %d", s.active.id, s.active.size)
	}
	s.Put(c, idN(2, 2), nil) // would cross the limit by 45 bytes
	if s.active.id != 1 || s.active.size != HeaderSize+FrameOverhead {
		t.Fatalf("crossing record: shard %d size %d", s.active.id, s.active.size)
	}
	mustGet(t, s, c, idN(2, 2), nil)
	mustCheck(t, s)
}

func TestIndexStatsAndNeedsRepack(t *testing.T) {
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 8 << 10, CacheBytes: 1 << 20}
	s := openStore(t, opts)
	defer s.Close()
	a, b := idN(1, 0), idN(1, 1)
	var keep []ID
	for i := range 100 {
		s.Put(a, idN(2, i), make([]byte, 600)) // a dominates every shard
		s.Put(b, idN(2, i), make([]byte, 200))
		if i%10 == 0 {
			keep = append(keep, idN(2, i))
		}
	}
	s.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: a, Records: keep}}})
	colls, shards, err := s.IndexStats()
	if err != nil {
		t.Fatal(err)
	}
	if len(colls) != 2 || colls[0].Records+colls[1].Records != 110 {
		t.Fatalf("collections %+v", colls)
	}
	var live int64
	for _, sh := range shards {
		live += sh.LiveBytes
	}
	if live != colls[0].Bytes+colls[1].Bytes {
		t.Fatalf("shard live bytes %d, collections %d", live, colls[0].Bytes+colls[1].Bytes)
	}
	na, _ := s.NeedsRepack(a)
	nb, _ := s.NeedsRepack(b)
	if na || !nb {
		t.Fatalf("NeedsRepack: repacked a=%v, interleaved b=%v", na, nb)
	}
	// Cache: second read of the same record hits.
	s.Get(b, idN(2, 3))
	s.cache.c.Wait()
	h := s.cache.hits.Load()
	mustGet(t, s, b, idN(2, 3), make([]byte, 200))
	if s.cache.hits.Load() != h+1 {
		t.Fatal("warm Get missed the cache")
	}
}

// TestPrometheusCollector: a registry gathers every metric the collector
// describes, with the shard sizes, the cache counters and one sync latency
// sample per Sync.
func TestPrometheusCollector(t *testing.T) {
	s := openStore(t, Options{Dir: t.TempDir(), CacheBytes: 1 << 20})
	defer s.Close()
	s.Put(idN(1, 0), idN(2, 0), []byte("x"))
	s.Get(idN(1, 0), idN(2, 0))
	for range 3 {
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(s))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		got[f.GetName()] = f
	}
	for _, name := range []string{"packstore_shard_bytes", "packstore_live_records", "packstore_cache_misses_total",
		"packstore_index_load_factor", "packstore_collections", "packstore_sync_duration_seconds"} {
		if got[name] == nil {
			t.Errorf("no %s among %d families", name, len(fams))
		}
	}
	if f := got["packstore_sync_duration_seconds"]; f != nil {
		h := f.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() != 3 || h.GetSampleSum() <= 0 || len(h.GetBucket()) != len(syncBuckets) {
			t.Errorf("sync histogram: %d samples, sum %v, %d buckets", h.GetSampleCount(), h.GetSampleSum(), len(h.GetBucket()))
		}
	}
}

// TestLatencyHist: durations land in the first bucket whose bound they do not
// exceed, cumulatively; one above every bound counts only in the total.
func TestLatencyHist(t *testing.T) {
	var h latencyHist
	for _, d := range []time.Duration{50 * time.Microsecond, 100 * time.Microsecond, 150 * time.Microsecond, 3 * time.Millisecond, time.Minute} {
		h.observe(d)
	}
	n, sum, cum := h.snapshot()
	if n != 5 || sum < 60 || sum > 60.01 {
		t.Fatalf("count %d sum %v", n, sum)
	}
	for ub, want := range map[float64]uint64{0.0001: 2, 0.0002: 3, 0.0016: 3, 0.0032: 4, syncBuckets[len(syncBuckets)-1]: 4} {
		if cum[ub] != want {
			t.Errorf("bucket <= %v: %d, want %d", ub, cum[ub], want)
		}
	}
}
