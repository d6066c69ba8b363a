package packstore

import (
	"cmp"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// diskFull is a faultFS write hook for a disk that fills up: once armed,
// the writes match selects get ENOSPC after the bytes left in budget
// (a partial write, as a full filesystem gives).
type diskFull struct {
	mu     sync.Mutex
	armed  bool
	budget int
	match  func(path string) bool
	hits   int // writes that failed
}

func (d *diskFull) hook(path string, _ int64, n int) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.armed || !d.match(path) {
		return n, nil
	}
	if n <= d.budget {
		d.budget -= n
		return n, nil
	}
	w := d.budget
	d.budget = 0
	d.hits++
	return w, syscall.ENOSPC
}

func (d *diskFull) set(armed bool) {
	d.mu.Lock()
	d.armed = armed
	d.mu.Unlock()
}

// storeFiles maps each file name in dir to its size.
func storeFiles(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]int64, len(ents))
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = fi.Size()
	}
	return out
}

// TestRepackOutOfSpace runs out of space in each write a repack makes: a
// shard's copies (in the first output shard, in a later one), the header
// of a shard the copy rolls into, the index checkpoint, the index delta
// that a checkpoint publishes and the delta entries appended after the
// markers. Each time the error names the file as it is on disk (never a
// .tmp name), says what the store holds, and leaves no partial output: a
// repack that did not take effect leaves no copies (the output shard it
// was writing is cut back to its header, the ones it filled are removed),
// one that did leaves no .tmp file and no torn delta entry. The store is
// writable, checks clean, reopens and checks clean with the records of the
// index the error names, and the same repack with space succeeds.
func TestRepackOutOfSpace(t *testing.T) {
	shardFrames := func(p string) bool { return strings.HasSuffix(p, ".mtdb") }
	cases := []struct {
		name    string
		match   func(path string) bool
		budget  int   // bytes the matching writes may still take
		shard   int64 // MaxShardBytes; 16 KiB when 0
		late    bool  // armed once the markers are written, not at the start
		onlyA   bool  // repack collection A only: B keeps every old shard live
		applied bool
		names   string // pattern of the file the error must name
		exists  bool   // and that file exists
	}{
		{name: "shard-first-output", match: shardFrames, budget: 20000, shard: 64 << 10, names: `shard-\d{5}\.mtdb`, exists: true},
		{name: "shard-second-output", match: shardFrames, budget: 14000, names: `shard-\d{5}\.mtdb`, exists: true},
		{name: "shard-header", match: func(p string) bool { return strings.HasSuffix(p, ".mtdb.tmp") }, budget: HeaderSize, names: `shard-\d{5}\.mtdb`},
		{name: "checkpoint", match: func(p string) bool { return strings.HasSuffix(p, checkpointFile+".tmp") }, applied: true, names: `index\.ckpt`, exists: true},
		{name: "delta-publish", match: func(p string) bool { return strings.HasSuffix(p, deltaFile+".tmp") }, applied: true, names: `index\.delta`, exists: true},
		{name: "delta-append", match: func(p string) bool { return strings.HasSuffix(p, deltaFile) }, budget: 40, late: true, onlyA: true, applied: true, names: `index\.delta`, exists: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ffs := newFaultFS()
			full := &diskFull{match: tc.match, budget: tc.budget}
			ffs.write = full.hook
			opts := Options{Dir: t.TempDir(), MaxShardBytes: cmp.Or(tc.shard, 16<<10), fs: ffs}
			s := openStore(t, opts)
			defer func() { s.Close() }()
			r := rand.New(rand.NewPCG(41, 42))
			a, b, c := idN(1, 0), idN(1, 1), idN(1, 2)
			m := model{}
			var keepA, keepB []ID
			for i := range 60 {
				for _, coll := range []ID{a, b} {
					id, d := idN(2, i), payload(r, 500, false)
					if err := s.Put(coll, id, d); err != nil {
						t.Fatal(err)
					}
					m.put(coll, id, d)
				}
				if i%2 == 0 {
					keepA, keepB = append(keepA, idN(2, i)), append(keepB, idN(2, i))
				}
			}
			if err := s.Sync(); err != nil {
				t.Fatal(err)
			}
			plan := RepackPlan{Collections: []CollectionPlan{{Collection: a, Records: keepA}}}
			if !tc.onlyA {
				plan.Collections = append(plan.Collections, CollectionPlan{Collection: b, Records: keepB})
			}
			// after is the model once the plan has taken effect.
			after := model{}
			for _, cp := range plan.Collections {
				for _, id := range cp.Records {
					after.put(cp.Collection, id, m[cp.Collection][id])
				}
			}
			if tc.onlyA {
				after[b] = m[b]
			}
			before := storeFiles(t, opts.Dir)
			var deltaAtArm int64 = -1
			s.testHookAfterMarkers = func() {
				if tc.late {
					fi, err := os.Stat(filepath.Join(opts.Dir, deltaFile))
					if err != nil {
						t.Error(err)
					} else {
						deltaAtArm = fi.Size()
					}
					full.set(true)
				}
			}
			full.set(!tc.late)
			_, err := s.Repack(plan)
			full.set(false)
			if err == nil || full.hits == 0 {
				t.Fatalf("Repack: %v after %d injected ENOSPC; want the injected ENOSPC", err, full.hits)
			}
			msg := err.Error()
			t.Logf("Repack: %s", msg)
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("Repack error %q does not wrap ENOSPC", msg)
			}
			if got := errors.Is(err, ErrRepackApplied); got != tc.applied {
				t.Fatalf("Repack error %q: matches ErrRepackApplied = %v, want %v", msg, got, tc.applied)
			}
			if strings.Contains(msg, ".tmp") {
				t.Fatalf("Repack error %q names a temporary file", msg)
			}
			named := regexp.MustCompile(tc.names).FindString(msg)
			if named == "" {
				t.Fatalf("Repack error %q names no file matching %s", msg, tc.names)
			}
			now := storeFiles(t, opts.Dir)
			if _, ok := now[named]; tc.exists && !ok {
				t.Fatalf("Repack error %q names %s, which is not in the store (%v)", msg, named, now)
			}
			holds := "the old shards and index are intact and the store is consistent"
			if tc.applied {
				holds = "the new index is live and the store is consistent"
			}
			if !strings.Contains(msg, holds) {
				t.Fatalf("Repack error %q does not say %q", msg, holds)
			}

			// No partial output.
			for name := range now {
				if strings.HasSuffix(name, ".tmp") {
					t.Fatalf("partial file %s left in the store (%v)", name, now)
				}
			}
			if !tc.applied {
				fresh := 0
				for name, size := range now {
					if _, ok := parseShardFileName(name); !ok {
						continue
					}
					if old, ok := before[name]; ok {
						if size > old {
							t.Fatalf("%s grew from %d to %d bytes: the copies were left in it", name, old, size)
						}
						continue
					}
					fresh++
					if size > HeaderSize {
						t.Fatalf("new shard %s holds %d bytes after the failed repack: copies left (%v)", name, size, now)
					}
				}
				if fresh > 1 {
					t.Fatalf("%d new shard files left by the failed repack (%v)", fresh, now)
				}
			}
			if tc.late && now[deltaFile] != deltaAtArm {
				t.Fatalf("%s is %d bytes after the failed append, %d before it: a torn entry was left", deltaFile, now[deltaFile], deltaAtArm)
			}

			want := m
			if tc.applied {
				want = after
			}
			compareAll(t, s, want, "after the failed repack")
			mustCheck(t, s)
			if err := s.Put(c, idN(3, 0), []byte("after the failed repack")); err != nil {
				t.Fatalf("Put after the failed repack: %v", err)
			}
			want.put(c, idN(3, 0), []byte("after the failed repack"))
			after.put(c, idN(3, 0), []byte("after the failed repack"))
			if err := s.Close(); err != nil {
				t.Fatalf("Close after the failed repack: %v", err)
			}

			o := opts
			o.fs = nil
			s = openStore(t, o)
			mustCheck(t, s)
			compareAll(t, s, want, "reopened after the failed repack")
			if _, err := s.Repack(plan); err != nil {
				t.Fatalf("Repack with space: %v", err)
			}
			mustCheck(t, s)
			compareAll(t, s, after, "after the repack with space")
			for name := range storeFiles(t, opts.Dir) {
				if strings.HasSuffix(name, ".tmp") {
					t.Fatalf("%s left by the repack with space", name)
				}
			}
		})
	}
}
