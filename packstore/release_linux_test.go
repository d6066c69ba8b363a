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
	s, err := Open(DefaultOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	coll := ID{1}
	rng := rand.New(rand.NewPCG(1, 2))
	var recs []Record
	for i := range 2000 {
		data := make([]byte, 4000) // incompressible, so the shard holds 8 MB
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
	err = s.active.remap(s.active.size) // map all of it, as a seal or a later Sync would
	s.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
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
