package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/repackplan"
	"github.com/mtxdb/mtxdb/roomstate"
)

// selfPrevLines returns room003 (a v1 room) with one more message that names
// itself in prev_events and a child of it: events no topological order holds.
func selfPrevLines(t *testing.T) (lines []string, roomID string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(room("room003"), "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSpace(string(b)), "\n")
	msg := lines[8] // a message of the room's creator
	id := regexp.MustCompile(`"event_id":"([^"]+)"`).FindStringSubmatch(msg)[1]
	prev := regexp.MustCompile(`"prev_events":\[.*?\]\]`)
	loop := strings.Replace(prev.ReplaceAllLiteralString(msg, `"prev_events":[["$loop:server1.test",{"sha256":"AAAA"}]]`), id, "$loop:server1.test", 1)
	child := strings.Replace(prev.ReplaceAllLiteralString(msg, `"prev_events":[["$loop:server1.test",{"sha256":"AAAA"}]]`), id, "$loopchild:server1.test", 1)
	roomID = regexp.MustCompile(`"room_id":"([^"]+)"`).FindStringSubmatch(msg)[1]
	return append(lines, loop, child), roomID
}

// TestReplayRoomsIsolatesBadRooms: in one store, a room whose PDU record is
// damaged is skipped with its problem, a room with a prev_events cycle is replayed
// without the cycle's events (a problem naming them), and a sound room is replayed;
// planning skips the room replay skipped and plans the other two.
func TestReplayRoomsIsolatesBadRooms(t *testing.T) {
	eng := packstore.NewMemStorage()
	st := roomstate.New(eng)
	cyc, cycID := selfPrevLines(t)
	for name, in := range map[string]string{"cycle": strings.Join(cyc, "\n")} {
		if _, err := st.Import(strings.NewReader(in), name, roomstate.ImportOptions{AnyOrder: true}); err != nil {
			t.Fatal(err)
		}
	}
	var damagedID string
	for _, name := range []string{"room002", "room004_union"} {
		res, err := importFile(st, filepath.Join(room(name), "events.jsonl"), roomstate.ImportOptions{}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if name == "room002" {
			damagedID = res.Rooms[0]
		}
	}
	damaged, err := st.Room(damagedID)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := damaged.EventIDs()
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.PutMany(roomstate.CollectionID(damagedID), []packstore.Record{{ID: roomstate.EventRecordID(ids[3]), Data: []byte("garbage")}}); err != nil {
		t.Fatal(err)
	}
	rooms, err := st.Rooms()
	if err != nil {
		t.Fatal(err)
	}
	if len(rooms) != 3 {
		t.Fatalf("%d rooms, want 3", len(rooms))
	}
	tot, problems, err := replayRooms(rooms, false, io.Discard, nil)
	if err != nil {
		t.Fatalf("replayRooms: %v", err)
	}
	if tot.Cyclic != 2 {
		t.Errorf("cyclic = %d, want 2", tot.Cyclic)
	}
	byRoom := map[string]roomProblem{}
	for _, p := range problems {
		byRoom[p.room] = p
	}
	if p, ok := byRoom[damagedID]; !ok || !p.skipped || !strings.Contains(p.what, "corrupt") {
		t.Errorf("damaged room: problem %+v (want skipped, naming the corruption)", p)
	}
	if p, ok := byRoom[cycID]; !ok || p.skipped || !strings.Contains(p.what, "$loop:server1.test") {
		t.Errorf("cycle room: problem %+v (want the cycle's events named, not skipped)", p)
	}
	if len(problems) != 2 {
		t.Errorf("problems %+v, want 2", problems)
	}
	for _, r := range rooms {
		if r.ID() == damagedID {
			continue
		}
		if h := r.Head(); h.CurrentState == (hamtstore.NodeID{}) {
			t.Errorf("room %s not replayed", r.ID())
		}
	}
	plan, _, pp, err := planRooms(rooms, repackplan.Options{}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Collections) != 2 || len(pp) != 1 || pp[0].room != damagedID || !pp[0].skipped {
		t.Errorf("plan: %d collections, problems %+v (want 2, and the damaged room skipped)", len(plan.Collections), pp)
	}
}

// TestCLIReplayGoesOnPastABadRoom: the CLI replays the other rooms of a store
// holding a room with a prev_events cycle, names it in a problem line, exits 2;
// verify finds the sound room as recorded, and repack repacks both.
func TestCLIReplayGoesOnPastABadRoom(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "s")
	cyc, cycID := selfPrevLines(t)
	in := filepath.Join(dir, "cycle.jsonl")
	if err := os.WriteFile(in, []byte(strings.Join(cyc, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := run(t, "import", "--any-order", "--store", store, in, room("room002")); code != 0 {
		t.Fatalf("import: exit %d\n%s", code, out)
	}
	out, code := run(t, "replay", "--store", store)
	if code != 2 || !strings.Contains(out, "problem room="+cycID) || !strings.Contains(out, "cycle") || !strings.Contains(out, "cyclic=2") {
		t.Fatalf("replay: exit %d (want 2, a problem line naming %s and its cycle)\n%s", code, cycID, out)
	}
	if out, code := run(t, "verify", "--store", store, "--expected", room("room002")); code != 0 || !strings.Contains(out, "mismatches=0") {
		t.Errorf("verify of the sound room: exit %d\n%s", code, out)
	}
	if out, code := run(t, "repack", "--store", store); code != 0 || !strings.Contains(out, "rooms=2") {
		t.Errorf("repack: exit %d (want 0, both rooms)\n%s", code, out)
	}
}

// TestCLIImportRefusalsDominate: when more PDUs are refused than stored, import
// exits 2 and its hint names the CLI flag that would have placed them, or says
// that the refusals follow from an earlier one; a few refusals keep exit 0.
func TestCLIImportRefusalsDominate(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join(room("room002"), "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	write := func(name string, ls []string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(strings.Join(ls, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	reversed := append([]string(nil), lines...)
	slices.Reverse(reversed)
	rev := write("reversed.jsonl", reversed)
	// The power levels event made malformed: the events that name it are refused
	// because it was.
	broken := append([]string(nil), lines...)
	broken[2] = strings.Replace(broken[2], `"type":"m.room.power_levels"`, `"type":1`, 1)
	tampered := write("tampered.jsonl", broken)
	few := write("few.jsonl", append(append([]string(nil), lines...), "{not json"))

	for _, c := range []struct {
		name     string
		args     []string
		code     int
		want     []string
		wantNone []string
	}{
		{"reversed", []string{rev}, 2, []string{"more than the 1 stored or already in the store", "--any-order"}, nil},
		{"any order, no room version", []string{"--any-order", rev}, 2, []string{"--room-version V"}, []string{"AnyOrder"}},
		{"cascade", []string{tampered}, 2, []string{"refused only because an event they name was refused before them"}, nil},
		{"a few refused", []string{few}, 0, []string{"refused=1"}, []string{"exit status 2"}},
	} {
		out, code := run(t, append([]string{"import", "--store", filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))}, c.args...)...)
		if code != c.code {
			t.Errorf("%s: exit %d, want %d\n%s", c.name, code, c.code, out)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q\n%s", c.name, w, out)
			}
		}
		for _, w := range c.wantNone {
			if strings.Contains(out, w) {
				t.Errorf("%s: output holds %q\n%s", c.name, w, out)
			}
		}
	}
}

// TestCLIImportGarbageSummarised: random lines print the first 100 refusals and one
// line counting the rest; with --json every refusal is an object.
func TestCLIImportGarbageSummarised(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "garbage.txt")
	if err := os.WriteFile(in, []byte(strings.Repeat("\x01\x02 not json\n", 1000)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code := run(t, "import", "--store", filepath.Join(dir, "s"), in)
	shown := 0
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "refused import ") {
			shown++
		}
	}
	if code != 2 || shown != 100 ||
		!strings.Contains(out, "refused: 900 more in "+in+" not shown") {
		t.Fatalf("garbage: exit %d\n%.2000s", code, out)
	}
	cmd := exec.Command(bin, "import", "--json", "--store", filepath.Join(dir, "j"), in)
	jout, _ := cmd.Output()
	if n := strings.Count(string(jout), `{"kind":"refused"`); n != 1000 {
		t.Errorf("--json: %d refusal objects, want 1000", n)
	}
}
