package packstore

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/mtxdb/mtxdb/internal/pagecache"
)

var (
	reopenDirFlag  = flag.String("packstore.reopendir", "", "BenchmarkReopenLarge: directory holding (or receiving) the stores; unset skips it")
	reopenMBFlag   = flag.Int("packstore.reopenmb", 1024, "BenchmarkReopenLarge: payload MB of each store")
	reopenRepsFlag = flag.Int("packstore.reopenreps", 7, "BenchmarkReopenLarge: opens per measurement (the median is reported)")
)

// buildReopenStore writes about mb MB of payload in bench's record mix
// (sizes 64-1023 bytes, mean about 520; half compressible; random 16-byte
// IDs) over colls collections, in batches of 1000 records with one Sync
// each, with DefaultOptions, and closes the store. It returns the first
// record's collection and ID. A store already in dir (with index.ckpt) is
// reused.
func buildReopenStore(b *testing.B, dir string, mb, colls int) (ID, ID) {
	r := rand.New(rand.NewPCG(6, 6))
	first := randID(r)
	firstColl := idN(1, 0)
	if _, err := os.Stat(filepath.Join(dir, checkpointFile)); err == nil {
		return firstColl, first
	}
	s := openStore(b, DefaultOptions(dir))
	groups := make([][]Record, colls)
	for total, i := 0, 0; total < mb<<20; {
		for c := range groups {
			groups[c] = groups[c][:0]
		}
		for range 1000 {
			id := first
			if i > 0 {
				id = randID(r)
			}
			n := 64 + r.IntN(192)
			if u := r.IntN(100); u >= 80 {
				n = 768 + r.IntN(256)
			} else if u >= 20 {
				n = 256 + r.IntN(512)
			}
			c := i % colls
			groups[c] = append(groups[c], Record{ID: id, Data: payload(r, n, r.IntN(2) == 0)})
			total += n
			i++
		}
		for c, g := range groups {
			if err := s.PutMany(idN(1, c), g); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	return firstColl, first
}

// BenchmarkReopenLarge times what bench's reopen cell times: Open with
// DefaultOptions until the first successful Get, with the store's files
// evicted from the page cache (cold) and cached (warm), on stores of
// -packstore.reopenmb MB with 1 and 32 collections kept in
// -packstore.reopendir (built on the first run, reused after). It reports
// the medians over -packstore.reopenreps opens of the wall time and of the
// process's CPU time (user + system, every thread: on a loaded machine the
// steadier figure), and "decode" times
// decodeCheckpoint alone over the checkpoint's bytes. Example:
//
//	go test -run '^$' -bench ReopenLarge -benchtime 1x . -packstore.reopendir /tmp/reopen
func BenchmarkReopenLarge(b *testing.B) {
	if *reopenDirFlag == "" {
		b.Skip("-packstore.reopendir is not set")
	}
	for _, colls := range []int{1, 32} {
		dir := filepath.Join(*reopenDirFlag, fmt.Sprintf("mb%d-colls%d", *reopenMBFlag, colls))
		coll, first := buildReopenStore(b, dir, *reopenMBFlag, colls)
		var files []string
		ents, err := os.ReadDir(dir)
		if err != nil {
			b.Fatal(err)
		}
		for _, e := range ents {
			if e.Name() != lockFile {
				files = append(files, filepath.Join(dir, e.Name()))
			}
		}
		// open returns the wall time and the CPU time (user + system, all
		// threads of the process) of one open.
		open := func(cold bool) (time.Duration, time.Duration) {
			if cold {
				if err := pagecache.Evict(files...); err != nil {
					b.Fatal(err)
				}
			}
			c0, t0 := cpuTime(), time.Now()
			s := openStore(b, DefaultOptions(dir))
			if _, err := s.Get(coll, first); err != nil {
				b.Fatal(err)
			}
			d, c := time.Since(t0), cpuTime()-c0
			if src := s.OpenReport().Source; src != "checkpoint" {
				b.Fatalf("Open rebuilt the index from %q", src)
			}
			if err := s.Close(); err != nil {
				b.Fatal(err)
			}
			return d, c
		}
		for _, mode := range []string{"cold", "warm", "decode"} {
			b.Run(fmt.Sprintf("colls=%d/%s", colls, mode), func(b *testing.B) {
				ckpt, err := os.ReadFile(filepath.Join(dir, checkpointFile))
				if err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					var ds, cs []time.Duration
					for range *reopenRepsFlag {
						if mode == "decode" {
							c0, t0 := cpuTime(), time.Now()
							if _, err := decodeCheckpoint(ckpt); err != nil {
								b.Fatal(err)
							}
							ds, cs = append(ds, time.Since(t0)), append(cs, cpuTime()-c0)
							continue
						}
						d, c := open(mode == "cold")
						ds, cs = append(ds, d), append(cs, c)
					}
					slices.Sort(ds)
					slices.Sort(cs)
					b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1e3, "ms/open")
					b.ReportMetric(float64(cs[len(cs)/2].Microseconds())/1e3, "cpu-ms/open")
					b.ReportMetric(float64(len(ckpt))/1e6, "ckpt-MB")
				}
			})
		}
	}
}
