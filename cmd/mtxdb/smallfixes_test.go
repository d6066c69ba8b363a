package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomrecord"
	"github.com/mtxdb/mtxdb/testrooms"
)

// TestCLISayWhatThePathIs: import into a file or a dangling symbolic link names
// what the path is; a stray argument is named as one, a missing --expected
// directory under its flag; verify of a packstore that
// holds no mtxdb room says so instead of reporting nothing wrong.
func TestCLISayWhatThePathIs(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "afile")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "dangling")
	if err := os.Symlink(filepath.Join(dir, "nowhere"), link); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other")
	eng, err := packstore.Open(packstore.DefaultOptions(other))
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.PutMany(packstore.ID{1}, []packstore.Record{{ID: packstore.ID{2}, Data: []byte("not a room")}}); err != nil {
		t.Fatal(err)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"import", "--store", file, room("room002")}, "store " + file + " is a file, not a store directory"},
		{[]string{"import", "--store", link, room("room002")}, "is a symbolic link to " + filepath.Join(dir, "nowhere") + ", which does not exist"},
		{[]string{"replay", "--store", other, "extra"}, `replay takes no arguments, got "extra"`},
		{[]string{"verify", "--store", other, "--expected", filepath.Join(dir, "nowhere")}, "--expected: open " + filepath.Join(dir, "nowhere") + ": no such file"},
		{[]string{"audit", "--store", other, "--expected", filepath.Join(dir, "nowhere")}, "--expected: open " + filepath.Join(dir, "nowhere") + ": no such file"},
	} {
		out, code := run(t, c.args...)
		if code != 1 || !strings.Contains(out, c.want) {
			t.Errorf("%v: exit %d, want 1 and %q\n%s", c.args, code, c.want, out)
		}
	}
	if out, code := run(t, "verify", "--store", other); code != 2 || !strings.Contains(out, "problem store: 1 records but no mtxdb room") {
		t.Errorf("verify of a store without rooms: exit %d, want 2 and a problem line\n%s", code, out)
	}
}

// TestCLIImportStdinAndClosedPipe: "-" imports standard input; a closed standard
// output (| head -1) does not stop the import, whose exit status stays 0 and
// whose rooms are all stored.
func TestCLIImportStdinAndClosedPipe(t *testing.T) {
	dir := t.TempDir()
	in, err := os.Open(filepath.Join(room("room002"), "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	cmd := exec.Command(bin, "import", "--store", filepath.Join(dir, "s"), "-")
	cmd.Stdin = in
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "import -: read=226 imported=226") {
		t.Fatalf("import -: %v\n%s", err, out)
	}

	store := filepath.Join(dir, "piped")
	cmd = exec.Command(bin, "import", "--store", store, room("room002"), room("room003"), room("room004_union"))
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = w
	r.Close() // the reader is gone before the first line
	err = cmd.Run()
	w.Close()
	if err != nil {
		t.Fatalf("import into a closed pipe: %v", err)
	}
	out2, code := run(t, "rooms", "--store", store)
	if code != 0 || !strings.Contains(out2, "rooms=3") {
		t.Errorf("rooms after a piped import: exit %d\n%s", code, out2)
	}
}

// TestCLIPrevEventOfAnotherRoom: a PDU whose prev_event is an event of another
// stored room is refused naming that room, not as "not found".
func TestCLIPrevEventOfAnotherRoom(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "s")
	if out, code := run(t, "import", "--store", store, room("room002"), room("room003")); code != 0 {
		t.Fatalf("import: exit %d\n%s", code, out)
	}
	lines, _ := selfPrevLines(t) // room003's lines
	b, err := os.ReadFile(filepath.Join(room("room002"), "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	other := strings.SplitN(string(b), "\n", 2)[0] // room002's m.room.create
	otherID := other[strings.Index(other, `"event_id":"`)+len(`"event_id":"`):]
	otherID = otherID[:strings.Index(otherID, `"`)]
	msg := strings.Replace(lines[8], `"event_id":"`, `"event_id":"$x`, 1)
	i := strings.Index(msg, `"prev_events":[["`) + len(`"prev_events":[["`)
	j := i + strings.Index(msg[i:], `"`)
	msg = msg[:i] + otherID + msg[j:]
	in := filepath.Join(dir, "cross.jsonl")
	if err := os.WriteFile(in, []byte(msg+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ := run(t, "import", "--store", store, in)
	if !strings.Contains(out, otherID+" is an event of another room") {
		t.Errorf("a prev_event of another room:\n%s", out)
	}
}

// TestCLIFlagValues: a flag value the number parser refuses says what the flag
// wants, without Go's parser message; gen's --out as a dangling symbolic link is
// named as one.
func TestCLIFlagValues(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "dangling")
	if err := os.Symlink(filepath.Join(dir, "nowhere"), link); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"gen", "--out", out, "--seed", "-1"}, `invalid argument "-1" for "--seed" flag: want a whole number, 0 or more`},
		{[]string{"gen", "--out", out, "--events", "abc"}, `invalid argument "abc" for "--events" flag: want a whole number`},
		{[]string{"gen", "--out", out, "--events", "99999999999999999999"}, `for "--events" flag: out of range`},
		{[]string{"gen", "--out", out, "--loss", "x"}, `invalid argument "x" for "--loss" flag: want a number`},
		{[]string{"gen", "--out", link, "--events", "20"}, "--out " + link + " is a symbolic link to " + filepath.Join(dir, "nowhere") + ", which does not exist"},
	} {
		got, code := run(t, tc.args...)
		if code != 1 || !strings.Contains(got, tc.want) || strings.Contains(got, "strconv") {
			t.Errorf("%v: exit %d, want 1 and %q\n%s", tc.args, code, tc.want, got)
		}
	}
}

// TestCLIDemoDefaultRoomsRelative: demo run outside the repository root, with the
// default --rooms, says that --rooms is relative to the current directory.
func TestCLIDemoDefaultRoomsRelative(t *testing.T) {
	cmd := exec.Command(bin, "demo")
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 ||
		!strings.Contains(string(out), "the default --rooms testrooms/real is relative to the current directory: run mtxdb demo from the repository root, or pass --rooms DIR") {
		t.Errorf("demo outside the repository root: %v\n%s", err, out)
	}
}

// TestCLIProfileOpenedFirst: a --memprofile or --cpuprofile path that cannot be
// created fails, naming the flag, before the command imports anything; a good
// path gets its profile.
func TestCLIProfileOpenedFirst(t *testing.T) {
	dir := t.TempDir()
	for _, flag := range []string{"--memprofile", "--cpuprofile"} {
		store := filepath.Join(dir, "s"+flag)
		out, code := run(t, "import", "--store", store, room("room003"), flag, dir)
		if code != 1 || !strings.Contains(out, "mtxdb: "+flag+": open "+dir+": is a directory") || strings.Contains(out, "imported=") {
			t.Errorf("%s DIR: exit %d, want 1 naming the flag before any import\n%s", flag, code, out)
		}
		if _, err := os.Stat(store); !os.IsNotExist(err) {
			t.Errorf("%s DIR: the store was created (%v)", flag, err)
		}
		prof := filepath.Join(dir, flag[2:]+".pprof")
		if out, code := run(t, "import", "--store", store, room("room003"), flag, prof); code != 0 {
			t.Fatalf("%s FILE: exit %d\n%s", flag, code, out)
		}
		if fi, err := os.Stat(prof); err != nil || fi.Size() == 0 {
			t.Errorf("%s FILE: no profile written (%v)", flag, err)
		}
	}
}

// TestCLIProfileNotInStore: a profile path inside a store directory is refused
// before anything is written, and the store's shard is left as it was.
func TestCLIProfileNotInStore(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	if out, code := run(t, "import", "--store", store, room("room003")); code != 0 {
		t.Fatalf("import: exit %d\n%s", code, out)
	}
	shard := filepath.Join(store, "shard-00000.mtdb")
	before, err := os.Stat(shard)
	if err != nil {
		t.Fatal(err)
	}
	for _, flag := range []string{"--memprofile", "--cpuprofile"} {
		out, code := run(t, "rooms", "--store", store, flag, shard)
		if code != 1 || !strings.Contains(out, flag+" "+shard+": that directory holds an mtxdb store") {
			t.Errorf("%s into the store: exit %d\n%s", flag, code, out)
		}
		if after, err := os.Stat(shard); err != nil || after.Size() != before.Size() {
			t.Fatalf("%s: shard %d bytes, was %d (%v)", flag, after.Size(), before.Size(), err)
		}
	}
}

// TestCLIStoreHelp: every command's --store help is the shared one: a store
// directory or a postgres:// URL.
func TestCLIStoreHelp(t *testing.T) {
	for _, c := range rootCmd().Commands() {
		if f := c.Flags().Lookup("store"); f != nil && !strings.HasPrefix(f.Usage, storeHelp) {
			t.Errorf("%s --store: %q, want it to start with %q", c.Name(), f.Usage, storeHelp)
		}
	}
}

// TestCLIVerifyBadHead: one room's head record that does not decode does not
// stop verify, rooms, replay, repack or audit: the collection is a problem line
// (audit names the room by its recording), the other room is checked, listed,
// replayed, repacked or audited, exit 2. Repack leaves the damaged room's
// records as they are: with its head put back, the store verifies clean.
func TestCLIVerifyBadHead(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	real := filepath.Join(testrooms.Dir(), "real")
	if out, code := run(t, "import", "--store", store, filepath.Join(real, "room003"), filepath.Join(real, "room004")); code != 0 {
		t.Fatalf("import: exit %d\n%s", code, out)
	}
	badRoom := roomID(t, filepath.Join(real, "room003"))
	coll := roomrecord.CollectionID(badRoom)
	putHead := func(b []byte) (old []byte) {
		t.Helper()
		eng, err := packstore.Open(packstore.DefaultOptions(store))
		if err != nil {
			t.Fatal(err)
		}
		if old, err = eng.Get(coll, roomrecord.HeadRecordID); err != nil {
			t.Fatal(err)
		}
		if err := eng.PutMany(coll, []packstore.Record{{ID: roomrecord.HeadRecordID, Data: b}}); err != nil {
			t.Fatal(err)
		}
		if err := eng.Close(); err != nil {
			t.Fatal(err)
		}
		return old
	}
	good := putHead([]byte("not a head"))
	headLine := "problem roomstate: head of room collection " + coll.String()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"verify", "--store", store}, []string{headLine, "the room is not checked", "verify: rooms=1 ", " problems=1 "}},
		{[]string{"rooms", "--store", store}, []string{headLine, "rooms: rooms=1 unreadable=1"}},
		{[]string{"stats", "--store", store}, []string{" rooms=1 unreadable=1", headLine, ": the room is not counted"}},
		{[]string{"replay", "--store", store}, []string{headLine, ": the room is not replayed", "replay: rooms=2 rooms_failed=1 events=101 computed=101 "}},
		{[]string{"audit", "--store", store, "--expected", filepath.Join(real, "room003"), "--expected", filepath.Join(real, "room004")},
			[]string{"problem room=" + badRoom + ": its head record (room collection " + coll.String() + ") cannot be read", "audit: rooms=1 events=101 findings=0 problems=1"}},
		{[]string{"repack", "--store", store}, []string{headLine, "the room is not repacked", "repack: plan=reverse-topological rooms=1 "}},
		{[]string{"stats", "--store", store, "--reads", "--walks", "current-state"}, []string{headLine, ": the room is not walked", "reads: rooms=1 unreadable=1 walks=1 "}},
	} {
		out, code := run(t, c.args...)
		for _, w := range c.want {
			if code != 2 || !strings.Contains(out, w) {
				t.Errorf("%s: exit %d, want 2 and %q\n%s", c.args[0], code, w, out)
				break
			}
		}
	}
	putHead(good)
	if out, code := run(t, "verify", "--store", store); code != 0 || !strings.Contains(out, "verify: rooms=2 events=313 ") || !strings.Contains(out, "unreplayed=212 ") {
		t.Errorf("verify with the head put back: exit %d\n%s", code, out)
	}
}
