package packstore

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMissingShardIsCorruption: a shard file the checkpoint lists that is gone was
// lost (retirement writes a checkpoint without a shard before deleting it), so Open
// fails with ErrCorrupt naming it instead of silently serving fewer records. A repack
// that retires shards leaves a store that opens cleanly.
func TestMissingShardIsCorruption(t *testing.T) {
	dir := t.TempDir()
	opts := DefaultOptions(dir)
	opts.MaxShardBytes = 64 << 10
	opts.Compress = false
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	coll := ID{1}
	var plan CollectionPlan
	plan.Collection = coll
	for i := 0; i < 400; i++ {
		id := ID{byte(i), byte(i >> 8), 7}
		if err := s.Put(coll, id, []byte(strings.Repeat("x", 500)+string(rune(i)))); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			plan.Records = append(plan.Records, id)
		}
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	rs, err := s.Repack(RepackPlan{Collections: []CollectionPlan{plan}})
	if err != nil {
		t.Fatal(err)
	}
	if rs.ShardsRetired == 0 {
		t.Fatal("repack retired no shard; the test needs one")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(opts)
	if err != nil {
		t.Fatalf("reopen after retirement: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	names, _ := filepath.Glob(filepath.Join(dir, "shard-*.mtdb"))
	if len(names) < 2 {
		t.Fatalf("%d shards; the test needs two", len(names))
	}
	if err := os.Remove(names[0]); err != nil {
		t.Fatal(err)
	}
	_, err = Open(opts)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), filepath.Base(names[0])) {
		t.Fatalf("open with %s deleted: %v", filepath.Base(names[0]), err)
	}
}

// TestAllShardsMissingIsCorruption: a directory whose index files list shards
// with data but holds no shard file lost them all; Open fails with ErrCorrupt and
// leaves the index files as they were (it does not start a new store over them).
// A new store's directory (index files listing only an empty first shard) still
// opens.
func TestAllShardsMissingIsCorruption(t *testing.T) {
	dir := t.TempDir()
	opts := DefaultOptions(dir)
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(opts); err != nil {
		t.Fatalf("reopen of an empty store: %v", err)
	}
	if err := s.Put(ID{1}, ID{2}, []byte("record")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	names, _ := filepath.Glob(filepath.Join(dir, "shard-*.mtdb"))
	for _, n := range names {
		if err := os.Remove(n); err != nil {
			t.Fatal(err)
		}
	}
	ckpt, err := os.ReadFile(filepath.Join(dir, checkpointFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err = Open(opts); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "none exists") {
		t.Fatalf("open with every shard deleted: %v", err)
	}
	if after, err := os.ReadFile(filepath.Join(dir, checkpointFile)); err != nil || string(after) != string(ckpt) {
		t.Fatalf("open rewrote %s (%v)", checkpointFile, err)
	}
}
