package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mtxdb/mtxdb/testrooms"
)

// The tests of this file check what a new user trips over.

// genRoom generates a room of n events (seed 5, 3 servers) into a new directory.
func genRoom(t *testing.T, n int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "room")
	if o, code := run(t, "gen", "--seed", "5", "--servers", "3", "--events", strconv.Itoa(n), "--out", dir); code != 0 {
		t.Fatalf("gen: exit %d\n%s", code, o)
	}
	return dir
}

// mustRun runs the CLI and fails the test unless it exits 0.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	o, code := run(t, args...)
	if code != 0 {
		t.Fatalf("%v: exit %d\n%s", args, code, o)
	}
	return o
}

// field returns the integer value of key=N in a summary line of out.
func field(t *testing.T, out, key string) int {
	t.Helper()
	m := regexp.MustCompile(`\b` + key + `=(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no %s= in\n%s", key, out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// runInterrupted runs the CLI with MTXDB_TEST_STALL=phase, sends SIGINT once the
// command says it stalls there, and returns stdout, stderr and the exit status.
func runInterrupted(t *testing.T, phase string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "MTXDB_TEST_STALL="+phase)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	pr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	sc := bufio.NewScanner(pr)
	stalled := false
	for sc.Scan() {
		stderr.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "test stall at "+phase) {
			stalled = true
			break
		}
	}
	if stalled {
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
	}
	rest, _ := io.ReadAll(pr)
	stderr.Write(rest)
	err = cmd.Wait()
	if !stalled {
		t.Fatalf("%v never reached %s (%v)\nstdout:\n%s\nstderr:\n%s", args, phase, err, stdout.String(), stderr.String())
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return stdout.String(), stderr.String(), code
}

// TestCLIVerifyUnreplayed: verify on a store that was only imported checks what is
// there, counts the events without state (unreplayed=, one line per room) and exits
// 0; with --expected it prints one "room not replayed" problem (exit 2), not a
// mismatch per event.
func TestCLIVerifyUnreplayed(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	mustRun(t, "import", "--store", store, room("room003"))
	out := mustRun(t, "verify", "--store", store)
	if field(t, out, "unreplayed") != 212 || !strings.Contains(out, "unreplayed room=!FymyxFJPGCZLfPcMwA:server1.test: 212 of 212 events") {
		t.Errorf("verify of an imported store:\n%s", out)
	}
	out, code := run(t, "verify", "--store", store, "--expected", room("room003"))
	if code != 2 || strings.Count(out, "room not replayed") != 1 || strings.Contains(out, "mismatch room=") {
		t.Errorf("verify --expected before replay: exit %d\n%s", code, out)
	}
	if out, code := run(t, "repack", "--store", store); code != 2 || !strings.Contains(out, "problem room=!FymyxFJPGCZLfPcMwA:server1.test") || !strings.Contains(out, "run mtxdb replay on the store first") {
		t.Errorf("repack before replay: exit %d\n%s", code, out)
	}
	mustRun(t, "replay", "--store", store)
	out = mustRun(t, "verify", "--store", store, "--expected", room("room003"))
	if field(t, out, "unreplayed") != 0 || field(t, out, "compared_events") == 0 {
		t.Errorf("verify after replay:\n%s", out)
	}
}

// TestCLIReplayInterrupted: Ctrl-C during replay stops it with the states computed
// so far synced, says how to continue, exits 130; verify then checks those states
// and counts the rest as unreplayed; the advised command finishes the room, which
// matches its recording. An interrupted replay --force advises --force again.
func TestCLIReplayInterrupted(t *testing.T) {
	roomDir := genRoom(t, 2500)
	store := filepath.Join(t.TempDir(), "s")
	mustRun(t, "import", "--store", store, roomDir)
	out, errOut, code := runInterrupted(t, "replay-1000", "replay", "--store", store)
	if code != 130 || !strings.Contains(errOut, "run mtxdb replay --store "+store+" to continue") || field(t, out, "computed") != 1000 {
		t.Fatalf("interrupted replay: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	out = mustRun(t, "verify", "--store", store)
	if field(t, out, "unreplayed") != 1500 || field(t, out, "snapshots") == 0 {
		t.Errorf("verify after an interrupted replay:\n%s", out)
	}
	out = mustRun(t, "replay", "--store", store)
	if field(t, out, "computed") != 1500 {
		t.Errorf("replay after the interrupted one:\n%s", out)
	}
	mustRun(t, "verify", "--store", store, "--expected", roomDir)

	_, errOut, code = runInterrupted(t, "replay-1000", "replay", "--store", store, "--force")
	if code != 130 || !strings.Contains(errOut, "--force again") {
		t.Fatalf("interrupted replay --force: exit %d\n%s", code, errOut)
	}
	mustRun(t, "replay", "--store", store, "--force")
	mustRun(t, "verify", "--store", store, "--expected", roomDir)
}

// TestCLIImportInterrupted: Ctrl-C during import stops after a read with what came
// before stored, says so, exits 130; the same import again finishes the room.
func TestCLIImportInterrupted(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	out, errOut, code := runInterrupted(t, "import-read", "import", "--store", store, "--batch", "100", room("room001"), room("room003"))
	if code != 130 || !strings.Contains(errOut, "run the same import again to continue") || !strings.Contains(errOut, "1 more input(s) not started") || strings.Contains(out+errOut, "malformed") {
		t.Fatalf("interrupted import: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	out = mustRun(t, "import", "--store", store, room("room001"), room("room003"))
	mustRun(t, "replay", "--store", store)
	mustRun(t, "verify", "--store", store, "--expected", room("room001"), "--expected", room("room003"))
	if !strings.Contains(out, "room003/events.jsonl: read=212 imported=212") {
		t.Errorf("second import:\n%s", out)
	}
}

// TestCLIRepackInterrupted: Ctrl-C while a repack copies exits 130 (not 0) and says
// what was kept; the store verifies and repacks again.
func TestCLIRepackInterrupted(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	mustRun(t, "import", "--store", store, room("room003"))
	mustRun(t, "replay", "--store", store)
	_, errOut, code := runInterrupted(t, "repack-copy", "repack", "--store", store, "--plan", "auth-chain", "--liveness", "every-k", "--every", "4")
	// The advice repeats the command as given: plan, liveness, the room.
	id := roomID(t, room("room003")) // "!...": quoted in the advice, pasted into a shell as is
	again := "mtxdb repack --store " + store + " --room '" + id + "' --plan auth-chain --liveness every-k --every 4"
	if code != 130 || !strings.Contains(errOut, "stopped during the copy: the store stays consistent") || !strings.Contains(errOut, "run "+again+" again") {
		t.Fatalf("interrupted repack: exit %d, want 130 and the advice to run %s again\n%s", code, again, errOut)
	}
	mustRun(t, "verify", "--store", store, "--expected", room("room003"))
	mustRun(t, "repack", "--store", store, "--room", id, "--plan", "auth-chain", "--liveness", "every-k", "--every", "4")
}

// TestCLIImportDirectoryOfRooms: import takes a directory of room directories
// (symlinked ones included), as verify --expected and demo --rooms do; a directory
// with neither events.jsonl nor rooms is refused.
func TestCLIImportDirectoryOfRooms(t *testing.T) {
	dir := t.TempDir()
	rooms := filepath.Join(dir, "rooms")
	if err := os.MkdirAll(filepath.Join(rooms, "not-a-room"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"room001", "room003"} {
		if err := os.Symlink(room(name), filepath.Join(rooms, name)); err != nil {
			t.Fatal(err)
		}
	}
	store := filepath.Join(dir, "s")
	out := mustRun(t, "import", "--store", store, rooms)
	if strings.Count(out, "import ") != 2 || !strings.Contains(out, filepath.Join(rooms, "room003", "events.jsonl")) ||
		!strings.Contains(out, "import: files=2 read=") {
		t.Errorf("import of a directory of rooms:\n%s", out)
	}
	mustRun(t, "replay", "--store", store)
	mustRun(t, "verify", "--store", store, "--expected", rooms)
	if out, code := run(t, "import", "--store", store, filepath.Join(rooms, "not-a-room")); code != 1 || !strings.Contains(out, "without events.jsonl and without room directories") {
		t.Errorf("import of an empty directory: exit %d\n%s", code, out)
	}
}

// TestCLIImportBlankInput: an empty or blank input is skipped with a warning; when
// every input is, import fails (exit 1) and creates no store.
func TestCLIImportBlankInput(t *testing.T) {
	dir := t.TempDir()
	blank := filepath.Join(dir, "blank.jsonl")
	if err := os.WriteFile(blank, []byte("\xEF\xBB\xBF \n\t\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.jsonl")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(dir, "s")
	out, code := run(t, "import", "--store", store, blank, empty)
	if code != 1 || !strings.Contains(out, "nothing to import") || strings.Count(out, "is empty or blank: no PDUs") != 2 {
		t.Errorf("import of blank inputs: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(store); err == nil {
		t.Error("import of blank inputs created the store")
	}
	out = mustRun(t, "import", "--store", store, empty, room("room003"))
	if !strings.Contains(out, empty+" is empty or blank") || !strings.Contains(out, "imported=212") {
		t.Errorf("import of a blank and a real input:\n%s", out)
	}
}

// TestCLIRooms: mtxdb rooms lists every room (not ten, as stats does) with version,
// events, replayed, records and bytes; --json gives the same as JSON lines, and the
// other summaries' --json carries their text fields.
func TestCLIRooms(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	real := filepath.Join(testrooms.Dir(), "real")
	mustRun(t, "import", "--store", store, real)
	mustRun(t, "replay", "--store", store, "--room", "!FymyxFJPGCZLfPcMwA:server1.test")
	out := mustRun(t, "rooms", "--store", store)
	if field(t, out, "rooms") != 189 || !regexp.MustCompile(`(?m)^!FymyxFJPGCZLfPcMwA:server1\.test +1 +212 +true +1 +\d+ +\d+$`).MatchString(out) {
		t.Errorf("rooms:\n%s", out)
	}
	out = mustRun(t, "rooms", "--store", store, "--json")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 190 {
		t.Fatalf("rooms --json: %d lines, want 189 rooms and a total", len(lines))
	}
	replayed, bytes := 0, 0.0
	for _, l := range lines[:189] {
		var r struct {
			RoomID   string `json:"room_id"`
			Events   int
			Replayed bool
			Bytes    float64
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		if r.Events == 0 || r.Bytes <= 0 {
			t.Errorf("room line without events or bytes: %s", l)
		}
		if r.Replayed {
			replayed++
		}
		bytes += r.Bytes
	}
	if replayed != 1 {
		t.Errorf("%d rooms replayed, want 1", replayed)
	}
	var st map[string]any
	statsOut := mustRun(t, "stats", "--store", store, "--json")
	if err := json.Unmarshal([]byte(statsOut[:strings.Index(statsOut, "\n")]), &st); err != nil {
		t.Fatal(err)
	}
	if st["kind"] != "stats" || st["live_bytes"].(float64) < bytes {
		t.Errorf("stats --json: %v (rooms' bytes sum to %.0f)", st, bytes)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, "verify", "--store", store, "--room", "!FymyxFJPGCZLfPcMwA:server1.test", "--json")), &v); err != nil {
		t.Fatal(err)
	}
	if v["kind"] != "verify" || v["events"].(float64) != 212 || v["problems"].(float64) != 0 {
		t.Errorf("verify --json: %v", v)
	}
}

// TestCLIEmptyRoomFlag: --room ” is refused instead of meaning every room.
func TestCLIEmptyRoomFlag(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	mustRun(t, "import", "--store", store, room("room003"))
	for _, c := range []string{"verify", "replay", "repack"} {
		if out, code := run(t, c, "--store", store, "--room", " "); code != 1 || !strings.Contains(out, "--room is empty") {
			t.Errorf("%s --room ' ': exit %d\n%s", c, code, out)
		}
	}
}

// TestCLIHelpListsPlanKinds: repack and import --help list the plan kinds as words,
// not a Go slice, and say --every's default.
func TestCLIHelpListsPlanKinds(t *testing.T) {
	for _, c := range []string{"repack", "import"} {
		out := mustRun(t, c, "--help")
		if !strings.Contains(out, "reverse-topological, auth-chain, edges-first, mixed") || strings.Contains(out, "[reverse-topological") || !strings.Contains(out, `(default 16)`) {
			t.Errorf("%s --help:\n%s", c, out)
		}
	}
}

// TestCLIVerifyCorruptRoomCounted: a room whose check fails is a problem whose
// events are counted as unchecked_events, not silently left out of events=.
func TestCLIVerifyCorruptRoomCounted(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	mustRun(t, "import", "--store", store, room("room003"))
	shard := filepath.Join(store, "shard-00000.mtdb")
	fi, err := os.Stat(shard)
	if err != nil {
		t.Fatal(err)
	}
	room003 := fi.Size() // room003's PDUs end here
	mustRun(t, "import", "--store", store, room("room001"))
	mustRun(t, "replay", "--store", store)
	total := field(t, mustRun(t, "verify", "--store", store), "events")
	b, err := os.ReadFile(shard)
	if err != nil {
		t.Fatal(err)
	}
	// Damage bytes in the middle of room003's PDUs: that frame fails its CRC-32C.
	for i := room003 / 2; i < room003/2+64; i++ {
		b[i] ^= 0x5a
	}
	if err := os.WriteFile(shard, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := run(t, "verify", "--store", store)
	if code != 2 || field(t, out, "problems") != 1 || field(t, out, "unchecked_events") != 212 || field(t, out, "events")+212 != total ||
		!strings.Contains(out, "its 212 events are not checked") {
		t.Errorf("verify with a damaged room (of %d events in all): exit %d\n%s", total, code, out)
	}
}

// TestVerifyLostStoreIsNotAProblem: when the store goes away under verify (here:
// the engine closed), verifyRoomsTo returns the error (exit 1) instead of counting
// each room as a data problem (exit 2, which is for damaged data).
func TestVerifyLostStoreIsNotAProblem(t *testing.T) {
	ctx := t.Context()
	store := filepath.Join(t.TempDir(), "s")
	mustRun(t, "import", "--store", store, room("room003"))
	eng, rooms, _, err := openRoomsAndErrors(ctx, store, "", true)
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	v, err := verifyRoomsTo(ctx, rooms, nil, &out, false)
	if err == nil || isDataProblem(err) || v.problems != 0 {
		t.Fatalf("verify of a closed store: err %v, %d problems\n%s", err, v.problems, out.String())
	}
	if !lostStore(err) {
		t.Errorf("lostStore(%v) is false", err)
	}
}

// TestCLIProgress: verify, replay and repack draw a progress bar (MTXDB_PROGRESS=1
// draws it on standard error when the output is not a terminal), cleared before
// the summary; without it a pipe gets none.
func TestCLIProgress(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	mustRun(t, "import", "--store", store, room("room003"))
	for _, c := range [][]string{
		{"replay", "--store", store},
		{"verify", "--store", store, "--expected", room("room003")},
		{"repack", "--store", store},
	} {
		cmd := exec.Command(bin, c...)
		cmd.Env = append(os.Environ(), "MTXDB_PROGRESS=1")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%v: %v\n%s%s", c, err, stdout.String(), stderr.String())
		}
		bar := regexp.MustCompile(`\r` + c[0] + ` +\d+% \|`)
		if !bar.MatchString(stderr.String()) || strings.Contains(stdout.String(), "%") {
			t.Errorf("%v: no progress bar on stderr, or one on stdout:\nstdout %q\nstderr %q", c, stdout.String(), stderr.String())
		}
		if !strings.HasSuffix(stderr.String(), "\r") {
			t.Errorf("%v: the bar is not cleared at the end: %q", c, stderr.String())
		}
	}
	if out, _ := run(t, "verify", "--store", store); strings.Contains(out, "%") {
		t.Errorf("a bar on a pipe without MTXDB_PROGRESS:\n%s", out)
	}
}

// TestCLIDemoInterrupted: Ctrl-C during demo removes its temporary store, says so
// and exits 130.
func TestCLIDemoInterrupted(t *testing.T) {
	rooms := t.TempDir()
	if err := os.Symlink(room("room003"), filepath.Join(rooms, "room003")); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runInterrupted(t, "demo-imported", "demo", "--rooms", rooms)
	m := regexp.MustCompile(`into (\S+)`).FindStringSubmatch(out)
	if code != 130 || m == nil || !strings.Contains(errOut, "its temporary store was removed") {
		t.Fatalf("interrupted demo: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if _, err := os.Stat(filepath.Dir(m[1])); err == nil {
		t.Errorf("the demo's temporary store %s is left", m[1])
	}
}

// TestCLIStatsReadsJSON: stats --reads --json prints one JSON object per walk and a
// total whose counters add up.
func TestCLIStatsReadsJSON(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	mustRun(t, "import", "--store", store, room("room003"))
	mustRun(t, "replay", "--store", store)
	out := mustRun(t, "stats", "--store", store, "--reads", "--json")
	var walks int
	var reads float64
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		switch m["kind"] {
		case "walk":
			walks++
			reads += m["total"].(map[string]any)["reads"].(float64)
		case "reads":
			if m["walks"].(float64) != 4 || m["reads"].(float64) != reads || reads == 0 {
				t.Errorf("total %v, walks summed to %.0f reads", m, reads)
			}
		default:
			t.Errorf("unexpected line %s", l)
		}
	}
	if walks != 4 {
		t.Errorf("%d walk lines, want 4:\n%s", walks, out)
	}
}

// TestCLIWarnsMissingCheckpoint: a store whose index.ckpt is gone opens by a
// full scan, and every command says so on stderr (read-only ones each time,
// since they write no new checkpoint); with the file present nothing is said.
func TestCLIWarnsMissingCheckpoint(t *testing.T) {
	st := filepath.Join(t.TempDir(), "store")
	if out, code := run(t, "import", "--store", st, room("room001")); code != 0 {
		t.Fatalf("import: exit %d\n%s", code, out)
	}
	if out, code := run(t, "rooms", "--store", st); code != 0 || strings.Contains(out, "warning") {
		t.Fatalf("rooms with index.ckpt: exit %d, want 0 and no warning\n%s", code, out)
	}
	if err := os.Remove(filepath.Join(st, "index.ckpt")); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		out, code := run(t, "rooms", "--store", st)
		if code != 0 || !strings.Contains(out, "warning: "+st+": no index.ckpt: index rebuilt by scanning") {
			t.Fatalf("rooms without index.ckpt: exit %d, want 0 and the scan warning\n%s", code, out)
		}
	}
}

// TestCLIRepackOneRoomOfShared: repacking one room of two that share a shard
// retires nothing and adds the room's new shard: the summary says grown=N and
// returned=0, never a negative returned.
func TestCLIRepackOneRoomOfShared(t *testing.T) {
	st := filepath.Join(t.TempDir(), "store")
	if out, code := run(t, "import", "--store", st, room("room001"), room("room002")); code != 0 {
		t.Fatalf("import: exit %d\n%s", code, out)
	}
	if out, code := run(t, "replay", "--store", st); code != 0 {
		t.Fatalf("replay: exit %d\n%s", code, out)
	}
	out, code := run(t, "repack", "--store", st, "--room", roomID(t, room("room001")))
	if code != 0 {
		t.Fatalf("repack --room: exit %d\n%s", code, out)
	}
	grown := regexp.MustCompile(` grown=([0-9]+)`).FindStringSubmatch(out)
	if strings.Contains(out, "returned=-") || !strings.Contains(out, " returned=0 ") || grown == nil || grown[1] == "0" {
		t.Fatalf("repack --room of a shared shard: want returned=0 and grown>0\n%s", out)
	}
}

// TestCLIImportUnknownRoomVersionFlag: --room-version naming no room version is
// refused before anything is read or a store created (it refused thousands of
// PDUs one by one, and a rerun ignored the flag).
func TestCLIImportUnknownRoomVersionFlag(t *testing.T) {
	st := filepath.Join(t.TempDir(), "store")
	out, code := run(t, "import", "--store", st, "--any-order", "--room-version", "99", room("room001"))
	if code != 1 || !strings.Contains(out, `--room-version "99": pdu: unknown room version`) {
		t.Fatalf("import --room-version 99: exit %d, want 1 and the flag named\n%s", code, out)
	}
	if _, err := os.Stat(st); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the store was created (%v)", err)
	}
}

// TestCLIRoomDirWithoutEvents: in a directory of rooms, a subdirectory without
// events.jsonl is skipped by import with a warning naming it, and verify
// --expected still compares the recorded room it holds (expected_state.jsonl and
// meta.json): that room is not in the store, a problem, exit 2.
func TestCLIRoomDirWithoutEvents(t *testing.T) {
	dir := t.TempDir()
	rooms := filepath.Join(dir, "rooms")
	copyRoomFiles(t, room("room002"), filepath.Join(rooms, "room002"), nil, "events.jsonl", "expected_state.jsonl", "meta.json")
	// A recorded room whose events are not there.
	copyRoomFiles(t, room("room003"), filepath.Join(rooms, "room003"), nil, "expected_state.jsonl", "meta.json")
	store := filepath.Join(dir, "s")
	out, code := run(t, "import", "--store", store, rooms)
	if code != 0 || !strings.Contains(out, "warning: "+filepath.Join(rooms, "room003")+" holds no events.jsonl: skipped") {
		t.Fatalf("import: exit %d\n%s", code, out)
	}
	// --json: the skipped directory is an object on stdout too, beside the
	// warning on stderr.
	stdout, err := exec.Command(bin, "import", "--json", "--store", filepath.Join(dir, "sj"), rooms).Output()
	if err != nil {
		t.Fatalf("import --json: %v\n%s", err, stdout)
	}
	skipped := false
	for _, line := range strings.Split(strings.TrimSpace(string(stdout)), "\n") {
		var o struct{ Kind, Path, Reason string }
		if err := json.Unmarshal([]byte(line), &o); err != nil {
			t.Fatalf("import --json printed %q: %v", line, err)
		}
		skipped = skipped || o.Kind == "skipped" && o.Path == filepath.Join(rooms, "room003") && o.Reason == "no events.jsonl"
	}
	if !skipped {
		t.Fatalf("import --json: no skipped object for room003\n%s", stdout)
	}
	if out, code := run(t, "replay", "--store", store); code != 0 {
		t.Fatalf("replay: exit %d\n%s", code, out)
	}
	out, code = run(t, "verify", "--store", store, "--expected", rooms)
	if code != 2 || !strings.Contains(out, "recorded in "+filepath.Join(rooms, "room003")+" but not in the store") || !strings.Contains(out, "compared_room_dirs=1 ") {
		t.Fatalf("verify --expected: exit %d\n%s", code, out)
	}
}

// TestCLIDemoKeepFailsClean: demo --keep that cannot read its rooms leaves no
// temporary directory behind, not even an empty one.
func TestCLIDemoKeepFailsClean(t *testing.T) {
	tmp := t.TempDir()
	cmd := exec.Command(bin, "demo", "--keep", "--rooms", filepath.Join(tmp, "no-such-rooms"))
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "demo: rooms:") {
		t.Fatalf("demo --keep without rooms: exit %d\n%s", cmd.ProcessState.ExitCode(), out)
	}
	left, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Fatalf("demo --keep left %v in TMPDIR", left)
	}
}

// TestCLIDemoPipeClosed: demo whose reader goes away after the first line (as
// `mtxdb demo | head -1`) still removes its temporary store: SIGPIPE does not
// kill it with the store left in TMPDIR.
func TestCLIDemoPipeClosed(t *testing.T) {
	tmp := t.TempDir()
	cmd := exec.Command(bin, "demo")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.Dir = filepath.Dir(testrooms.Dir()) // the repository: demo's default rooms
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "demo: imported") {
		t.Fatalf("first line %q: %v", line, err)
	}
	stdout.Close() // the reader goes away
	_ = cmd.Wait()
	left, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Fatalf("demo with its stdout closed left %v in TMPDIR", left)
	}
}

// TestCLIVerifySkipsJunkLoudly: verify --expected over a directory of rooms warns
// of a subdirectory that is neither a room nor a recorded room, naming it.
func TestCLIVerifySkipsJunkLoudly(t *testing.T) {
	dir := t.TempDir()
	rooms := filepath.Join(dir, "rooms")
	if err := os.MkdirAll(filepath.Join(rooms, "junk"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(room("room002"), filepath.Join(rooms, "room002")); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(dir, "s")
	if out, code := run(t, "import", "--store", store, rooms); code != 0 {
		t.Fatalf("import: exit %d\n%s", code, out)
	}
	if out, code := run(t, "replay", "--store", store); code != 0 {
		t.Fatalf("replay: exit %d\n%s", code, out)
	}
	out, code := run(t, "verify", "--store", store, "--expected", rooms)
	if code != 0 || !strings.Contains(out, "warning: "+filepath.Join(rooms, "junk")+" holds neither events.jsonl nor expected_state.jsonl: skipped") {
		t.Fatalf("verify --expected: exit %d\n%s", code, out)
	}
}

// TestCLIDemoRoomWithoutEvents: demo given a recorded room whose events.jsonl is
// missing says which room before it makes a store (not a bare "open ...: no
// such file" after importing the rooms before it), and a failure after the
// store is made names the store --keep leaves.
func TestCLIDemoRoomWithoutEvents(t *testing.T) {
	tmp := t.TempDir()
	rooms, scratch := filepath.Join(tmp, "rooms"), filepath.Join(tmp, "scratch")
	src := filepath.Join(testrooms.Dir(), "real", "room001")
	copyRoomFiles(t, src, filepath.Join(rooms, "a"), nil, "events.jsonl", "expected_state.jsonl", "meta.json")
	copyRoomFiles(t, src, filepath.Join(rooms, "b"), nil, "expected_state.jsonl", "meta.json")
	if err := os.Mkdir(scratch, 0o755); err != nil {
		t.Fatal(err)
	}
	demo := func() (int, string) {
		cmd := exec.Command(bin, "demo", "--keep", "--rooms", rooms)
		cmd.Env = append(os.Environ(), "TMPDIR="+scratch)
		out, _ := cmd.CombinedOutput()
		return cmd.ProcessState.ExitCode(), string(out)
	}
	code, out := demo()
	if code != 1 || !strings.Contains(out, filepath.Join(rooms, "b")+" has the state its server recorded (expected_state.jsonl) but no events.jsonl") {
		t.Fatalf("demo with a room without events.jsonl: exit %d\n%s", code, out)
	}
	if left, _ := os.ReadDir(scratch); len(left) != 0 {
		t.Fatalf("demo --keep left %v in TMPDIR", left)
	}
	// events.jsonl a directory: the import fails after the store is made.
	if err := os.Mkdir(filepath.Join(rooms, "b", "events.jsonl"), 0o755); err != nil {
		t.Fatal(err)
	}
	code, out = demo()
	left, _ := os.ReadDir(scratch)
	if code != 1 || len(left) != 1 || !strings.Contains(out, "(the store is left in "+filepath.Join(scratch, left[0].Name(), "store")+")") {
		t.Fatalf("demo --keep failing on an import: exit %d, TMPDIR holds %v\n%s", code, left, out)
	}
}

// TestCLIVerifyExpectedTwice: verify --expected given one room directory twice
// compares it once: no event is counted twice.
func TestCLIVerifyExpectedTwice(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	if out, code := run(t, "import", "--store", store, room("room002")); code != 0 {
		t.Fatalf("import: exit %d\n%s", code, out)
	}
	if out, code := run(t, "replay", "--store", store); code != 0 {
		t.Fatalf("replay: exit %d\n%s", code, out)
	}
	once, code := run(t, "verify", "--store", store, "--expected", room("room002"))
	if code != 0 {
		t.Fatalf("verify: exit %d\n%s", code, once)
	}
	link := filepath.Join(t.TempDir(), "link002")
	if err := os.Symlink(room("room002"), link); err != nil {
		t.Fatal(err)
	}
	twice, code := run(t, "verify", "--store", store, "--expected", room("room002"), "--expected", room("room002")+"/", "--expected", link)
	if code != 0 || strings.Count(twice, "given more than once: read once") != 2 {
		t.Fatalf("verify with the room three times (a trailing slash, a symlink): exit %d\n%s", code, twice)
	}
	count := func(out string) string {
		for _, f := range strings.Fields(out) {
			if strings.HasPrefix(f, "compared_events=") {
				return f
			}
		}
		t.Fatalf("no compared_events= in\n%s", out)
		return ""
	}
	if count(once) != count(twice) || count(once) == "compared_events=0" {
		t.Fatalf("compared once %s, given twice %s", count(once), count(twice))
	}
}

// TestCLIImportFromPipe: import reads a pipe and a FIFO from their start, once:
// the blank-input check keeps what it reads ahead, so `cat events.jsonl | mtxdb
// import /dev/stdin` imports every PDU, and a FIFO is opened only once.
func TestCLIImportFromPipe(t *testing.T) {
	events := filepath.Join(room("room003"), "events.jsonl")
	want := "read=212 imported=212 skipped=0 variants=0 refused=0"
	dir := t.TempDir()
	b, err := os.ReadFile(events)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "import", "--store", filepath.Join(dir, "s1"), "/dev/stdin")
	cmd.Stdin = bytes.NewReader(b) // not an *os.File: exec makes a pipe and copies into it
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), want) {
		t.Fatalf("import from a pipe: %v\n%s", err, out)
	}
	// An empty pipe, and a file holding an empty array: nothing to import, no
	// store is made.
	if err := os.WriteFile(filepath.Join(dir, "empty.json"), []byte(" [ ] \n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"/dev/stdin"}, {filepath.Join(dir, "empty.json")}} {
		e := filepath.Join(dir, "e")
		cmd := exec.Command(bin, append([]string{"import", "--store", e}, args...)...)
		cmd.Stdin = strings.NewReader("")
		out, _ := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "nothing to import: the inputs hold no PDU") {
			t.Fatalf("import of %v holding no PDU: exit %d\n%s", args, cmd.ProcessState.ExitCode(), out)
		}
		if _, err := os.Stat(e); err == nil {
			t.Fatalf("import of %v holding no PDU created the store", args)
		}
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	go func() {
		if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			w.Write(b)
			w.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a guard against the old hang, not a measurement
	defer cancel()
	out, err = exec.CommandContext(ctx, bin, "import", "--store", filepath.Join(dir, "s2"), fifo).CombinedOutput()
	if err != nil || !strings.Contains(string(out), want) {
		t.Fatalf("import from a FIFO: %v\n%s", err, out)
	}
}

// TestCLIDemoStores: demo refuses a --store that already holds rooms (it would
// replay and repack them too, and its summary would mix their counts with the
// demo's); a mismatch found before and after the repack counts once in the
// summary; and with --keep a mismatch exit names the store on stderr.
func TestCLIDemoStores(t *testing.T) {
	tmp := t.TempDir()
	held := filepath.Join(tmp, "held")
	if out, code := run(t, "import", "--store", held, room("room003")); code != 0 {
		t.Fatalf("import: exit %d\n%s", code, out)
	}
	if out, code := run(t, "demo", "--store", held, "--rooms", filepath.Dir(room("room002"))); code != 1 || !strings.Contains(out, "already holds 1 room(s)") {
		t.Fatalf("demo into a store with a room: exit %d\n%s", code, out)
	}
	rooms := filepath.Join(tmp, "rooms")
	copyRoomFiles(t, room("room002"), filepath.Join(rooms, "room002"), func(f string, b []byte) []byte {
		if f == "current_state.json" {
			// One wrong entry in the recorded current state: one mismatch.
			b = regexp.MustCompile(`("m\.room\.create\\u0000": )"[^"]+"`).ReplaceAll(b, []byte(`$1"$$not-the-create-event"`))
		}
		return b
	}, "events.jsonl", "expected_state.jsonl", "meta.json", "current_state.json")
	scratch := filepath.Join(tmp, "scratch")
	if err := os.Mkdir(scratch, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "demo", "--keep", "--rooms", rooms)
	cmd.Env = append(os.Environ(), "TMPDIR="+scratch)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	_ = cmd.Run()
	left, _ := os.ReadDir(scratch)
	if cmd.ProcessState.ExitCode() != 2 || len(left) != 1 || !strings.Contains(stdout.String(), " mismatches=1 ") ||
		!strings.Contains(stderr.String(), "the store is left in "+filepath.Join(scratch, left[0].Name(), "store")) {
		t.Fatalf("demo --keep with one mismatch: exit %d, TMPDIR holds %v\nstdout:\n%s\nstderr:\n%s", cmd.ProcessState.ExitCode(), left, &stdout, &stderr)
	}
}

// TestCLIExpectedWithoutRecording: verify --expected and demo given a room
// directory without expected_state.jsonl say so and exit 2 (a data problem).
func TestCLIExpectedWithoutRecording(t *testing.T) {
	tmp := t.TempDir()
	rooms := filepath.Join(tmp, "rooms")
	dst := filepath.Join(rooms, "noexp")
	copyRoomFiles(t, room("room003"), dst, nil, "events.jsonl", "meta.json")
	store := filepath.Join(tmp, "s")
	if out, code := run(t, "import", "--store", store, room("room003")); code != 0 {
		t.Fatalf("import: exit %d\n%s", code, out)
	}
	if out, code := run(t, "verify", "--store", store, "--expected", dst); code != 2 || !strings.Contains(out, dst+" is a room directory without expected_state.jsonl") {
		t.Fatalf("verify --expected on a room without a recording: exit %d\n%s", code, out)
	}
	if out, code := run(t, "demo", "--rooms", rooms); code != 2 || !strings.Contains(out, dst+" holds events.jsonl but no expected_state.jsonl") {
		t.Fatalf("demo on a room without a recording: exit %d\n%s", code, out)
	}
}

// TestCLIImportPipeInterrupted: SIGINT stops an import waiting on an idle pipe,
// with what it read stored and synced, exit 130, without waiting for the
// writer to close the pipe.
func TestCLIImportPipeInterrupted(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(room("room003"), "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	for _, n := range []int{100, 0} {
		store := filepath.Join(t.TempDir(), "s")
		stderr, code := importInterruptedOnPipe(t, store, strings.Join(lines[:n], ""))
		// How many were read before the signal depends on when the import first
		// waited (all of them unless it waited before the test wrote): what it
		// says it stored must be in the store.
		if code == 130 && strings.Contains(stderr, "before any PDU was read: no store written") {
			if _, err := os.Stat(store); err == nil {
				t.Fatalf("%d lines: interrupted before any PDU, and the store was made\n%s", n, stderr)
			}
			continue
		}
		m := regexp.MustCompile(`the (\d+) PDUs imported from it are stored and synced`).FindStringSubmatch(stderr)
		if code != 130 || m == nil || n == 0 {
			t.Fatalf("import of %d lines interrupted on an idle pipe: exit %d\n%s", n, code, stderr)
		}
		if out, code := run(t, "stats", "--store", store); code != 0 || !strings.Contains(out, "events="+m[1]+" ") {
			t.Fatalf("after the interrupted import (%s PDUs stored, it says): exit %d\n%s", m[1], code, out)
		}
	}
}

// importInterruptedOnPipe runs import on a pipe fed with data and left open,
// sends SIGINT once the import says it waits on it, and returns its stderr and
// exit status. A guard closes the pipe if the import never says so, so the
// caller fails instead of hanging.
func importInterruptedOnPipe(t *testing.T, store, data string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin, "import", "--store", store, "/dev/stdin")
	cmd.Env = append(os.Environ(), "MTXDB_TEST_STALL=import-pipe-wait")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(in, data); err != nil {
		t.Fatal(err)
	}
	guard := time.AfterFunc(2*time.Minute, func() { in.Close() })
	defer guard.Stop()
	var stderr bytes.Buffer
	sc := bufio.NewScanner(errPipe)
	waiting := false
	for sc.Scan() {
		stderr.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "test stall at import-pipe-wait") {
			waiting = true
			break
		}
	}
	if waiting {
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
	}
	rest, _ := io.ReadAll(errPipe)
	stderr.Write(rest)
	_ = cmd.Wait()
	in.Close()
	if !waiting {
		t.Fatalf("import never said it waits on the pipe: exit %d\n%s", cmd.ProcessState.ExitCode(), &stderr)
	}
	return stderr.String(), cmd.ProcessState.ExitCode()
}

// copyRoomFiles copies the named files of the room directory src into dst
// (created), each through edit when it is given.
func copyRoomFiles(t *testing.T, src, dst string, edit func(file string, b []byte) []byte, files ...string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if edit != nil {
			b = edit(f, b)
		}
		if err := os.WriteFile(filepath.Join(dst, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCLIVerifyRoomOtherRecording: verify --room A --expected (a recording of room
// B) warns that the recording is not compared and, having compared nothing the
// user asked for, exits 2 with a problem line for room A; given A's recording as
// well, it compares that one and exits 0. Given a directory of many recordings,
// it names three of the others and counts the rest in one warning.
func TestCLIVerifyRoomOtherRecording(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	for _, r := range []string{"room002", "room003"} {
		if out, code := run(t, "import", "--store", store, room(r)); code != 0 {
			t.Fatalf("import %s: exit %d\n%s", r, code, out)
		}
	}
	if out, code := run(t, "replay", "--store", store); code != 0 {
		t.Fatalf("replay: exit %d\n%s", code, out)
	}
	const room003 = "!FymyxFJPGCZLfPcMwA:server1.test"
	out, code := run(t, "verify", "--store", store, "--room", room003, "--expected", room("room002"))
	if !strings.Contains(out, room("room002")+" records room !uQKlwVmKZwIkKruPRv:server1.test, not --room "+room003+": not compared") {
		t.Fatalf("verify --room with another room's recording said nothing\n%s", out)
	}
	if want := "problem room=" + room003 + ": no --expected directory records this room"; code != 2 || !strings.Contains(out, want) || !strings.Contains(out, " problems=1 ") {
		t.Errorf("verify --room with only another room's recording: exit %d, want 2 and %q\n%s", code, want, out)
	}
	out, code = run(t, "verify", "--store", store, "--room", room003, "--expected", room("room002"), "--expected", room("room003"))
	if code != 0 || !strings.Contains(out, " compared_room_dirs=1 ") {
		t.Errorf("verify --room with its own recording among others: exit %d, want 0 and compared_room_dirs=1\n%s", code, out)
	}
	// A directory of 190 recordings: three named, the rest counted in one line.
	out, code = run(t, "verify", "--store", store, "--room", room003, "--expected", filepath.Join(testrooms.Dir(), "real"))
	if n := strings.Count(out, "mtxdb: warning: "); code != 0 || n != 4 || !strings.Contains(out, "mtxdb: warning: 186 more recordings of rooms other than --room "+room003+": not compared") {
		t.Errorf("verify --room with the real rooms' directory: exit %d and %d warnings, want 0 and 4 (three named, one counting 186)\n%s", code, n, out)
	}
}

// TestCLIReplayFailedRoomPercentiles: a room whose replay fails midway (a byte
// flipped half-way into the imported shard, which holds the room's PDUs and
// graph records) is left out of the summary's resolution percentiles as it is of
// its counts: resolutions=0 comes with resolution_p50_us=0 and
// resolution_p99_us=0, though the replay resolved merges before the damaged
// frame.
func TestCLIReplayFailedRoomPercentiles(t *testing.T) {
	room := genRoom(t, 3000)
	store := filepath.Join(t.TempDir(), "store")
	mustRun(t, "import", "--store", store, room)
	flipMiddleByte(t, filepath.Join(store, "shard-00000.mtdb"))
	out, code := run(t, "replay", "--store", store)
	if code != 2 || !strings.Contains(out, "rooms_failed=1") {
		t.Fatalf("replay of a damaged room: exit %d, want 2 and rooms_failed=1\n%s", code, out)
	}
	for _, k := range []string{"resolutions", "resolution_p50_us", "resolution_p99_us"} {
		if v := field(t, out, k); v != 0 {
			t.Errorf("%s=%d after the only room failed, want 0\n%s", k, v, out)
		}
	}
}

// TestCLIWarnsDamagedCheckpoint: a store whose index.ckpt is damaged opens by a
// scan, and the warning names the damage and what the index was rebuilt from,
// without saying both that the index files were not used and that they were.
func TestCLIWarnsDamagedCheckpoint(t *testing.T) {
	st := filepath.Join(t.TempDir(), "store")
	mustRun(t, "import", "--store", st, room("room001"))
	flipMiddleByte(t, filepath.Join(st, "index.ckpt"))
	out, code := run(t, "rooms", "--store", st)
	if code != 0 || !strings.Contains(out, "warning: "+st+": damaged index files (") ||
		!strings.Contains(out, "; index rebuilt from scan") || strings.Contains(out, "not used") {
		t.Fatalf("rooms with a damaged index.ckpt: exit %d, want 0 and the damage warning\n%s", code, out)
	}
}

// flipMiddleByte inverts the byte in the middle of the file at path.
func flipMiddleByte(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
