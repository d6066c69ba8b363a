//go:build linux

package packstore

import (
	"bufio"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
)

// mappedRss returns the resident kB of this process's mappings of files whose
// path contains dir (/proc/self/smaps).
func mappedRss(t *testing.T, dir string) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skip("no /proc/self/smaps:", err)
	}
	defer f.Close()
	total, in := 0, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			in = strings.Contains(line, dir)
			continue
		}
		if in && len(fields) >= 2 && fields[0] == "Rss:" {
			n, _ := strconv.Atoi(fields[1])
			total += n
		}
	}
	return total
}

// TestReleaseMapped: after reading every record of a store, its shard mappings
// are resident; ReleaseMapped takes them out of the process's RSS, and every
// record still reads back as written.
func TestReleaseMapped(t *testing.T) {
	dir := t.TempDir()
	opts := DefaultOptions(dir)
	opts.ReleaseEvery = -1 // only the explicit release (TestReleaseEvery has the other)
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	coll := ID{1}
	recs := putMapped(t, s, coll)
	readAll := func() {
		for _, r := range recs {
			got, err := s.Get(coll, r.ID)
			if err != nil || string(got) != string(r.Data) {
				t.Fatalf("record %x: %v", r.ID, err)
			}
		}
	}
	readAll()
	before := mappedRss(t, dir)
	if before < 1024 {
		t.Fatalf("%d kB of the shards resident after reading 8 MB of records: the test cannot see a release", before)
	}
	if err := s.ReleaseMapped(); err != nil {
		t.Fatal(err)
	}
	after := mappedRss(t, dir)
	if after > before/8 {
		t.Fatalf("shard mappings resident: %d kB before ReleaseMapped, %d kB after", before, after)
	}
	readAll()
	t.Logf("resident shard pages: %d kB, after ReleaseMapped %d kB", before, after)
}

// TestReleaseEvery: with Options.ReleaseEvery the engine releases the mappings
// by itself, so reading 8 MB of records once leaves at most about ReleaseEvery
// frames' pages (with the kernel's fault-around) resident; with releases off
// the whole store stays mapped. Both stores read back every record.
func TestReleaseEvery(t *testing.T) {
	resident := map[int]int{}
	for _, every := range []int{-1, 32} {
		dir := t.TempDir()
		opts := DefaultOptions(dir)
		opts.ReleaseEvery = every
		opts.CacheBytes = -1
		s, err := Open(opts)
		if err != nil {
			t.Fatal(err)
		}
		coll := ID{1}
		recs := putMapped(t, s, coll)
		if err := s.ReleaseMapped(); err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			got, err := s.Get(coll, r.ID)
			if err != nil || string(got) != string(r.Data) {
				t.Fatalf("ReleaseEvery %d: record %x: %v", every, r.ID, err)
			}
		}
		resident[every] = mappedRss(t, dir)
		s.Close()
	}
	t.Logf("resident shard pages after one read of 8 MB: %d kB never releasing, %d kB releasing every 32 frames", resident[-1], resident[32])
	if resident[-1] < 6*1024 {
		t.Fatalf("%d kB resident without releases: the test cannot see a release", resident[-1])
	}
	if resident[32] > 32*64+64 {
		t.Fatalf("%d kB resident with ReleaseEvery 32 (at most 32 frames' fault-around windows of 64 kB expected)", resident[32])
	}
}

// putMapped writes 2,000 incompressible records of 4,000 bytes (an 8 MB
// shard), syncs and maps all of the active shard, as a seal or a later Sync
// would.
func putMapped(t *testing.T, s *PackfileStorage, coll ID) []Record {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	var recs []Record
	for i := range 2000 {
		data := make([]byte, 4000)
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		recs = append(recs, Record{ID: ID{2, byte(i), byte(i >> 8)}, Data: data})
	}
	if err := s.PutMany(coll, recs); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	err := s.active.remap(s.active.size)
	s.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}
