package packstore

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"
)

// The repack kill test: a child process (this test binary, env
// PACKSTORE_REPACKKILL_DIR) fills a store once with repackKillRecords
// records over repackKillColls collections, syncs, and then repacks every
// collection in a fresh random order again and again (the code path of a
// repack of hundreds of MB: copies through the append stream over many
// shards, fsync, positional reset markers, fsync, retirement), printing
// "start" and "done" around each. The parent SIGKILLs it at a random moment
// and checks that the store opens with every record byte-exact. The
// number of kills is PACKSTORE_REPACKKILL_POINTS (default 4; make crash
// sets more).

const (
	repackKillRecords = 2400
	repackKillColls   = 6
)

func repackKillRecord(seq int) (coll, id ID, data []byte) {
	r := rand.New(rand.NewPCG(uint64(seq), 99))
	return idN(5, seq%repackKillColls), idN(6, seq), payload(r, 200+r.IntN(2000), seq%4 == 0)
}

func repackKillOptions(dir string) Options {
	return Options{Dir: dir, MaxShardBytes: 256 << 10, Compress: true}
}

func TestRepackKillChild(t *testing.T) {
	dir := os.Getenv("PACKSTORE_REPACKKILL_DIR")
	if dir == "" {
		t.Skip("child of TestRepackKillProcess")
	}
	seed, _ := strconv.ParseUint(os.Getenv("PACKSTORE_REPACKKILL_SEED"), 10, 64)
	r := rand.New(rand.NewPCG(seed, 3))
	fail := func(what string, err error) {
		fmt.Println(what, "error:", err)
		os.Exit(3)
	}
	s, err := Open(repackKillOptions(dir))
	if err != nil {
		fail("open", err)
	}
	if s.Stats().LiveRecords == 0 {
		for seq := range repackKillRecords {
			coll, id, data := repackKillRecord(seq)
			if err := s.Put(coll, id, data); err != nil {
				fail("put", err)
			}
		}
		if err := s.Sync(); err != nil {
			fail("sync", err)
		}
	}
	fmt.Println("ready")
	for {
		var plan RepackPlan
		for c := range repackKillColls {
			ids, err := s.CollectionRecords(idN(5, c))
			if err != nil {
				fail("list", err)
			}
			r.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
			plan.Collections = append(plan.Collections, CollectionPlan{Collection: idN(5, c), Records: ids})
		}
		r.Shuffle(len(plan.Collections), func(i, j int) { plan.Collections[i], plan.Collections[j] = plan.Collections[j], plan.Collections[i] })
		fmt.Println("start")
		if _, err := s.Repack(plan); err != nil {
			fail("repack", err)
		}
		fmt.Println("done")
	}
}

func TestRepackKillProcess(t *testing.T) {
	points := envInt("PACKSTORE_REPACKKILL_POINTS", 4)
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 4))
	dir := t.TempDir()
	midRepack := 0
	var repackTime time.Duration = 100 * time.Millisecond
	for kill := range points {
		cmd, lines := startChild(t, "TestRepackKillChild", "PACKSTORE_REPACKKILL_DIR="+dir, fmt.Sprintf("PACKSTORE_REPACKKILL_SEED=%d", seed+uint64(kill)))
		inRepack := false
		var started time.Time
		superviseChild(t, cmd, lines, nil, func(l string) <-chan time.Time {
			switch l {
			case "ready":
				return time.After(time.Duration(r.Int64N(int64(repackTime) * 3)))
			case "start":
				inRepack, started = true, time.Now()
			case "done":
				inRepack = false
				repackTime = time.Since(started)
			}
			return nil
		}, func() {
			if inRepack {
				midRepack++
			}
		})
		s, err := Open(repackKillOptions(dir))
		if err != nil {
			t.Fatalf("kill %d: reopen: %v", kill, err)
		}
		if n := s.Stats().LiveRecords; n != repackKillRecords {
			t.Fatalf("kill %d: %d live records, want %d", kill, n, repackKillRecords)
		}
		for seq := range repackKillRecords {
			coll, id, want := repackKillRecord(seq)
			got, err := s.Get(coll, id)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("kill %d: record %d: %d bytes, %v", kill, seq, len(got), err)
			}
		}
		mustCheck(t, s)
		s.Close()
	}
	t.Logf("repack kill summary: %d kills, %d during a repack, every record intact (last repack %v)", points, midRepack, repackTime)
	fmt.Printf("repack kill summary: %d kill points, %d during a repack, 0 lost, 0 corrupt\n", points, midRepack)
}
