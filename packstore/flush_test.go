package packstore

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
)

// TestOneFlushPerCommit: a steady append (16 records of
// 500 B, then Sync) costs one device flush, the active shard's fsync: the
// delta's entries are written without an fsync of their own, which only
// comes every deltaLazyBytes of entries (or at a roll, a checkpoint,
// Close). Counted through faultFS over real files, 200 commits.
func TestOneFlushPerCommit(t *testing.T) {
	fs := newFaultFS()
	var fsyncs atomic.Int64
	fs.sync = func(string) error { fsyncs.Add(1); return nil }
	s := openStore(t, Options{Dir: t.TempDir(), fs: fs})
	defer s.Close()
	recs := make([]Record, 16)
	var per []int64
	for c := range 200 {
		for i := range recs {
			recs[i] = Record{ID: idN(2, c*16+i), Data: bytes.Repeat([]byte{byte(i)}, 500)}
		}
		if err := s.PutMany(ID{1}, recs); err != nil {
			t.Fatal(err)
		}
		before := fsyncs.Load()
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
		per = append(per, fsyncs.Load()-before)
	}
	slices.Sort(per)
	if med, most := per[len(per)/2], per[len(per)-1]; med != 1 || most > 2 {
		t.Fatalf("fsyncs per commit: median %d, most %d; want 1 and at most 2 (a lazy delta fsync)", med, most)
	}
	var extra int64
	for _, n := range per {
		extra += n - 1
	}
	if want := int64(200*16*deltaEntryLen/deltaLazyBytes) + 1; extra > want {
		t.Fatalf("%d commits with a second fsync, want at most %d", extra, want)
	}
}

// TestLostShardAfterPowerLoss: with the delta fsynced lazily, a power loss
// (faultFS: every byte not fsynced is dropped) keeps every acknowledged
// record, and a shard file lost afterwards is still found missing, even
// the newest one, which no durable delta entry of a frame names: its
// creation was recorded (entryShard) and fsynced before any frame went
// into it (item 1's guarantee under item 8).
func TestLostShardAfterPowerLoss(t *testing.T) {
	for _, lose := range []string{"", "newest", "middle"} {
		t.Run("lose="+lose, func(t *testing.T) {
			fs := newFaultFS()
			dir := t.TempDir()
			opts := Options{Dir: dir, MaxShardBytes: 16 << 10, fs: fs}
			s := openStore(t, opts)
			for i := range 120 {
				if err := s.Put(ID{1}, idN(2, i), bytes.Repeat([]byte{byte(i)}, 500)); err != nil {
					t.Fatal(err)
				}
				if i%10 == 9 {
					if err := s.Sync(); err != nil {
						t.Fatal(err)
					}
				}
			}
			fs.crash()
			s.Close()
			if err := fs.applyCrash(nil); err != nil {
				t.Fatal(err)
			}
			opts.fs = nil
			names, _ := filepath.Glob(filepath.Join(dir, "shard-*.mtdb"))
			if len(names) < 5 {
				t.Fatalf("%d shards", len(names))
			}
			if lose == "" {
				s := openStore(t, opts)
				defer s.Close()
				for i := range 120 {
					mustGet(t, s, ID{1}, idN(2, i), bytes.Repeat([]byte{byte(i)}, 500))
				}
				return
			}
			victim := names[len(names)-1] // pack IDs grow here: the newest
			if lose == "middle" {
				victim = names[len(names)/2]
			}
			if err := os.Remove(victim); err != nil {
				t.Fatal(err)
			}
			if _, err := Open(opts); !IsCorruption(err) || !strings.Contains(err.Error(), filepath.Base(victim)) {
				t.Fatalf("Open with %s lost after a power loss: %v", filepath.Base(victim), err)
			}
		})
	}
}
