package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/internal/dirsum"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/testrooms"
)

var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mtxdb-cli-")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "mtxdb")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		panic(string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// run runs the CLI and returns its combined output and exit status.
func run(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

func room(name string) string { return filepath.Join(testrooms.Dir(), "real", name) }

// TestCLIMainJob runs import, replay, verify, repack, verify, stats on one real room
// and checks the exit statuses the help texts promise.
func TestCLIMainJob(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	if out, code := run(t, "replay", "--store", store); code != 1 || !strings.Contains(out, "does not exist") {
		t.Fatalf("replay on a missing store: %d %s", code, out)
	}
	if _, err := os.Stat(store); err == nil {
		t.Fatal("replay created the missing store")
	}
	mainJob(t, store)
	// An --expected directory with no rooms in it is a usage error, not a pass.
	if out, code := run(t, "verify", "--store", store, "--expected", t.TempDir()); code != 1 || !strings.Contains(out, "holds no recorded room") {
		t.Errorf("verify against an empty directory: exit %d\n%s", code, out)
	}
	// A recorded room the store lacks is a problem, not a silent pass.
	out, code := run(t, "verify", "--store", store, "--expected", room("room001"))
	if code != 2 || !strings.Contains(out, "not in the store") {
		t.Errorf("verify against a room not in the store: exit %d\n%s", code, out)
	}
}

// mainJob runs import, replay, verify, repack, verify, stats and state on room003
// in store (a directory or a postgres:// URL), then a replay that must find
// nothing to do.
func mainJob(t *testing.T, store string) {
	t.Helper()
	for _, step := range [][]string{
		{"import", "--store", store, room("room003")},
		{"replay", "--store", store},
		{"verify", "--store", store, "--expected", room("room003")},
		{"repack", "--store", store},
		{"verify", "--store", store, "--expected", room("room003")},
		{"stats", "--store", store},
	} {
		if out, code := run(t, step...); code != 0 {
			t.Fatalf("%v: exit %d\n%s", step[0], code, out)
		}
	}
	out, code := run(t, "state", "--store", store, "--room", "!FymyxFJPGCZLfPcMwA:server1.test")
	if code != 0 || !strings.Contains(out, "m.room.create\t\t$15471426487fdcng:server1.test\n") {
		t.Errorf("state: exit %d\n%s", code, out)
	}
	out, _ = run(t, "replay", "--store", store)
	if !strings.Contains(out, "computed=0") {
		t.Errorf("second replay recomputed: %s", out)
	}
}

// TestCLIImportRepack: import --repack replays and repacks the imported room, which
// then verifies against its recorded state.
func TestCLIImportRepack(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	out, code := run(t, "import", "--store", store, "--repack", "--plan", "auth-chain", room("room004_union"))
	if code != 0 || !strings.Contains(out, "repack: plan=auth-chain rooms=1") {
		t.Fatalf("import --repack: exit %d\n%s", code, out)
	}
	if out, code := run(t, "verify", "--store", store, "--expected", room("room004_union")); code != 0 {
		t.Fatalf("verify after import --repack: exit %d\n%s", code, out)
	}
}

// TestCLIEveryK: import --repack --liveness every-k drops state records and says so;
// verify passes counting them, state on a dropped event names the error, replay
// computes nothing, a K that is not a multiple is refused, and replay --force brings
// every state back.
func TestCLIEveryK(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	dir := room("room004_union")
	out, code := run(t, "import", "--store", store, "--repack", "--liveness", "every-k", "--every", "4", dir)
	if code != 0 || !strings.Contains(out, "liveness=every-4") || strings.Contains(out, "state_records_dropped=0 ") {
		t.Fatalf("import --repack every-k: exit %d\n%s", code, out)
	}
	for _, w := range []string{"disk_bytes_before=", "disk_bytes_after=", "garbage_records_dropped="} {
		if !strings.Contains(out, w) {
			t.Fatalf("no %q in the repack summary:\n%s", w, out)
		}
	}
	out, code = run(t, "verify", "--store", store, "--expected", dir)
	if code != 0 || strings.Contains(out, "state_not_kept=0 ") {
		t.Fatalf("verify after every-k: exit %d\n%s", code, out)
	}
	// Events with no state_key at an arrival index not a multiple of 4: the first
	// that is neither rejected nor an extremity answers "state not kept".
	b, err := os.ReadFile(filepath.Join(dir, "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	notKept := false
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var ev struct {
			EventID  string  `json:"event_id"`
			StateKey *string `json:"state_key"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.StateKey != nil || i%4 == 0 || i > 100 {
			continue
		}
		out, code = run(t, "state", "--store", store, "--room", "!SHGkOlMZXwZKuTnDrv:server1.test", "--event", ev.EventID)
		if code == 1 && strings.Contains(out, "state not kept") {
			notKept = true
			break
		}
	}
	if !notKept {
		t.Fatal("no event answered state not kept")
	}
	if out, code := run(t, "replay", "--store", store); code != 0 || !strings.Contains(out, "computed=0") || strings.Contains(out, "state_not_kept=0 ") {
		t.Fatalf("replay after every-k: exit %d\n%s", code, out)
	}
	if out, code := run(t, "repack", "--store", store, "--liveness", "every-k", "--every", "6"); code != 1 || !strings.Contains(out, "does not follow every 4") {
		t.Fatalf("every 6 after every 4: exit %d\n%s", code, out)
	}
	if out, code := run(t, "repack", "--store", store, "--liveness", "some"); code != 1 || !strings.Contains(out, "--liveness must be") {
		t.Fatalf("bad --liveness: exit %d\n%s", code, out)
	}
	if out, code := run(t, "replay", "--store", store, "--force"); code != 0 {
		t.Fatalf("replay --force: exit %d\n%s", code, out)
	}
	if out, code := run(t, "verify", "--store", store, "--expected", dir); code != 0 || !strings.Contains(out, "state_not_kept=0 ") {
		t.Fatalf("verify after replay --force: exit %d\n%s", code, out)
	}
}

// TestCLIImportErrors: a bad line is refused with file and line, the import goes on
// with the lines after it (exit 0; 2 with --strict, which still imports the rest).
func TestCLIImportErrors(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join(room("room002"), "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	bad := filepath.Join(dir, "bad.jsonl")
	content := strings.Join(lines[:3], "\n") + "\n{not json\n" + strings.Join(lines[3:6], "\n") + "\n"
	if err := os.WriteFile(bad, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(dir, "s")
	strictStore := filepath.Join(dir, "strict")
	out, code := run(t, "import", "--store", strictStore, "--strict", bad)
	if code != 2 || !strings.Contains(out, "refused import "+bad+" line 4") || !strings.Contains(out, "malformed PDU") || !strings.Contains(out, " refused=1 ") {
		t.Fatalf("--strict: exit %d\n%s", code, out)
	}
	// --json --strict: every line of standard output is a JSON object, the
	// strict verdict included.
	jsonStore := filepath.Join(dir, "json")
	cmdJSON := exec.Command(bin, "import", "--store", jsonStore, "--strict", "--json", bad)
	jsonOut, _ := cmdJSON.Output()
	if cmdJSON.ProcessState.ExitCode() != 2 || !strings.Contains(string(jsonOut), `{"kind":"strict","refused":1,"exit":2}`) {
		t.Fatalf("--strict --json: exit %d\n%s", cmdJSON.ProcessState.ExitCode(), jsonOut)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(jsonOut)), "\n") {
		if !json.Valid([]byte(line)) {
			t.Fatalf("--strict --json printed a line that is not JSON: %q", line)
		}
	}
	out, code = run(t, "import", "--store", store, bad)
	if code != 0 || !strings.Contains(out, "bad.jsonl line 4") || !strings.Contains(out, "imported=6 ") {
		t.Fatalf("exit %d\n%s", code, out)
	}
	// Nothing but refused lines: not a room export; exit 2 without --strict,
	// and the store directory the import created is removed.
	garbage := filepath.Join(dir, "garbage.jsonl")
	if err := os.WriteFile(garbage, []byte("hello\n{not json\n{\"a\":1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := run(t, "import", "--store", filepath.Join(dir, "g"), garbage); code != 2 || !strings.Contains(out, "all 3 PDUs read were refused") {
		t.Fatalf("an input of garbage: exit %d\n%s", code, out)
	} else if _, err := os.Stat(filepath.Join(dir, "g")); err == nil || !strings.Contains(out, "the store directory this import created is removed") {
		t.Fatalf("an input of garbage left the empty store it created (%v)\n%s", err, out)
	}
	// Into an empty directory that was there: the directory stays, empty.
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, code := run(t, "import", "--store", empty, garbage); code != 2 || !strings.Contains(out, "created in the empty directory are removed") {
		t.Fatalf("garbage into an empty directory: exit %d\n%s", code, out)
	} else if ents, err := os.ReadDir(empty); err != nil || len(ents) != 0 {
		t.Fatalf("garbage into an empty directory left %v (%v)", ents, err)
	}
	// A directory of other files is not made a store (import --store DIR DIR
	// would mix the store's files with the room's).
	self := filepath.Join(dir, "self")
	if err := os.Mkdir(self, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(self, "events.jsonl"), []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := run(t, "import", "--store", self, self); code != 1 || !strings.Contains(out, "holding other files (events.jsonl first), not an mtxdb store") {
		t.Fatalf("import into the room's own directory: exit %d\n%s", code, out)
	} else if ents, _ := os.ReadDir(self); len(ents) != 1 {
		t.Fatalf("import into the room's own directory wrote %v", ents)
	}
	// Every PDU refused for a reason other than its form: the hint says to read
	// the reasons, not to ask whether this is a room's PDUs.
	conflict := filepath.Join(dir, "conflict.jsonl")
	{
		b, err := os.ReadFile(filepath.Join(room("room003"), "events.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		first := strings.SplitN(string(b), "\n", 2)[0]
		tampered := regexp.MustCompile(`("sha256":")[^"]`).ReplaceAllString(first, `${1}X`)
		if tampered == first {
			t.Fatal("no content hash to tamper with")
		}
		if err := os.WriteFile(conflict, []byte(tampered+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s3 := filepath.Join(dir, "s3")
	if out, code := run(t, "import", "--store", s3, room("room003")); code != 0 {
		t.Fatalf("import room003: exit %d\n%s", code, out)
	}
	if out, code := run(t, "import", "--store", s3, conflict); code != 2 || !strings.Contains(out, "none is stored: see the reasons above") || strings.Contains(out, "is this a room's PDUs") {
		t.Fatalf("a conflicting PDU into a store: exit %d\n%s", code, out)
	}
	// Into a store that exists, the store stays.
	if out, code := run(t, "import", "--store", store, garbage); code != 2 || strings.Contains(out, "is removed") {
		t.Fatalf("garbage into a store: exit %d\n%s", code, out)
	} else if _, err := os.Stat(store); err != nil {
		t.Fatalf("garbage into a store removed it: %v", err)
	}
	// Refused lines beside events already stored: an import run again, exit 0.
	if out, code := run(t, "import", "--store", store, bad); code != 0 || !strings.Contains(out, "skipped=6 ") {
		t.Fatalf("the import run again: exit %d\n%s", code, out)
	}
	for _, s := range []string{store, strictStore} {
		out, code = run(t, "stats", "--store", s)
		if code != 0 || !strings.Contains(out, "events=6 ") {
			t.Fatalf("after an import with a refused line: exit %d\n%s", code, out)
		}
	}
	if out, code := run(t, "import", "--store", store, "--batch", "0", bad); code != 1 || !strings.Contains(out, "--batch") {
		t.Fatalf("--batch 0: exit %d\n%s", code, out)
	}
	if out, code := run(t, "import", "--store", filepath.Join(dir, "t"), filepath.Join(dir, "missing.jsonl")); code != 1 {
		t.Fatalf("missing input: exit %d\n%s", code, out)
	} else if _, err := os.Stat(filepath.Join(dir, "t")); err == nil {
		t.Fatal("import of a missing file created the store")
	}
}

// TestCLIStatsReads runs stats --reads before and after a repack: every walk is
// printed with its kinds, and the repack prints its summary.
func TestCLIStatsReads(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	if out, code := run(t, "import", "--store", store, room("room001")); code != 0 {
		t.Fatal(out)
	}
	if out, code := run(t, "stats", "--store", store, "--reads"); code != 1 || !strings.Contains(out, "replay first") {
		t.Fatalf("stats --reads before replay: %d %s", code, out)
	}
	if out, code := run(t, "replay", "--store", store); code != 0 {
		t.Fatal(out)
	}
	for _, step := range [][]string{
		{"stats", "--store", store, "--reads", "--cold"},
		{"repack", "--store", store, "--plan", "auth-chain"},
		{"stats", "--store", store, "--reads", "--walks", "auth-chain,backfill", "--limit", "50"},
	} {
		out, code := run(t, step...)
		if code != 0 {
			t.Fatalf("%v: %d %s", step, code, out)
		}
		switch step[0] {
		case "stats":
			for _, w := range []string{"walk auth-chain", "walk backfill: events=", "meta     reads=", "pdu      reads=", "reads: rooms=1"} {
				if !strings.Contains(out, w) {
					t.Fatalf("%v: no %q in\n%s", step, w, out)
				}
			}
		case "repack":
			for _, w := range []string{"garbage_records_dropped=", "shards_retired=1", "disk_bytes_before=", "returned="} {
				if !strings.Contains(out, w) {
					t.Fatalf("%v: no %q in\n%s", step, w, out)
				}
			}
		}
	}
	if out, code := run(t, "stats", "--store", store, "--reads", "--walks", "nope"); code != 1 || !strings.Contains(out, "unknown walk") {
		t.Fatalf("unknown walk: %d %s", code, out)
	}

	// A room with several forward extremities (room004_union): the resolve-extremities walk
	// resolves their states on the read-only store without writing the
	// resolved nodes, and writes nothing.
	multi := filepath.Join(t.TempDir(), "m")
	for _, step := range [][]string{{"import", "--store", multi, room("room004_union")}, {"replay", "--store", multi}} {
		if out, code := run(t, step...); code != 0 {
			t.Fatalf("%v: %d %s", step, code, out)
		}
	}
	sum := dirsum.Must(t, multi)
	out, code := run(t, "stats", "--store", multi, "--reads", "--walks", "resolve-extremities")
	if code != 0 || !strings.Contains(out, "walk resolve-extremities") {
		t.Fatalf("stats --reads on room004_union (several forward extremities): %d %s", code, out)
	}
	if got := dirsum.Must(t, multi); !maps.Equal(got, sum) {
		t.Fatal("stats --reads changed the store")
	}
}

// TestCLICorruptionExitStatus: with one frame of the store damaged, every command
// that reads it exits 2 and says the data is corrupt, as verify does (exit 1 is for
// usage and other errors).
func TestCLICorruptionExitStatus(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	for _, step := range [][]string{{"import", "--store", store, room("room003")}, {"replay", "--store", store}} {
		if out, code := run(t, step...); code != 0 {
			t.Fatalf("%v: exit %d\n%s", step, code, out)
		}
	}
	shard := filepath.Join(store, "shard-00000.mtdb")
	b, err := os.ReadFile(shard)
	if err != nil {
		t.Fatal(err)
	}
	// Damage bytes in the middle of the shard: inside some frame, which then fails
	// its CRC-32C when read.
	for i := len(b) / 2; i < len(b)/2+64; i++ {
		b[i] ^= 0x5a
	}
	if err := os.WriteFile(shard, b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, step := range [][]string{
		{"verify", "--store", store},
		{"replay", "--store", store, "--force"},
		{"repack", "--store", store},
	} {
		out, code := run(t, step...)
		if code != 2 || !strings.Contains(out, "corrupt") {
			t.Errorf("%v on a damaged store: exit %d (want 2, naming the corruption)\n%s", step, code, out)
		}
	}
}

// TestCLINotAStore: commands other than import refuse a directory holding no store
// files, and write nothing into it.
func TestCLINotAStore(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"stats", "verify", "replay", "repack"} {
		out, code := run(t, cmd, "--store", dir)
		if code != 1 || !strings.Contains(out, "is not an mtxdb store") {
			t.Errorf("%s on a plain directory: exit %d\n%s", cmd, code, out)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("the directory now holds %d entries, want only notes.txt", len(ents))
	}
}

// TestCLIFlagsNeedTheirMode: a flag that only applies with another one is refused
// without it (exit 1, naming both), rather than silently ignored.
func TestCLIFlagsNeedTheirMode(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	if out, code := run(t, "import", "--store", store, room("room003")); code != 0 {
		t.Fatalf("import: exit %d\n%s", code, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"repack", "--store", store, "--every", "8"}, "--every only applies with --liveness every-k"},
		{[]string{"import", "--store", store, "--liveness", "every-k", room("room003")}, "--liveness only applies with --repack"},
		{[]string{"import", "--store", store, "--plan", "mixed", room("room003")}, "--plan only applies with --repack"},
		{[]string{"stats", "--store", store, "--cold"}, "--cold only applies with --reads"},
		{[]string{"stats", "--store", store, "--walks", "backfill"}, "--walks only applies with --reads"},
		{[]string{"stats", "--store", store, "--reads", "--limit", "0"}, "--limit must be positive"},
	} {
		if out, code := run(t, c.args...); code != 1 || !strings.Contains(out, c.want) {
			t.Errorf("%v: exit %d, want 1 and %q\n%s", c.args, code, c.want, out)
		}
	}
}

// TestCLIVerifyCountsOutliers: recorded events that are stored without state
// (outliers: here, a room whose m.room.create never got in) are each a mismatch
// line, and the summary counts every line printed.
func TestCLIVerifyCountsOutliers(t *testing.T) {
	dir := t.TempDir()
	lines, err := os.ReadFile(filepath.Join(room("room008"), "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	ls := strings.Split(strings.TrimSpace(string(lines)), "\n")
	slices.Reverse(ls)
	in := filepath.Join(dir, "reversed.jsonl")
	if err := os.WriteFile(in, []byte(strings.Join(ls, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(dir, "s")
	// The wrong room version: every event but the create is stored, as an outlier;
	// the create is refused (and reported) and the import ends with status 0.
	if out, code := run(t, "import", "--store", store, "--any-order", "--room-version", "10", in); code != 0 || !strings.Contains(out, "new store") || !strings.Contains(out, " refused=1 ") {
		t.Fatalf("import with the wrong room version: exit %d\n%s", code, out)
	}
	if out, code := run(t, "replay", "--store", store); code != 0 {
		t.Fatalf("replay: exit %d\n%s", code, out)
	}
	out, code := run(t, "verify", "--store", store, "--expected", room("room008"))
	printed := strings.Count(out, "\nmismatch ") + strings.Count(out[:min(len(out), 9)], "mismatch ")
	if code != 2 || printed == 0 || !strings.Contains(out, fmt.Sprintf(" mismatches=%d ", printed)) {
		t.Errorf("verify: exit %d, %d mismatch lines\n%s", code, printed, out)
	}
}

// TestCLIVerifyReportsTruncation: with index.ckpt gone and the shard cut short,
// verify, stats and state open the store read-only: the bad
// tail is found and left on disk, not cut, and no file of the store changes;
// verify reports the tail as a problem (exit 2) instead of passing a store that
// lost its rooms. A read-write command (replay) then cuts it.
func TestCLIVerifyReportsTruncation(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	for _, step := range [][]string{{"import", "--store", store, room("room003")}, {"replay", "--store", store}} {
		if out, code := run(t, step...); code != 0 {
			t.Fatalf("%v: exit %d\n%s", step, code, out)
		}
	}
	if err := os.Remove(filepath.Join(store, "index.ckpt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(store, "shard-00000.mtdb"), 150000); err != nil {
		t.Fatal(err)
	}
	before := dirsum.Must(t, store)
	out, code := run(t, "verify", "--store", store)
	if code != 2 || !strings.Contains(out, "problem store: shard-00000.mtdb has a torn or cut-short tail") {
		t.Errorf("verify after a cut: exit %d\n%s", code, out)
	}
	for _, cmd := range [][]string{{"stats", "--store", store}, {"state", "--store", store, "--room", "!FymyxFJPGCZLfPcMwA:server1.test"}} {
		// The cut lost room003's head, so state fails to find the room; what
		// matters is that neither command writes (nor fails for trying to).
		if out, code := run(t, cmd...); strings.Contains(out, packstore.ErrReadOnly.Error()) || !strings.Contains(out, "left on disk") {
			t.Errorf("%v: exit %d\n%s", cmd, code, out)
		}
	}
	if after := dirsum.Must(t, store); !maps.Equal(before, after) {
		t.Fatalf("verify, stats and state changed the store:\nbefore %v\nafter  %v", before, after)
	}
	if out, code := run(t, "replay", "--store", store); code != 0 {
		t.Fatalf("replay: exit %d\n%s", code, out)
	}
	if fi, err := os.Stat(filepath.Join(store, "shard-00000.mtdb")); err != nil || fi.Size() >= 150000 {
		t.Fatalf("a read-write open did not cut the tail: %v", err)
	}
}
