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
	coldMBFlag     = flag.Int("packstore.coldmb", 128, "BenchmarkColdRead: store size in MB")
	coldRoundsFlag = flag.Int("packstore.coldrounds", 5, "BenchmarkColdRead: rounds (each runs every setting once, order rotated)")
)

// coldSettings are the read-ahead settings BenchmarkColdRead compares.
var coldSettings = []struct {
	name string
	set  func(*Options)
}{
	{"kernel", func(o *Options) { o.ReadAhead = ReadAheadKernel }},
	// MADV_RANDOM without the explicit read-ahead of forward runs and of
	// repack input (MADV_SEQUENTIAL during scans stays).
	{"madvonly", func(o *Options) { o.ReadAhead, o.raMax = ReadAheadRandom, -1 }},
	{"random", func(o *Options) { o.ReadAhead = ReadAheadRandom }},
}

// coldColls is how many collections the records of buildColdStore are
// spread over, in turn (record i is in collection idN(1, i%coldColls)), as
// rooms share the pool of a server.
const coldColls = 4

// buildColdStore writes about mb MB of records of 500 to 3000 random
// (incompressible) bytes and closes the store. It returns the record IDs
// in write (file) order.
func buildColdStore(b *testing.B, dir string, mb int) []ID {
	s := openStore(b, Options{Dir: dir})
	r := rand.New(rand.NewPCG(5, 5))
	var ids []ID
	for total := 0; total < mb<<20; {
		rec := Record{ID: randID(r), Data: payload(r, 500+r.IntN(2501), false)}
		if err := s.Put(idN(1, len(ids)%coldColls), rec.ID, rec.Data); err != nil {
			b.Fatal(err)
		}
		ids = append(ids, rec.ID)
		total += len(rec.Data) + FrameOverhead
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	return ids
}

// coldRun evicts the shard files, opens the store with opts (by full scan
// when scan, and then the open is the measured operation), evicts again,
// checks with mincore that no shard page is resident, and times fn. It
// returns the wall time and the bytes this process read from disk
// (/proc/self/io read_bytes).
func coldRun(b *testing.B, opts Options, files []string, scan bool, fn func(s *PackfileStorage) error) (time.Duration, int64) {
	if scan {
		removeIndexFiles(b, opts.Dir)
	}
	evict := func() {
		if err := pagecache.Evict(files...); err != nil {
			b.Fatal(err)
		}
		if n, err := pagecache.Resident(files...); err != nil || n != 0 {
			b.Fatalf("after eviction: %d shard pages resident, %v", n, err)
		}
	}
	var s *PackfileStorage
	if !scan {
		s = openStore(b, opts)
		defer s.Close()
	}
	evict()
	rb0, err := pagecache.ReadBytes()
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	if scan {
		s = openStore(b, opts)
		defer s.Close()
	} else if err := fn(s); err != nil {
		b.Fatal(err)
	}
	wall := time.Since(t0)
	rb1, err := pagecache.ReadBytes()
	if err != nil {
		b.Fatal(err)
	}
	return wall, rb1 - rb0
}

// copyStore copies the store files of src into dst, fsynced (so that
// eviction can drop them), and returns the copied shard files.
func copyStore(b *testing.B, src, dst string) []string {
	ents, err := os.ReadDir(src)
	if err != nil {
		b.Fatal(err)
	}
	var shards []string
	for _, e := range ents {
		if e.Name() == lockFile {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			b.Fatal(err)
		}
		p := filepath.Join(dst, e.Name())
		f, err := os.Create(p)
		if err == nil {
			_, err = f.Write(data)
		}
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			b.Fatal(err)
		}
		if _, ok := parseShardFileName(e.Name()); ok {
			shards = append(shards, p)
		}
	}
	return shards
}

// BenchmarkColdRead compares the read-ahead settings on cold reads (shard
// files evicted from the page cache, store reopened): random point gets (ms and MiB per get),
// forward walks of records in file order (what a walk over a repacked
// region does), a full scan at open (no index files), and every record of
// an 8 MiB region in shuffled order, and a Repack of one of 4 interleaved
// collections (a quarter of the store) in shuffled order, on a copy. Each
// round runs every setting once, in rotated
// order; the metrics are medians over the rounds: ms and MiB read from
// disk per unit (one get, one walk, one open, one region). It runs once
// whatever -benchtime says; -packstore.coldrounds and -packstore.coldmb
// size it. Example:
//
//	go -C packstore test -run '^$' -bench ColdRead -benchtime 1x . -packstore.coldrounds 5
func BenchmarkColdRead(b *testing.B) {
	if testing.Short() {
		b.Skip("writes and evicts a store of -packstore.coldmb MB")
	}
	dir := b.TempDir()
	ids := buildColdStore(b, dir, *coldMBFlag)
	index := make(map[ID]int, len(ids))
	for i, id := range ids {
		index[id] = i
	}
	files, err := filepath.Glob(filepath.Join(dir, "shard-*.mtdb"))
	if err != nil || len(files) == 0 {
		b.Fatalf("shard files: %v %v", files, err)
	}
	// get20: the first gets on a cold store (each kernel read-around is
	// still new disk); get300: enough for read-around to have cached most of
	// a 128 MB store.
	const nFew, nGets, walkShort, walkLong = 20, 300, 200, 2000
	getAll := func(list []ID) func(s *PackfileStorage) error {
		return func(s *PackfileStorage) error {
			for _, id := range list {
				if _, err := s.Get(idN(1, index[id]%coldColls), id); err != nil {
					return err
				}
			}
			return nil
		}
	}
	type sample struct{ ms, mib float64 }
	res := map[string][]sample{}
	var keys []string
	add := func(pattern, setting string, units int, wall time.Duration, rb int64) {
		k := pattern + "/" + setting
		if _, ok := res[k]; !ok {
			keys = append(keys, k)
		}
		res[k] = append(res[k], sample{float64(wall.Nanoseconds()) / 1e6 / float64(units), float64(rb) / (1 << 20) / float64(units)})
	}
	r := rand.New(rand.NewPCG(9, 9))
	for round := range *coldRoundsFlag {
		perm := r.Perm(len(ids))
		gets := make([]ID, nGets)
		for i := range gets {
			gets[i] = ids[perm[i]]
		}
		start := r.IntN(len(ids) - walkLong)
		short, long := ids[start:start+walkShort], ids[start:start+walkLong]
		// The region: ids from a random start covering 8 MiB of frames.
		rs := r.IntN(len(ids) / 2)
		region := slices.Clone(ids[rs:min(len(ids), rs+8<<20/1800)])
		r.Shuffle(len(region), func(i, j int) { region[i], region[j] = region[j], region[i] })
		// The repack plan: every record of collection 0 (a quarter of the
		// store, spread over all of it), shuffled.
		var plan []ID
		for i := 0; i < len(ids); i += coldColls {
			plan = append(plan, ids[i])
		}
		r.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
		for k := range coldSettings {
			st := coldSettings[(k+round)%len(coldSettings)]
			opts := Options{Dir: dir}
			st.set(&opts)
			w, rb := coldRun(b, opts, files, false, getAll(gets[:nFew]))
			add(fmt.Sprintf("get%d", nFew), st.name, nFew, w, rb)
			w, rb = coldRun(b, opts, files, false, getAll(gets))
			add(fmt.Sprintf("get%d", nGets), st.name, nGets, w, rb)
			w, rb = coldRun(b, opts, files, false, getAll(short))
			add(fmt.Sprintf("walk%d", walkShort), st.name, 1, w, rb)
			w, rb = coldRun(b, opts, files, false, getAll(long))
			add(fmt.Sprintf("walk%d", walkLong), st.name, 1, w, rb)
			w, rb = coldRun(b, opts, files, false, getAll(region))
			add("region8m", st.name, 1, w, rb)
			w, rb = coldRun(b, opts, files, true, nil)
			add("scan", st.name, 1, w, rb)
			copyOpts := opts
			copyOpts.Dir = b.TempDir()
			copyFiles := copyStore(b, dir, copyOpts.Dir)
			w, rb = coldRun(b, copyOpts, copyFiles, false, func(s *PackfileStorage) error {
				_, err := s.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: idN(1, 0), Records: plan}}})
				return err
			})
			add("repack", st.name, 1, w, rb)
			if err := os.RemoveAll(copyOpts.Dir); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Logf("store %d MB, %d records of 500-3000 B; %d rounds; walk%d/walk%d: consecutive records in file order", *coldMBFlag, len(ids), *coldRoundsFlag, walkShort, walkLong)
	b.Logf("%-16s %10s %10s %10s   %10s %10s %10s", "pattern/setting", "ms med", "min", "max", "MiB med", "min", "max")
	for _, k := range keys {
		ss := res[k]
		ms := make([]float64, len(ss))
		mib := make([]float64, len(ss))
		for i, s := range ss {
			ms[i], mib[i] = s.ms, s.mib
		}
		slices.Sort(ms)
		slices.Sort(mib)
		b.Logf("%-16s %10.3f %10.3f %10.3f   %10.3f %10.3f %10.3f", k, ms[len(ms)/2], ms[0], ms[len(ms)-1], mib[len(mib)/2], mib[0], mib[len(mib)-1])
		b.ReportMetric(ms[len(ms)/2], k+"-ms")
		b.ReportMetric(mib[len(mib)/2], k+"-MiB")
	}
}

// BenchmarkWarmReadAhead: the cost of the read-ahead settings when the
// shards are in the page cache (no node cache): random Gets, and Gets in
// file order (where ReadAheadRandom issues a MADV_WILLNEED per window).
func BenchmarkWarmReadAhead(b *testing.B) {
	for _, st := range coldSettings {
		opts := Options{Dir: b.TempDir()}
		st.set(&opts)
		s := openStore(b, opts)
		r := rand.New(rand.NewPCG(2, 2))
		c := idN(1, 0)
		ids := make([]ID, 50000)
		for i := range ids {
			ids[i] = randID(r)
			if err := s.Put(c, ids[i], payload(r, 500+r.IntN(2501), false)); err != nil {
				b.Fatal(err)
			}
		}
		for _, order := range []string{"random", "file"} {
			b.Run(st.name+"/"+order, func(b *testing.B) {
				i := 0
				for b.Loop() {
					k := i % len(ids)
					if order == "random" {
						k = r.IntN(len(ids))
					}
					if _, err := s.Get(c, ids[k]); err != nil {
						b.Fatal(err)
					}
					i++
				}
			})
		}
		s.Close()
	}
}
