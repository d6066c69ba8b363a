package main

import (
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
	eng, err := packstore.Open(packstore.DefaultOptions(store))
	if err != nil {
		t.Fatal(err)
	}
	coll, rid := roomrecord.CollectionID(roomID), roomrecord.MetaRecordID(roomrecord.EventRecordID(eventID))
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
