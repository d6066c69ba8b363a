package packstore

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The pack-ID reuse test: a child process runs rounds of
// "put, sync, repack" with the shard limit lowered to 16 and prints "round
// N" when round N is durable; the parent SIGKILLs it at random moments,
// reopens the store, checks that every record of rounds 0..N reads back
// byte-exact, and starts a new child at round N+1, until all rounds ran.
// Each round puts one 4-byte record into collection A and one into
// collection B, syncs, and repacks A (all its records, so each repack
// starts a fresh shard and retires the previous copy); every fourth round
// it repacks B too, so B's records pin a few shards between its repacks
// and the free pack IDs are scattered. Without pack-ID reuse the store hit
// ErrShardLimit after about 15 rounds. PACKSTORE_REUSE_ROUNDS sets the
// number of rounds (go test: 300; make crash: 10000).

const reuseMaxShards = 16

func reuseOptions(dir string) Options {
	return Options{Dir: dir, MaxShardBytes: 256 << 10, maxShards: reuseMaxShards}
}

// reuseRecord returns the record a round puts into a collection. Its ID
// carries the prefix in its last byte, not its first (as idN does), so that
// the IDs spread over the index like the hashes callers use: with 20,000
// records sharing their top byte, probe runs grew long enough to dominate
// the round's CPU profile (lossyTable.candidates 42%).
func reuseRecord(coll byte, round int) (ID, []byte) {
	id := idN(coll, round)
	id[0], id[15] = id[15], coll
	return id, []byte(fmt.Sprintf("%04d", round%10000))
}

// TestReuseChild is the child's body; it only runs under TestPackIDReuseKill.
func TestReuseChild(t *testing.T) {
	dir := os.Getenv("PACKSTORE_REUSE_DIR")
	if dir == "" {
		t.Skip("child of TestPackIDReuseKill")
	}
	next, _ := strconv.Atoi(os.Getenv("PACKSTORE_REUSE_NEXT"))
	rounds, _ := strconv.Atoi(os.Getenv("PACKSTORE_REUSE_ROUNDS"))
	fail := func(round int, what string, err error) {
		fmt.Printf("round %d: %s error: %v\n", round, what, err)
		os.Exit(3)
	}
	s, err := Open(reuseOptions(dir))
	if err != nil {
		fail(next, "open", err)
	}
	a, b := idN(7, 0), idN(7, 1)
	for round := next; round < rounds; round++ {
		for _, c := range []struct {
			coll   ID
			prefix byte
		}{{a, 8}, {b, 9}} {
			id, data := reuseRecord(c.prefix, round)
			if err := s.Put(c.coll, id, data); err != nil {
				fail(round, "put", err)
			}
		}
		if err := s.Sync(); err != nil {
			fail(round, "sync", err)
		}
		plan := RepackPlan{}
		for _, coll := range []ID{a, b} {
			if coll == b && round%4 != 3 {
				continue
			}
			ids, err := s.CollectionRecords(coll)
			if err != nil {
				fail(round, "list", err)
			}
			plan.Collections = append(plan.Collections, CollectionPlan{Collection: coll, Records: ids})
		}
		if _, err := s.Repack(plan); err != nil {
			fail(round, "repack", err)
		}
		fmt.Printf("round %d\n", round)
	}
	fmt.Println("done")
}

func TestPackIDReuseKill(t *testing.T) {
	rounds := envInt("PACKSTORE_REUSE_ROUNDS", 300)
	killMin, killSpread := envInt("PACKSTORE_REUSE_KILL_MIN_MS", 50), envInt("PACKSTORE_REUSE_KILL_SPREAD_MS", 400)
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 5))
	dir := t.TempDir()
	done, kills, maxShards := 0, 0, 0 // rounds 0..done-1 are durable
	for done < rounds {
		cmd, lines := startChild(t, "TestReuseChild", "PACKSTORE_REUSE_DIR="+dir,
			fmt.Sprintf("PACKSTORE_REUSE_NEXT=%d", done), fmt.Sprintf("PACKSTORE_REUSE_ROUNDS=%d", rounds))
		killed := superviseChild(t, cmd, lines, time.After(time.Duration(killMin+r.IntN(killSpread))*time.Millisecond), func(l string) <-chan time.Time {
			if strings.Contains(l, "error") {
				dumpShards(t, dir)
			}
			if n, ok := strings.CutPrefix(l, "round "); ok {
				k, _ := strconv.Atoi(n)
				done = k + 1
			}
			return nil
		}, nil)
		if killed {
			kills++
		}
		s, err := Open(reuseOptions(dir))
		if err != nil {
			t.Fatalf("after %d rounds, kill %d: reopen: %v", done, kills, err)
		}
		for round := range done {
			for _, c := range []struct {
				coll   ID
				prefix byte
			}{{idN(7, 0), 8}, {idN(7, 1), 9}} {
				id, want := reuseRecord(c.prefix, round)
				if got, err := s.Get(c.coll, id); err != nil || !bytes.Equal(got, want) {
					t.Fatalf("after %d rounds, kill %d: record of round %d: %q, %v", done, kills, round, got, err)
				}
			}
		}
		mustCheck(t, s)
		maxShards = max(maxShards, s.Stats().Shards)
		s.Close()
	}
	t.Logf("reuse summary: %d rounds of put, sync, repack with the shard limit at %d, %d SIGKILLs, at most %d shards at a reopen", rounds, reuseMaxShards, kills, maxShards)
	fmt.Printf("reuse summary: %d rounds, shard limit %d, %d kills, 0 lost\n", rounds, reuseMaxShards, kills)
}

// TestReaderStaleSlotAfterReuse: a reader that probed the index, found
// its record in shard 0 and was then delayed, while the record was
// superseded, shard 0 retired and pack ID 0 taken by a new shard holding
// other frames, must not answer ErrNotFound (nor read the other frame):
// it notices the retirement and probes again.
func TestReaderStaleSlotAfterReuse(t *testing.T) {
	s := openStore(t, Options{Dir: t.TempDir(), MaxShardBytes: 8 << 10})
	defer s.Close()
	c, d := ID{1}, ID{2}
	r := idN(3, 0)
	big := func(b byte) []byte { return bytes.Repeat([]byte{b}, 3000) }
	for _, p := range []struct {
		coll, id ID
		data     []byte
	}{{c, r, big(1)}, {d, idN(4, 0), big(2)}, {d, idN(4, 1), big(3)}} {
		if err := s.Put(p.coll, p.id, p.data); err != nil {
			t.Fatal(err)
		}
	}
	if l, _, _, _ := s.lookupLocked(s.collectionLoad(c), r); l != (loc{0, HeaderSize}) || s.active.id == 0 {
		t.Fatalf("setup: record at %v, active shard %d", l, s.active.id)
	}
	probed, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.testHookProbed = func() {
		once.Do(func() {
			close(probed)
			<-resume
		})
	}
	type result struct {
		data []byte
		err  error
	}
	res := make(chan result)
	go func() {
		b, err := s.Get(c, r)
		res <- result{b, err}
	}()
	<-probed
	if err := s.Put(c, r, big(9)); err != nil { // superseded: shard 0 holds nothing live of c
		t.Fatal(err)
	}
	repackD := func() {
		ids, _ := s.CollectionRecords(d)
		if _, err := s.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: d, Records: ids}}}); err != nil {
			t.Fatal(err)
		}
	}
	repackD() // d moves out: shard 0 is retired
	if s.shards[0].Load() != nil {
		t.Fatal("setup: shard 0 not retired")
	}
	repackD() // the next shard takes pack ID 0 and begins with d's copies
	if sh := s.shards[0].Load(); sh == nil || sh.seq == 0 {
		t.Fatal("setup: pack ID 0 not taken again")
	}
	close(resume)
	got := <-res
	if got.err != nil || !bytes.Equal(got.data, big(9)) {
		t.Fatalf("delayed Get: %d bytes, %v; want the superseding version", len(got.data), got.err)
	}
}

// dumpShards logs every shard of the store in dir as a read-only Open sees
// it: pack ID, sequence number, size, live slots, collections with data
// frames and reset markers.
func dumpShards(t *testing.T, dir string) {
	o := reuseOptions(dir)
	o.ReadOnly = true
	s, err := Open(o)
	if err != nil {
		t.Logf("dump: %v", err)
		return
	}
	defer s.Close()
	for i := range s.shards {
		if sh := s.shards[i].Load(); sh != nil {
			t.Logf("shard %d seq %d size %d live %d data-of %d collections, markers %v", sh.id, sh.seq, sh.size, sh.live, len(sh.colls), sh.resets)
		}
	}
}

// TestRepacksDyingBeforeRetirement: every repack here "dies" right after
// its reset markers are appended (the store continues from a copy of the
// directory taken at that moment, as after a crash), so none retires the
// shards it emptied. With the shard limit at 16, the twentieth such round
// must still find pack IDs: a write short of IDs first retires the shards
// nothing references.
func TestRepacksDyingBeforeRetirement(t *testing.T) {
	dir := t.TempDir()
	coll := ID{1}
	for round := range 40 {
		s := openStore(t, reuseOptions(dir))
		id, data := reuseRecord(8, round)
		if err := s.Put(coll, id, data); err != nil {
			t.Fatal(err)
		}
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
		for r := range round + 1 {
			id, data := reuseRecord(8, r)
			mustGet(t, s, coll, id, data)
		}
		ids, err := s.CollectionRecords(coll)
		if err != nil {
			t.Fatal(err)
		}
		var crashed string
		s.testHookAfterMarkers = func() { crashed = snapshotDir(t, dir) }
		if _, err := s.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: coll, Records: ids}}}); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		s.Close()
		dir = crashed
	}
}

// TestRepacksBesideAnOldShard: shard 0 holds a live record of collection B
// and a dead frame of collection A, and A alone is repacked round after
// round (dropping its older records), as TestPackIDReuseKill does when
// kills repeat one round before B's next repack. Each repack's shard holds
// a reset marker of A with a larger position; only the newest can shadow
// A's frame in shard 0, so the older ones must not pin their shards: with
// the shard limit at 16 the rounds never hit ErrShardLimit. Then the
// newest marker's shard is left with nothing live, and an empty repack
// must still keep it. A reopen by full scan (index files deleted) finds
// exactly A's newest record, B's and C's: the markers kept still drop
// every older frame of A (deleting the newest marker's shard would bring
// back A's frame in shard 0: checked by making markerNeededLocked skip
// every marker).
func TestRepacksBesideAnOldShard(t *testing.T) {
	dir := t.TempDir()
	a, b := idN(7, 0), idN(7, 1)
	s := openStore(t, reuseOptions(dir))
	idB, dataB := reuseRecord(9, 0)
	if err := s.Put(b, idB, dataB); err != nil {
		t.Fatal(err)
	}
	const rounds = 3 * reuseMaxShards
	for round := range rounds {
		id, data := reuseRecord(8, round)
		if err := s.Put(a, id, data); err != nil {
			t.Fatal(err)
		}
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: a, Records: []ID{id}}}}); err != nil {
			t.Fatalf("round %d: %v (%d shards)", round, err, s.Stats().Shards)
		}
	}
	if n := s.Stats().Shards; n > 2 {
		t.Errorf("%d shards after %d repacks of A; want shard 0 (B) and the active one (the newest marker's)", n, rounds)
	}
	// Seal the newest marker's shard (a repack of collection C rolls the
	// active shard) and supersede A's copy in it: nothing references that
	// shard now, but its marker still shadows A's frame in shard 0, so the
	// empty repack below must keep it.
	c, idC, dataC := idN(7, 2), idN(10, 0), []byte("c")
	if err := s.Put(c, idC, dataC); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: c, Records: []ID{idC}}}}); err != nil {
		t.Fatal(err)
	}
	lastID, _ := reuseRecord(8, rounds-1)
	lastData := []byte("last")
	if err := s.Put(a, lastID, lastData); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Repack(RepackPlan{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{checkpointFile, deltaFile} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
	}
	s = openStore(t, reuseOptions(dir))
	defer s.Close()
	if src := s.OpenReport().Source; src != "scan" {
		t.Fatalf("reopen source %q, want scan", src)
	}
	mustGet(t, s, b, idB, dataB)
	mustGet(t, s, c, idC, dataC)
	for round := range rounds {
		id, _ := reuseRecord(8, round)
		if round == rounds-1 {
			mustGet(t, s, a, id, lastData)
		} else if got, err := s.Get(a, id); !errors.Is(err, ErrNotFound) {
			t.Fatalf("record of round %d, dropped by a repack, after a full scan: %q, %v", round, got, err)
		}
	}
	mustCheck(t, s)
}
