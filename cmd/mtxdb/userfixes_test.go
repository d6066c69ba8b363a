package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomrecord"
)

// TestCLIImportRefusalSpeaksFlags: an --any-order import of PDUs whose room's
// m.room.create never comes names the flag that gives the room version,
// --room-version, in its refusal lines (text and JSON), not the library's
// ImportOptions.RoomVersion.
func TestCLIImportRefusalSpeaksFlags(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join(room("room050"), "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	in := filepath.Join(dir, "nocreate.jsonl")
	if err := os.WriteFile(in, []byte(strings.Join(lines[1:3], "")), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, json := range []bool{false, true} {
		args := []string{"import", "--store", filepath.Join(dir, "s"), "--any-order", in}
		if json {
			args = append(args, "--json")
		}
		out, code := run(t, args...)
		if code != 2 || strings.Count(out, "(--room-version gives it)") != 2 || strings.Contains(out, "ImportOptions") {
			t.Errorf("%v: exit %d, want 2 and two refusals naming --room-version, none ImportOptions\n%s", args, code, out)
		}
	}
}

// TestCLICorruptMetaReported: with one event's metadata record damaged (it does
// not decode), verify exits 2 with a problem line naming the event, not its
// record hash, before and after a replay --force (which reads no metadata
// record and exits 0); audit, which reaches the record through a snapshot entry
// (a record ID), names the event too.
func TestCLICorruptMetaReported(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	mustRun(t, "import", "--store", store, room("room003"))
	const roomID, eventID = "!FymyxFJPGCZLfPcMwA:server1.test", "$154714264912SGfjg:server1.test"
	truncateRecord(t, store, roomID, roomrecord.MetaRecordID(roomrecord.EventRecordID(eventID)))
	for _, args := range [][]string{{"replay", "--store", store}, {"replay", "--store", store, "--force"}} {
		out, code := run(t, args...)
		if code != 0 {
			t.Errorf("%v: exit %d, want 0\n%s", args, code, out)
		}
		out, code = run(t, "verify", "--store", store)
		if code != 2 || !strings.Contains(out, "metadata of event "+eventID+": ") {
			t.Errorf("verify after %v: exit %d, want 2 and a problem naming %s\n%s", args, code, eventID, out)
		}
	}
	out, code := run(t, "audit", "--store", store, "--expected", room("room003"))
	if code != 2 || !strings.Contains(out, "metadata of event "+eventID+": ") {
		t.Errorf("audit: exit %d, want 2 and a problem naming %s\n%s", code, eventID, out)
	}
}

// TestCLIStoreSchemeTypo: a --store value that begins with a PostgreSQL scheme but
// is not a postgres:// or postgresql:// URL (a typo) is refused, naming the URL
// form, by import (which would otherwise create a directory named after it) and
// by a command that opens an existing store; no directory is created.
func TestCLIStoreSchemeTypo(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ store, want string }{
		{"postgres:/x", `--store begins "postgres:/": not a PostgreSQL URL, which begins postgres:// in lower case`},
		{"postgresql:x", `--store begins "postgresql:": not a PostgreSQL URL, which begins postgresql:// in lower case`},
		{"POSTGRES://h/db", `--store begins "POSTGRES://": not a PostgreSQL URL`},
	} {
		for _, args := range [][]string{{"import", "--store", c.store, room("room003")}, {"replay", "--store", c.store}} {
			cmd := exec.Command(bin, args...)
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			if err == nil || cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), c.want) {
				t.Errorf("%v: %v, want exit 1 and %q\n%s", args, err, c.want, out)
			}
		}
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) > 0 {
		t.Errorf("the refused --store values left %v in the working directory (%v)", ents, err)
	}
}

// TestCLIReplayDamagedStateHint: a plain replay that fails a room on an earlier
// event's damaged state record (read to continue from it after more events were
// imported) says on the problem line that replay --force writes every state
// record again; that replay then succeeds.
func TestCLIReplayDamagedStateHint(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "s")
	b, err := os.ReadFile(filepath.Join(room("room003"), "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	half := filepath.Join(dir, "half.jsonl")
	if err := os.WriteFile(half, []byte(strings.Join(lines[:150], "")), 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "import", "--store", store, half)
	mustRun(t, "replay", "--store", store)
	const roomID = "!FymyxFJPGCZLfPcMwA:server1.test"
	var last struct {
		EventID string `json:"event_id"`
	}
	if err := json.Unmarshal([]byte(lines[149]), &last); err != nil || last.EventID == "" {
		t.Fatalf("event 150 of room003: %v (%q)", err, last.EventID)
	}
	truncateRecord(t, store, roomID, roomrecord.StateRecordID(roomrecord.EventRecordID(last.EventID)))
	mustRun(t, "import", "--store", store, room("room003"))
	out, code := run(t, "replay", "--store", store)
	want := "state of event " + last.EventID + ": "
	hint := "; mtxdb replay --force --room '" + roomID + "' (with this --store) writes every state record of the room again"
	if code != 2 || !strings.Contains(out, want) || !strings.Contains(out, hint) {
		t.Errorf("replay: exit %d, want 2, %q and %q\n%s", code, want, hint, out)
	}
	if out, code := run(t, "replay", "--store", store, "--force"); code != 0 || !strings.Contains(out, " computed=212 ") {
		t.Errorf("replay --force: exit %d, want 0 and computed=212\n%s", code, out)
	}
}

// truncateRecord writes record rid of the room's collection again with the
// first half of its data, a record that exists but does not decode.
func truncateRecord(t *testing.T, store, roomID string, rid packstore.ID) {
	t.Helper()
	eng, err := packstore.Open(packstore.DefaultOptions(store))
	if err != nil {
		t.Fatal(err)
	}
	coll := roomrecord.CollectionID(roomID)
	good, err := eng.Get(coll, rid)
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.PutMany(coll, []packstore.Record{{ID: rid, Data: good[:len(good)/2]}}); err != nil {
		t.Fatal(err)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCLIReplayForceKilledEveryK: a replay --force SIGKILLed part way on a room
// after an every-k repack leaves the room not replayed: verify counts the events
// still without a state record as unreplayed (not as state_not_kept) and a plain
// replay computes them, after which the room verifies against its recording with
// no state left unkept.
func TestCLIReplayForceKilledEveryK(t *testing.T) {
	roomDir := genRoom(t, 2500)
	store := filepath.Join(t.TempDir(), "s")
	mustRun(t, "import", "--store", store, roomDir)
	mustRun(t, "replay", "--store", store)
	mustRun(t, "repack", "--store", store, "--liveness", "every-k")
	if out := mustRun(t, "verify", "--store", store); field(t, out, "state_not_kept") == 0 {
		t.Fatalf("the every-k repack dropped no state record:\n%s", out)
	}
	cmd := exec.Command(bin, "replay", "--store", store, "--force")
	cmd.Env = append(os.Environ(), "MTXDB_TEST_STALL=replay-1000")
	pr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(pr)
	stalled := false
	for !stalled && sc.Scan() {
		stalled = strings.Contains(sc.Text(), "test stall at replay-1000")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // killed
	if !stalled {
		t.Fatal("replay --force ended before its 1001st event")
	}
	out, code := run(t, "verify", "--store", store)
	if code != 0 || field(t, out, "state_not_kept") != 0 || field(t, out, "unreplayed") == 0 {
		t.Errorf("verify after a killed replay --force: exit %d, want 0, state_not_kept=0 and unreplayed>0\n%s", code, out)
	}
	out = mustRun(t, "replay", "--store", store)
	if field(t, out, "computed") == 0 || field(t, out, "state_not_kept") != 0 {
		t.Errorf("replay after a killed replay --force computed nothing or left states unkept:\n%s", out)
	}
	out = mustRun(t, "verify", "--store", store, "--expected", roomDir)
	if field(t, out, "state_not_kept") != 0 || field(t, out, "unreplayed") != 0 || field(t, out, "compared_events") == 0 {
		t.Errorf("verify --expected after the plain replay:\n%s", out)
	}
}
