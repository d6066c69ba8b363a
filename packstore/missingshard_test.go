package packstore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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

// lostShardOptions is the store of TestSyncedShardLostAfterKill: 16 KiB
// shards, so that 120 records of 500 B fill about six.
func lostShardOptions(dir string) Options {
	return Options{Dir: dir, MaxShardBytes: 16 << 10}
}

// TestLostShardChild is the child of TestSyncedShardLostAfterKill: it puts
// 120 records of 500 B with a Sync after every 10, prints "synced", and
// waits to be killed. No checkpoint is written after the one of creation.
func TestLostShardChild(t *testing.T) {
	dir := os.Getenv("PACKSTORE_LOSTSHARD_DIR")
	if dir == "" {
		t.Skip("child of TestSyncedShardLostAfterKill")
	}
	s, err := Open(lostShardOptions(dir))
	if err != nil {
		fmt.Println("open error:", err)
		os.Exit(3)
	}
	for i := range 120 {
		if err := s.Put(ID{1}, idN(2, i), bytes.Repeat([]byte{byte(i)}, 500)); err != nil {
			fmt.Println("put error:", err)
			os.Exit(3)
		}
		if i%10 == 9 {
			if err := s.Sync(); err != nil {
				fmt.Println("sync error:", err)
				os.Exit(3)
			}
		}
	}
	fmt.Println("synced")
	select {}
}

// TestSyncedShardLostAfterKill: a child process puts and
// syncs records over about six shards and is SIGKILLed; then one shard file
// (the newest, or one in the middle) is deleted. The delta entries prove
// that shard's frames were synced, so Open must fail with ErrCorrupt naming
// the file, not answer ErrNotFound for acknowledged records, and it must
// leave the index files as they were (a second Open fails the same way).
func TestSyncedShardLostAfterKill(t *testing.T) {
	for _, which := range []string{"newest", "middle"} {
		t.Run(which, func(t *testing.T) {
			dir := t.TempDir()
			cmd, lines := startChild(t, "TestLostShardChild", "PACKSTORE_LOSTSHARD_DIR="+dir)
			for l := range lines {
				if l == "synced" {
					break
				}
				if strings.Contains(l, "error") {
					t.Fatalf("child: %s", l)
				}
			}
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			names, _ := filepath.Glob(filepath.Join(dir, "shard-*.mtdb"))
			if len(names) < 5 {
				t.Fatalf("%d shard files; the test needs about six", len(names))
			}
			victim := names[len(names)-1]
			if which == "middle" {
				victim = names[len(names)/2]
			}
			if err := os.Remove(victim); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				s, err := Open(lostShardOptions(dir))
				if err == nil {
					_, gerr := s.Get(ID{1}, idN(2, 119))
					s.Close()
					t.Fatalf("Open with %s deleted succeeded (Get of the last synced record: %v)", filepath.Base(victim), gerr)
				}
				if !IsCorruption(err) || !strings.Contains(err.Error(), filepath.Base(victim)) {
					t.Fatalf("Open with %s deleted: %v; want ErrCorrupt naming the file", filepath.Base(victim), err)
				}
			}
		})
	}
}
