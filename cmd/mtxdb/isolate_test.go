package main

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/repackplan"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/testrooms"
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
	ctx := t.Context()
	eng := packstore.NewMemStorage()
	st := roomstate.New(eng)
	cyc, cycID := selfPrevLines(t)
	for name, in := range map[string]string{"cycle": strings.Join(cyc, "\n")} {
		if _, err := st.Import(ctx, strings.NewReader(in), name, roomstate.ImportOptions{AnyOrder: true}); err != nil {
			t.Fatal(err)
		}
	}
	var damagedID string
	for _, name := range []string{"room002", "room004_union"} {
		res, err := importFile(ctx, st, filepath.Join(room(name), "events.jsonl"), roomstate.ImportOptions{}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if name == "room002" {
			damagedID = res.Rooms[0]
		}
	}
	damaged, err := st.Room(ctx, damagedID)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := damaged.EventIDs()
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.PutMany(roomrecord.CollectionID(damagedID), []packstore.Record{{ID: roomrecord.EventRecordID(ids[3]), Data: []byte("garbage")}}); err != nil {
		t.Fatal(err)
	}
	rooms, err := st.Rooms(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rooms) != 3 {
		t.Fatalf("%d rooms, want 3", len(rooms))
	}
	tot, problems, err := replayRooms(ctx, rooms, false, io.Discard, nil)
	if err != nil {
		t.Fatalf("replayRooms: %v", err)
	}
	if len(tot.Cyclic) != 2 {
		t.Errorf("cyclic = %d, want 2", len(tot.Cyclic))
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
	plan, _, pp, err := planRooms(t.Context(), rooms, repackplan.Options{}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Collections) != 2 || len(pp) != 1 || pp[0].room != damagedID || !pp[0].skipped {
		t.Errorf("plan: %d collections, problems %+v (want 2, and the damaged room skipped)", len(plan.Collections), pp)
	}
}

// hostileRooms returns one room of each shape of prev/auth graph that replay
// cannot order, in room versions 1 and 2 (where event IDs are the sender's
// choice; from version 3 an event ID is the hash of the event, so it cannot
// name itself or a descendant): an event naming itself in prev_events, one
// naming itself in auth_events, two naming each other in prev_events, and a
// state event whose auth event descends from it, each with a child. Each room
// is a create event, the creator's join, power levels and a message before the
// hostile events; content hashes are computed, so nothing is redacted. It
// returns their PDU lines and, by room ID, the number of events replay must
// leave out as outliers.
func hostileRooms(t *testing.T) ([]string, map[string]int) {
	t.Helper()
	const user = "@user1:server1.test"
	var lines []string
	cyclic := map[string]int{}
	for _, v := range []string{"1", "2"} {
		for _, shape := range []string{"selfprev", "selfauth", "mutualprev", "authdesc"} {
			roomID := "!" + shape + "-v" + v + ":server1.test"
			id := func(name string) string { return "$" + name + "-" + shape + "-v" + v + ":server1.test" }
			refs := func(ids ...string) []any {
				out := []any{}
				for _, i := range ids {
					out = append(out, []any{i, map[string]any{"sha256": "AAAA"}})
				}
				return out
			}
			depth := 0
			add := func(name, typ string, stateKey *string, content map[string]any, prev, auth []string) {
				depth++
				e := map[string]any{"event_id": id(name), "room_id": roomID, "sender": user, "origin": "server1.test",
					"origin_server_ts": 1547144283000 + depth, "depth": depth, "type": typ, "content": content,
					"prev_events": refs(prev...), "auth_events": refs(auth...)}
				if stateKey != nil {
					e["state_key"] = *stateKey
				}
				lines = append(lines, hashedPDU(t, e))
			}
			empty, member := "", user
			base := []string{id("create"), id("join"), id("power")}
			add("create", "m.room.create", &empty, map[string]any{"creator": user, "room_version": v}, nil, nil)
			add("join", "m.room.member", &member, map[string]any{"membership": "join"}, base[:1], base[:1])
			add("power", "m.room.power_levels", &empty, map[string]any{"users": map[string]any{user: 100}}, base[1:2], base[:2])
			add("tip", "m.room.message", nil, map[string]any{"body": "before"}, base[2:], base)
			msg := map[string]any{"body": "hostile"}
			topic := map[string]any{"topic": "loop"}
			switch shape {
			case "selfprev":
				add("self", "m.room.message", nil, msg, []string{id("self")}, base)
				add("child", "m.room.message", nil, msg, []string{id("self")}, base)
				cyclic[roomID] = 2
			case "selfauth":
				add("self", "m.room.topic", &empty, topic, []string{id("tip")}, append(slices.Clone(base), id("self")))
				add("child", "m.room.message", nil, msg, []string{id("self")}, base)
				cyclic[roomID] = 2
			case "mutualprev":
				add("a", "m.room.message", nil, msg, []string{id("b")}, base)
				add("b", "m.room.message", nil, msg, []string{id("a")}, base)
				add("child", "m.room.message", nil, msg, []string{id("b")}, base)
				cyclic[roomID] = 3
			case "authdesc":
				add("topic", "m.room.topic", &empty, topic, []string{id("tip")}, append(slices.Clone(base), id("msg")))
				add("msg", "m.room.message", nil, msg, []string{id("topic")}, base)
				add("child", "m.room.message", nil, msg, []string{id("msg")}, base)
				cyclic[roomID] = 3
			}
		}
	}
	return lines, cyclic
}

// TestCLIReplayGoesOnPastABadRoom: a store holding the 190 real rooms and one
// room of each hostile shape in room versions 1 and 2 (hostileRooms), imported
// with --any-order (the backfill path, where such events arrive): replay
// replays every room, names each hostile room and its left-out events on a
// problem line and no other room, and exits 2; verify --expected
// testrooms/real finds the 190 as recorded; repack repacks every room, and
// verify after it finds them as recorded again.
func TestCLIReplayGoesOnPastABadRoom(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "s")
	hostile, cyclic := hostileRooms(t)
	in := filepath.Join(dir, "hostile.jsonl")
	if err := os.WriteFile(in, []byte(strings.Join(hostile, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(testrooms.Dir(), "real")
	rooms := 189 + len(cyclic) // room004 and room004_union are one room
	out, code := run(t, "import", "--any-order", "--store", store, in, real)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("rooms=%d ", rooms)) || !strings.Contains(out, "refused=0 ") {
		t.Fatalf("import: exit %d (want 0, %d rooms, nothing refused)\n%s", code, rooms, lastLines(out, 5))
	}
	out, code = run(t, "replay", "--store", store)
	total := 0
	for _, n := range cyclic {
		total += n
	}
	if code != 2 || !strings.Contains(out, fmt.Sprintf("replay: rooms=%d rooms_failed=0 ", rooms)) || !strings.Contains(out, fmt.Sprintf(" cyclic=%d ", total)) {
		t.Fatalf("replay: exit %d (want 2, rooms=%d rooms_failed=0 cyclic=%d)\n%s", code, rooms, total, lastLines(out, 20))
	}
	t.Logf("replay: exit %d\n%s", code, lastLines(out, 9))
	problems := 0
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "problem room=") {
			continue
		}
		problems++
		roomID, _, _ := strings.Cut(strings.TrimPrefix(l, "problem room="), ": ")
		n, ok := cyclic[roomID]
		if !ok {
			t.Errorf("replay: a problem in a room that is not hostile: %s", l)
		} else if !strings.Contains(l, fmt.Sprintf("%d events left out as outliers", n)) || !strings.Contains(l, "-"+strings.TrimPrefix(strings.Split(roomID, ":")[0], "!")+":server1.test") {
			t.Errorf("replay: problem line for %s does not name its %d events: %s", roomID, n, l)
		}
	}
	if problems != len(cyclic) {
		t.Errorf("replay: %d problem lines, want one per hostile room (%d)\n%s", problems, len(cyclic), lastLines(out, 20))
	}
	verify := func(when string) {
		t.Helper()
		out, code := run(t, "verify", "--store", store, "--expected", real)
		t.Logf("verify %s: exit %d\n%s", when, code, lastLines(out, 1))
		if code != 0 || !strings.Contains(out, "compared_room_dirs=190 ") || !strings.Contains(out, " mismatches=0 problems=0 ") || !strings.Contains(out, "unreplayed=0 ") {
			t.Errorf("verify --expected testrooms/real %s: exit %d (want 0, 190 rooms compared, 0 mismatches)\n%s", when, code, lastLines(out, 10))
		}
	}
	verify("after replay")
	out, code = run(t, "repack", "--store", store)
	t.Logf("repack: exit %d\n%s", code, lastLines(out, 2))
	if code != 0 || !strings.Contains(out, fmt.Sprintf("rooms=%d ", rooms)) {
		t.Errorf("repack: exit %d (want 0, %d rooms)\n%s", code, rooms, lastLines(out, 10))
	}
	verify("after repack")
}

// lastLines returns the last n lines of out.
func lastLines(out string, n int) string {
	ls := strings.Split(strings.TrimRight(out, "\n"), "\n")
	return strings.Join(ls[max(0, len(ls)-n):], "\n")
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

// hashedPDU is the PDU line of e (no hashes, signatures or unsigned) with its
// content hash computed and empty signatures, so that import does not redact it.
func hashedPDU(t *testing.T, e map[string]any) string {
	t.Helper()
	b, err := json.Marshal(e) // the content hash covers all but hashes, signatures, unsigned
	if err != nil {
		t.Fatal(err)
	}
	canon, err := gomatrixserverlib.CanonicalJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(canon)
	e["hashes"] = map[string]any{"sha256": base64.RawStdEncoding.EncodeToString(sum[:])}
	e["signatures"] = map[string]any{}
	if b, err = json.Marshal(e); err != nil {
		t.Fatal(err)
	}
	return string(b)
}
