package packstore

import (
	"math/rand/v2"
	"os"
	"testing"
)

// The active shard's file runs ahead of its frames with written zeros, so a
// commit overwrites allocated bytes inside the file size (fdatasync without
// a journal commit); a sealed or closed shard ends with its last frame, and
// a crash's leftover zeros are cut at Open without a torn-tail report
// (doc.go "Commit latency").
func TestPreallocatedTail(t *testing.T) {
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 8))
	dir := t.TempDir()
	opts := DefaultOptions(dir)
	opts.MaxShardBytes = 3 << 20
	s := openStore(t, opts)
	coll := idN(1, 0)
	m := model{}
	size := func(id uint16) int64 {
		fi, err := os.Stat(shardPath(dir, id))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	sizes := map[int64]int{}
	for i := range 400 {
		var batch []Record
		for j := range 16 {
			rec := Record{ID: idN(2, i*16+j), Data: payload(r, 200+r.IntN(800), r.IntN(2) == 0)}
			batch = append(batch, rec)
			m.put(coll, rec.ID, rec.Data)
		}
		if err := s.PutMany(coll, batch); err != nil {
			t.Fatal(err)
		}
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
		a := s.active
		if got := size(a.id); got != a.alloc || got < a.size || got%preallocStep != 0 && got != opts.MaxShardBytes {
			t.Fatalf("commit %d: shard file %d bytes, frames end at %d, written ahead to %d: want the file a multiple of %d past the frames", i, got, a.size, a.alloc, preallocStep)
		}
		sizes[size(a.id)]++
	}
	if s.active.id == 0 {
		t.Fatal("no roll in 400 commits")
	}
	if got := size(0); got != s.shards[0].Load().size {
		t.Fatalf("sealed shard 0: file %d bytes, frames end at %d", got, s.shards[0].Load().size)
	}
	if len(sizes) > 12 {
		t.Fatalf("the file size changed at %d of 400 commits", len(sizes))
	}
	// A copy of the open store is what a crash leaves (the page cache holds
	// every write): the zeros are cut, nothing is reported torn.
	snap := t.TempDir()
	copyDir(t, dir, snap)
	active, frames := s.active.id, s.active.size
	if size(active) == frames {
		t.Fatalf("no zeros ahead of the frames to test with")
	}
	o := opts
	o.Dir = snap
	c := openStore(t, o)
	rep := c.OpenReport()
	if rep.ZeroTailBytes == 0 || rep.TruncatedBytes != 0 {
		t.Fatalf("report %+v, want ZeroTailBytes and no truncation", rep)
	}
	if fi, _ := os.Stat(shardPath(snap, active)); fi.Size() != frames {
		t.Fatalf("reopened copy: shard file %d bytes, want %d (zeros cut)", fi.Size(), frames)
	}
	compareAll(t, c, m, "crash copy")
	c.Close()
	// Read-only: skipped, not cut, not a torn tail.
	snap2 := t.TempDir()
	copyDir(t, dir, snap2)
	o.Dir, o.ReadOnly = snap2, true
	ro := openStore(t, o)
	if rep := ro.OpenReport(); rep.ZeroTailBytes == 0 || rep.TruncatedBytes != 0 || rep.TailNotCut {
		t.Fatalf("read-only report %+v", rep)
	}
	compareAll(t, ro, m, "read-only crash copy")
	ro.Close()

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := size(active); got != frames {
		t.Fatalf("after Close: shard file %d bytes, frames end at %d", got, frames)
	}
	s = openStore(t, opts)
	defer s.Close()
	if rep := s.OpenReport(); rep.ZeroTailBytes != 0 {
		t.Fatalf("reopen after Close: %+v", rep)
	}
	compareAll(t, s, m, "reopen")
}
