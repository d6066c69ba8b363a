package packstore

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The real-process crash loop: a child process (this test binary re-run
// with PACKSTORE_CRASH_DIR set) appends records, repacks now and then, and
// prints "synced N" after every completed Sync; the parent SIGKILLs it at
// a random moment, reopens the store and checks that every record 0..N
// reads back byte-exact and that no record reads back corrupt. Records are
// a pure function of their sequence number, so the parent needs no log.
// PACKSTORE_CRASH_POINTS sets the number of kills (make crash: 1000).
// PACKSTORE_CRASH_SEGMENT, if set, starts a fresh store every that many kills
// (make crash: 100): each kill point still checks every record acknowledged in
// its store, but the check does not grow with the whole run (1000 kills on one
// store re-read about 80 MB per kill, over an hour on a 2-core machine).

const crashColls = 4

func crashRecord(seq int) (coll, id ID, data []byte) {
	r := rand.New(rand.NewPCG(uint64(seq), 77))
	return idN(1, seq/32%crashColls), idN(2, seq), payload(r, r.IntN(3000), seq%3 == 0)
}

// TestCrashChild is the child's body; it only runs under the parent.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv("PACKSTORE_CRASH_DIR")
	if dir == "" {
		t.Skip("child of TestCrashProcess")
	}
	next, _ := strconv.Atoi(os.Getenv("PACKSTORE_CRASH_NEXT"))
	seed, _ := strconv.ParseUint(os.Getenv("PACKSTORE_CRASH_SEED"), 10, 64)
	r := rand.New(rand.NewPCG(seed, 1))
	s, err := Open(Options{Dir: dir, MaxShardBytes: 64 << 10, Compress: true})
	if err != nil {
		fmt.Println("open error:", err)
		os.Exit(3)
	}
	out := bufio.NewWriter(os.Stdout)
	for batch := 0; ; batch++ {
		var recs []Record
		coll, _, _ := crashRecord(next)
		for range 1 + r.IntN(20) {
			c, id, data := crashRecord(next)
			if c != coll {
				break // a batch stays in one collection
			}
			recs = append(recs, Record{ID: id, Data: data})
			next++
		}
		if err := s.PutMany(coll, recs); err != nil {
			fmt.Println("put error:", err)
			os.Exit(3)
		}
		if r.IntN(40) == 0 {
			c := idN(1, r.IntN(crashColls))
			ids, _ := s.CollectionRecords(c)
			if _, err := s.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: c, Records: ids}}}); err != nil {
				fmt.Println("repack error:", err)
				os.Exit(3)
			}
		}
		if r.IntN(3) == 0 {
			if err := s.Sync(); err != nil {
				fmt.Println("sync error:", err)
				os.Exit(3)
			}
			fmt.Fprintf(out, "synced %d\n", next)
			out.Flush()
		}
	}
}

func TestCrashProcess(t *testing.T) {
	points := 24
	if v := os.Getenv("PACKSTORE_CRASH_POINTS"); v != "" {
		points, _ = strconv.Atoi(v)
	} else if testing.Short() {
		points = 6
	}
	segment, _ := strconv.Atoi(os.Getenv("PACKSTORE_CRASH_SEGMENT"))
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 2))
	dir := t.TempDir()
	acked := 0 // records 0..acked-1 were acknowledged by a completed Sync
	lost, corrupt, kills, totalAcked, stores := 0, 0, 0, 0, 1
	for kill := range points {
		if segment > 0 && kill > 0 && kill%segment == 0 {
			// A fresh store: what the last one acknowledged was checked at
			// this segment's last kill point.
			totalAcked += acked
			acked, stores = 0, stores+1
			dir = t.TempDir()
		}
		cmd, lines := startChild(t, "TestCrashChild", "PACKSTORE_CRASH_DIR="+dir,
			fmt.Sprintf("PACKSTORE_CRASH_NEXT=%d", acked), fmt.Sprintf("PACKSTORE_CRASH_SEED=%d", seed+uint64(kill)))
		childAcked := acked
		superviseChild(t, cmd, lines, time.After(time.Duration(20+r.IntN(150))*time.Millisecond), func(l string) <-chan time.Time {
			if n, ok := strings.CutPrefix(l, "synced "); ok {
				childAcked, _ = strconv.Atoi(n)
			}
			return nil
		}, nil)
		kills++
		acked = childAcked
		s, err := Open(Options{Dir: dir, MaxShardBytes: 64 << 10, Compress: true})
		if err != nil {
			t.Fatalf("kill %d: reopen: %v", kill, err)
		}
		for seq := range acked {
			coll, id, want := crashRecord(seq)
			got, err := s.Get(coll, id)
			switch {
			case IsCorruption(err):
				corrupt++
			case err != nil || !bytes.Equal(got, want):
				lost++
			}
		}
		for c := range crashColls {
			ids, err := s.CollectionRecords(idN(1, c))
			if err != nil {
				corrupt++
				continue
			}
			for _, id := range ids {
				got, err := s.Get(idN(1, c), id)
				seq := seqOf(id, acked+5000)
				if _, _, want := crashRecord(seq); seq < 0 || err != nil || !bytes.Equal(got, want) {
					if !errors.Is(err, ErrNotFound) {
						corrupt++
					}
				}
			}
		}
		if err := s.Check(); err != nil {
			t.Errorf("kill %d: Check: %v", kill, err)
		}
		s.Close()
		if lost+corrupt > 0 {
			break
		}
	}
	totalAcked += acked
	t.Logf("crash summary: %d kill points, %d stores, %d records acknowledged, %d lost, %d corrupt (seed %d)", kills, stores, totalAcked, lost, corrupt, seed)
	fmt.Printf("crash summary: %d kill points, %d stores, %d records acknowledged, %d lost, %d corrupt\n", kills, stores, totalAcked, lost, corrupt)
	if lost+corrupt > 0 {
		t.Fatalf("%d lost, %d corrupt", lost, corrupt)
	}
}

// startChild re-runs this test binary as a child process running only the
// test named child, with env added to the environment, and returns it with
// a channel of its stdout lines (closed when the child exits).
func startChild(t *testing.T, child string, env ...string) (*exec.Cmd, <-chan string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+child+"$")
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return cmd, lines
}

// superviseChild reads a child's stdout lines until it exits, calling
// onLine for each; a line containing "error" kills the child, is passed to
// onLine and fails the test. It SIGKILLs
// the child when timer fires (nil: never), calling onKill first if set;
// onLine may return a new timer (nil keeps the current one). It waits for
// the child and reports whether it killed it.
func superviseChild(t *testing.T, cmd *exec.Cmd, lines <-chan string, timer <-chan time.Time, onLine func(l string) <-chan time.Time, onKill func()) (killed bool) {
	t.Helper()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				cmd.Wait()
				return killed
			}
			if strings.Contains(l, "error") {
				cmd.Process.Kill()
				cmd.Wait()
				onLine(l) // the child is gone: onLine may open the store to report
				t.Fatalf("child: %s", l)
			}
			if next := onLine(l); next != nil {
				timer = next
			}
		case <-timer:
			if onKill != nil {
				onKill()
			}
			cmd.Process.Signal(syscall.SIGKILL)
			timer, killed = nil, true
		}
	}
}

// seqOf finds the sequence number of a record ID below limit, or -1.
var seqCache = map[ID]int{}

func seqOf(id ID, limit int) int {
	if n, ok := seqCache[id]; ok {
		return n
	}
	for n := len(seqCache); n < limit; n++ {
		seqCache[idN(2, n)] = n
	}
	if n, ok := seqCache[id]; ok {
		return n
	}
	return -1
}
