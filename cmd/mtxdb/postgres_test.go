package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/mtxdb/mtxdb/pgstore"
	"github.com/mtxdb/mtxdb/pgstore/pgtest"
)

// roomID reads the room ID from a room directory's meta.json.
func roomID(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		RoomID string `json:"room_id"`
	}
	if err := json.Unmarshal(b, &m); err != nil || m.RoomID == "" {
		t.Fatalf("%s/meta.json: no room_id (%v)", dir, err)
	}
	return m.RoomID
}

// TestCLIPostgres: the commands on a postgres:// store. Read-only commands on
// an empty database fail without creating the schema; then the main job of
// TestCLIMainJob, with the read-only commands on a read-only session.
func TestCLIPostgres(t *testing.T) {
	url := pgtest.NewDatabase(t)
	for _, step := range [][]string{
		{"verify", "--store", url},
		{"stats", "--store", url},
		{"state", "--store", url, "--room", "!x:y"},
		{"replay", "--store", url},
	} {
		if out, code := run(t, step...); code != 1 || !strings.Contains(out, "no mtxdb store in that database") {
			t.Fatalf("%v on an empty database: exit %d\n%s", step[0], code, out)
		}
	}
	if _, err := pgstore.Open(pgstore.Options{URL: url, NoCreate: true}); !errors.Is(err, pgstore.ErrNoSchema) {
		t.Fatalf("a read-only command created the schema: %v", err)
	}
	mainJob(t, url)
	if out, code := run(t, "stats", "--store", url, "--reads"); code != 1 || !strings.Contains(out, "PostgreSQL") {
		t.Errorf("stats --reads on PostgreSQL: exit %d\n%s", code, out)
	}
	if out, _ := run(t, "import", "--store", url, room("room003")); strings.Contains(out, pgPassword(url)) {
		t.Errorf("output shows the password: %s", out)
	}
}

// pgPassword returns the password of a postgres:// URL ("\x00" if none, which
// no output contains).
func pgPassword(url string) string {
	at := strings.LastIndex(url, "@")
	colon := strings.LastIndex(url[:max(at, 0)], ":")
	if at < 0 || colon < len("postgres://") {
		return "\x00"
	}
	return url[colon+1 : at]
}

// TestCLIPostgresTwoProcesses: two mtxdb processes import and replay different
// rooms (A: a generated room; B: another generated room and four real ones)
// into one database at the same time; one of them is killed (SIGKILL)
// in the middle of its replay; the other finishes, a rerun of the killed one
// finishes, and a third process verifies every room against its recorded
// state with 0 mismatches.
func TestCLIPostgresTwoProcesses(t *testing.T) {
	url := pgtest.NewDatabase(t)
	dir := t.TempDir()
	gen := filepath.Join(dir, "gen")
	// Replay writes a batch of state records (and the snapshot nodes behind
	// them) every 1,000 events: A's room is large enough that the test sees a
	// batch land well before the replay ends, on a loaded machine too.
	if out, code := run(t, "gen", "--seed", "11", "--events", "6000", "--out", gen); code != 0 {
		t.Fatalf("gen: exit %d\n%s", code, out)
	}
	genRoom := roomID(t, gen)
	genB := filepath.Join(dir, "genb")
	if out, code := run(t, "gen", "--seed", "12", "--events", "2500", "--out", genB); code != 0 {
		t.Fatalf("gen: exit %d\n%s", code, out)
	}
	real := []string{genB, room("room001"), room("room002"), room("room003"), room("room006")}
	var realIDs []string
	for _, r := range real {
		realIDs = append(realIDs, roomID(t, r))
	}

	// Process B: import the real rooms, then replay each, at the same time as A.
	type result struct {
		out  string
		code int
	}
	// B's replays start only once A's replay has started, so the two overlap
	// however fast this machine is (CI once finished B before A had begun).
	bDone := make(chan result, 1)
	bEnd := make(chan time.Time, 1)
	aStarted := make(chan struct{})
	go func() {
		defer func() { bEnd <- time.Now() }()
		var all strings.Builder
		steps := [][]string{append([]string{"import", "--store", url}, real...)}
		for _, id := range realIDs {
			steps = append(steps, []string{"replay", "--store", url, "--room", id})
		}
		for i, step := range steps {
			if i == 1 {
				select {
				case <-aStarted:
				case <-time.After(3 * time.Minute):
					bDone <- result{all.String() + "replay A never started", 1}
					return
				}
			}
			out, err := exec.Command(bin, step...).CombinedOutput()
			all.Write(out)
			if err != nil {
				bDone <- result{all.String() + err.Error(), 1}
				return
			}
		}
		bDone <- result{all.String(), 0}
	}()

	// Process A: import the generated room, start its replay, kill it once
	// state records are being written.
	if out, code := run(t, "import", "--store", url, gen); code != 0 {
		t.Fatalf("import A: exit %d\n%s", code, out)
	}
	eng, err := pgstore.Open(pgstore.Options{URL: url, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	coll := roomrecord.CollectionID(genRoom)
	ids, err := eng.CollectionRecords(coll)
	if err != nil {
		t.Fatal(err)
	}
	imported := len(ids)
	var aOut bytes.Buffer
	a := exec.Command(bin, "replay", "--store", url, "--room", genRoom)
	a.Stdout, a.Stderr = &aOut, &aOut
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	aStart := time.Now()
	close(aStarted)
	aExit := make(chan error, 1)
	go func() { aExit <- a.Wait() }()
	deadline := time.Now().Add(2 * time.Minute)
	killed := false
	for !killed {
		select {
		case err := <-aExit:
			t.Fatalf("replay A ended (%v) before the test saw it write: nothing was killed mid-replay\n%s", err, aOut.String())
		case <-time.After(20 * time.Millisecond):
		}
		ids, err := eng.CollectionRecords(coll)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) > imported+200 { // state records (and snapshot nodes) written
			if err := a.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			<-aExit
			killed = true
			t.Logf("killed replay A with %d of its room's records written (%d after import)", len(ids), imported)
		}
		if time.Now().After(deadline) {
			a.Process.Kill()
			t.Fatal("replay A wrote nothing in 2 minutes")
		}
	}
	b := <-bDone
	if (<-bEnd).Before(aStart) {
		t.Fatalf("process B ended before A's replay started: the processes did not overlap")
	}
	if b.code != 0 {
		t.Fatalf("process B failed beside A:\n%s", b.out)
	}
	if n := strings.Count(b.out, "replay: rooms=1 "); n != len(real) {
		t.Fatalf("process B replayed %d rooms, want %d:\n%s", n, len(real), b.out)
	}
	// What A left: the room verifies only partly replayed (verify counts the
	// events without state as problems), B's rooms all verify.
	args := []string{"verify", "--store", url}
	for _, r := range real {
		args = append(args, "--expected", r)
	}
	if out, code := run(t, append(args, "--room", realIDs[0])...); code != 0 {
		t.Fatalf("verify of B's room after A was killed: exit %d\n%s", code, out)
	}
	// A rerun of A continues from what it stored; then a third process verifies all.
	out, code := run(t, "replay", "--store", url, "--room", genRoom)
	if code != 0 {
		t.Fatalf("rerun of replay A: exit %d\n%s", code, out)
	}
	if strings.Contains(out, "computed=0 ") || !strings.Contains(out, "events=6000") {
		t.Fatalf("rerun of replay A: %s", out)
	}
	out, code = run(t, append(args, "--expected", gen)...)
	if code != 0 || !strings.Contains(out, "mismatches=0 problems=0") || !strings.Contains(out, "rooms=6") {
		t.Fatalf("verify of all rooms: exit %d\n%s", code, out)
	}
}

// TestCLIPostgresSameRoom: two processes importing and replaying the same room
// at once never corrupt it: each either succeeds or stops with the head
// conflict (exit 1), and after a rerun the room verifies.
func TestCLIPostgresSameRoom(t *testing.T) {
	url := pgtest.NewDatabase(t)
	r := room("room001")
	type result struct {
		out  string
		code int
	}
	res := make(chan result, 2)
	for range 2 {
		go func() {
			var all strings.Builder
			for _, step := range [][]string{{"import", "--store", url, "--batch", "50", r}, {"replay", "--store", url}} {
				out, err := exec.Command(bin, step...).CombinedOutput()
				all.Write(out)
				if err != nil {
					res <- result{all.String(), 1}
					return
				}
			}
			res <- result{all.String(), 0}
		}()
	}
	conflicts := 0
	for range 2 {
		x := <-res
		if x.code != 0 {
			if !strings.Contains(x.out, "changed by another writer") {
				t.Fatalf("a concurrent import/replay failed other than by a head conflict:\n%s", x.out)
			}
			conflicts++
		}
	}
	t.Logf("%d of 2 processes stopped on a head conflict", conflicts)
	for _, step := range [][]string{{"import", "--store", url, r}, {"replay", "--store", url}, {"verify", "--store", url, "--expected", r}} {
		if out, code := run(t, step...); code != 0 {
			t.Fatalf("%v after the race: exit %d\n%s", step[0], code, out)
		}
	}
}
