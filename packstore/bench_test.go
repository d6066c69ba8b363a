package packstore

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkPutManySync: batches of 1000 records of 500 bytes (random, so
// zstd does not shrink them) then Sync; SetBytes counts payload bytes, so
// MB/s is durable ingest throughput. Record IDs are uniformly random, as
// the index assumes (IDs are hashes): idN's IDs share their first byte and
// so one home-bucket run, which made every insert probe a long cluster
// (the 12 MB/s first measured here was mostly that).
func BenchmarkPutManySync(b *testing.B) {
	s := openStore(b, Options{Dir: b.TempDir(), MaxShardBytes: 64 << 20, Compress: true})
	defer s.Close()
	r := rand.New(rand.NewPCG(1, 1))
	recs := make([]Record, 1000)
	for i := range recs {
		recs[i].Data = payload(r, 500, false)
	}
	b.SetBytes(int64(len(recs) * 500))
	n := 0
	for b.Loop() {
		for i := range recs {
			recs[i].ID = randID(r)
			n++
		}
		if err := s.PutMany(idN(1, n%32), recs); err != nil {
			b.Fatal(err)
		}
		if err := s.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(s.Stats().DiskBytes)/float64(n), "disk-bytes/record")
}

func benchStore(b *testing.B, n int, cache int64) (*PackfileStorage, ID, []ID) {
	s := openStore(b, Options{Dir: b.TempDir(), MaxShardBytes: 64 << 20, CacheBytes: cache})
	r := rand.New(rand.NewPCG(2, 2))
	c := idN(1, 0)
	ids := make([]ID, n)
	recs := make([]Record, 0, 1000)
	for i := range ids {
		ids[i] = randID(r)
		recs = append(recs, Record{ID: ids[i], Data: payload(r, 500, false)})
		if len(recs) == cap(recs) || i == n-1 {
			s.PutMany(c, recs)
			recs = recs[:0]
		}
	}
	s.Sync()
	return s, c, ids
}

// BenchmarkGetWarm: Get of records served from the node cache.
func BenchmarkGetWarm(b *testing.B) {
	s, c, ids := benchStore(b, 10000, 64<<20)
	defer s.Close()
	for _, id := range ids {
		s.Get(c, id)
	}
	s.cache.c.Wait()
	h0, m0 := s.cache.hits.Load(), s.cache.misses.Load()
	b.SetBytes(500)
	i := 0
	for b.Loop() {
		if _, err := s.Get(c, ids[i%len(ids)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	h, m := s.cache.hits.Load()-h0, s.cache.misses.Load()-m0
	b.ReportMetric(float64(h)/float64(max(1, h+m)), "cache-hit-ratio")
}

// BenchmarkGetCacheMiss: Get with no node cache: index probe, CRC check of
// the mapped frame (page-cache warm, not cold disk) and a copy.
func BenchmarkGetCacheMiss(b *testing.B) {
	s, c, ids := benchStore(b, 100000, 0)
	defer s.Close()
	b.SetBytes(500)
	r := rand.New(rand.NewPCG(3, 3))
	for b.Loop() {
		if _, err := s.Get(c, ids[r.IntN(len(ids))]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReopen1M: Open of a store of 1M 100-byte records over 32
// collections after a clean Close (checkpoint path) and after the index
// files are removed (full scan path).
func BenchmarkReopen1M(b *testing.B) {
	if testing.Short() {
		b.Skip("writes 1M records")
	}
	dir := b.TempDir()
	opts := Options{Dir: dir, MaxShardBytes: 64 << 20}
	s := openStore(b, opts)
	r := rand.New(rand.NewPCG(4, 4))
	recs := make([]Record, 1000)
	for k := range 1000 {
		for i := range recs {
			recs[i] = Record{ID: randID(r), Data: payload(r, 100, false)}
		}
		s.PutMany(idN(1, k%32), recs)
	}
	s.Close()
	for _, mode := range []string{"checkpoint", "scan"} {
		b.Run(mode, func(b *testing.B) {
			var last time.Duration
			for b.Loop() {
				if mode == "scan" {
					b.StopTimer()
					removeIndexFiles(nil, dir)
					b.StartTimer()
				}
				t0 := time.Now()
				s := openStore(b, opts)
				last = time.Since(t0)
				if got := s.Stats().LiveRecords; got != 1000000 {
					b.Fatalf("%d records", got)
				}
				b.StopTimer()
				s.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(last.Nanoseconds())/1e6, "ms/open")
		})
	}
}

// BenchmarkRawAppendSync is the reference line for BenchmarkPutManySync
// (notes/measuring.md): 1000 random 500-byte records appended to one file
// with a single write and one fdatasync per batch, no framing or index.
func BenchmarkRawAppendSync(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "raw"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	r := rand.New(rand.NewPCG(1, 1))
	buf := payload(r, 1000*500, false)
	b.SetBytes(int64(len(buf)))
	var off int64
	for b.Loop() {
		if _, err := f.WriteAt(buf, off); err != nil {
			b.Fatal(err)
		}
		off += int64(len(buf))
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPutManyMixed is bench's bulk write in miniature: batches of
// 1000 records of 64-1023 bytes, half JSON-like text (textPayload), half
// random, spread over 1 or 32 collections (one PutMany per collection),
// then Sync. It reports the process CPU per batch (cpu-ms/batch, all
// goroutines: on a loaded machine steadier than the wall time) and the
// stored bytes per payload byte (disk-ratio).
func BenchmarkPutManyMixed(b *testing.B) {
	for _, colls := range []int{1, 32} {
		b.Run(fmt.Sprintf("colls=%d", colls), func(b *testing.B) {
			s := openStore(b, DefaultOptions(b.TempDir()))
			defer s.Close()
			r := rand.New(rand.NewPCG(5, 5))
			pool := make([][]byte, 4096)
			for i := range pool {
				n := 64 + r.IntN(960)
				if i%2 == 0 {
					pool[i] = textPayload(r, n)
				} else {
					pool[i] = payload(r, n, false)
				}
			}
			groups := make([][]Record, colls)
			raw := 0
			cpu0 := cpuTime()
			for b.Loop() {
				batch := 0
				for c := range groups {
					groups[c] = groups[c][:0]
				}
				for range 1000 {
					d := pool[r.IntN(len(pool))]
					c := r.IntN(colls)
					groups[c] = append(groups[c], Record{ID: randID(r), Data: d})
					batch += len(d)
				}
				for c, recs := range groups {
					if err := s.PutMany(idN(1, c), recs); err != nil {
						b.Fatal(err)
					}
				}
				if err := s.Sync(); err != nil {
					b.Fatal(err)
				}
				raw += batch
			}
			b.SetBytes(int64(raw / max(1, b.N)))
			b.ReportMetric(float64(cpuTime()-cpu0)/1e6/float64(b.N), "cpu-ms/batch")
			b.ReportMetric(float64(s.Stats().DiskBytes)/float64(raw), "disk-ratio")
		})
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
