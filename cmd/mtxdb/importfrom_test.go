package main

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/serverdb"
	"github.com/mtxdb/mtxdb/testrooms"
	"github.com/mtxdb/mtxdb/testrooms/synapsedb"
)

// TestCLIImportFromSynapse: the 190 real rooms as Synapse databases (189 in
// one; room004_union, another version of room004's room, in a second) are
// imported with --from synapse:, replayed and audited clean, and the databases
// are not changed. A copy with three injected departures (a join rule row
// deleted from a state group, a ban undone and a member removed in the current
// state) audits to exactly those findings. What is not a Synapse database, a
// server kind not read, a PostgreSQL store and PATHs beside --from are refused.
func TestCLIImportFromSynapse(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(testrooms.Dir(), "real")
	all, err := filepath.Glob(filepath.Join(real, "room*"))
	if err != nil {
		t.Fatal(err)
	}
	union := filepath.Join(real, "room004_union")
	dbA, dbB := filepath.Join(dir, "a.db"), filepath.Join(dir, "b.db")
	if _, err := synapsedb.Build(dbA, slices.DeleteFunc(slices.Clone(all), func(d string) bool { return d == union })); err != nil {
		t.Fatal(err)
	}
	if _, err := synapsedb.Build(dbB, []string{union}); err != nil {
		t.Fatal(err)
	}
	rooms := 0
	for _, db := range []string{dbA, dbB} {
		before, _ := os.ReadFile(db)
		store := db + ".store"
		o, code := importReplayAudit(t, store, db)
		if code != 0 || !strings.Contains(o, " findings=0 problems=0") {
			t.Fatalf("%s: audit exit %d\n%s", db, code, o)
		}
		var n int
		fmt.Sscanf(o[strings.LastIndex(o, "audit: rooms="):], "audit: rooms=%d", &n)
		rooms += n
		if after, _ := os.ReadFile(db); !bytes.Equal(before, after) {
			t.Errorf("%s changed by the import", db)
		}
	}
	if rooms != 190 {
		t.Errorf("%d rooms audited, want 190", rooms)
	}

	injected := filepath.Join(dir, "injected.db")
	b, _ := os.ReadFile(dbA)
	os.WriteFile(injected, b, 0o644)
	want := injectSynapse(t, injected)
	o, code := importReplayAudit(t, injected+".store", injected, "--json")
	if code != 2 {
		t.Fatalf("injected: audit exit %d, want 2\n%s", code, o)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(o), "\n") {
		var f map[string]any
		if json.Unmarshal([]byte(line), &f) == nil && f["kind"] == "finding" {
			got = append(got, fmt.Sprintf("%s %s %s", f["event"], f["key"], f["finding"]))
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("findings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	foreign := filepath.Join(dir, "foreign.db")
	os.WriteFile(foreign, []byte("SQLite format 3\x00 but not really"), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--from", "synapse:" + foreign}, "file is not a database"},
		{[]string{"--from", "synapse:" + filepath.Join(dir, "missing.db")}, "missing.db"},
		{[]string{"--from", "dendrite:" + dbA}, "not a Dendrite roomserver database"},
		{[]string{"--from", "matrix:" + dbA}, "unknown server kind"},
		{[]string{"--from", "synapse:" + dbA, real}, "--from imports a server's database, not PATHs"},
		{[]string{"--room", "!r:s", real}, "--room"},
	} {
		o, code := run(t, append([]string{"import", "--store", filepath.Join(dir, "refused")}, c.args...)...)
		if code != 1 || !strings.Contains(o, c.want) {
			t.Errorf("import %v: exit %d, want 1 and %q\n%s", c.args, code, c.want, o)
		}
	}
	if o, code := run(t, "import", "--store", "postgres://u@127.0.0.1:1/db", "--from", "synapse:"+dbA); code != 1 || !strings.Contains(o, "directory") {
		t.Errorf("--from into a PostgreSQL store: exit %d\n%s", code, o)
	}
}

// importReplayAudit imports a Synapse database into store, replays and audits
// it, and returns audit's output and exit status.
func importReplayAudit(t *testing.T, store, db string, auditArgs ...string) (string, int) {
	t.Helper()
	if o, code := run(t, "import", "--store", store, "--from", "synapse:"+db); code != 0 {
		t.Fatalf("import --from %s: exit %d\n%s", db, code, o)
	}
	if o, code := run(t, "replay", "--store", store); code != 0 {
		t.Fatalf("replay: exit %d\n%s", code, o)
	}
	return run(t, append([]string{"audit", "--store", store}, auditArgs...)...)
}

// injectSynapse changes the Synapse database of the real rooms at path and
// returns the findings audit must report ("EVENT KEY KIND"): room163's join
// rules row deleted from its state group (so the five events from the join
// rules event on lack them: the server did not apply that event), room163's
// ban of @user2 undone in the current state, and room001's only member removed
// from the current state.
func injectSynapse(t *testing.T, path string) []string {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ids := func(room string) []string {
		var out []string
		b, err := os.ReadFile(filepath.Join(testrooms.Dir(), "real", room, "events.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var e struct {
				ID string `json:"event_id"`
			}
			json.Unmarshal([]byte(l), &e)
			out = append(out, e.ID)
		}
		return out
	}
	r163, r001 := ids("room163"), ids("room001")
	joinRules, join2, ban := r163[3], r163[6], r163[7]
	for _, stmt := range []string{
		fmt.Sprintf("DELETE FROM state_groups_state WHERE event_id = '%s'", joinRules),
		fmt.Sprintf("UPDATE current_state_events SET event_id = '%s' WHERE event_id = '%s'", join2, ban),
		fmt.Sprintf("DELETE FROM current_state_events WHERE event_id = '%s'", r001[1]),
	} {
		if res, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		} else if n, _ := res.RowsAffected(); n != 1 {
			t.Fatalf("%s: %d rows", stmt, n)
		}
	}
	var want []string
	for _, ev := range r163[3:] {
		want = append(want, ev+" m.room.join_rules| rejected_accepted")
	}
	return append(want, "current state m.room.member|@user2:server1.test ban_undone",
		"current state m.room.member|@user1:server1.test member_removed")
}

// TestCLIImportFromDendrite: a stock Dendrite's roomserver database after the
// federation partition scenarios (testrooms/dendrite/README.md) imports with
// --from dendrite:, replays, and audits to exactly the findings recorded
// beside it: the three rooms where stock's state departed from the spec, each
// at the contested member, and nothing in the fourth; the database unchanged.
// A patched build's database, whose state is in mtxdb, is refused.
func TestCLIImportFromDendrite(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "roomserver.db")
	src := filepath.Join(testrooms.Dir(), "dendrite", "partition-stock-A.db")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(db, b, 0o644)
	store := filepath.Join(dir, "s")
	for _, args := range [][]string{{"import", "--store", store, "--from", "dendrite:" + db}, {"replay", "--store", store}} {
		if o, code := run(t, args...); code != 0 {
			t.Fatalf("%v: exit %d\n%s", args, code, o)
		}
	}
	o, code := run(t, "audit", "--store", store)
	want, err := os.ReadFile(filepath.Join(testrooms.Dir(), "dendrite", "partition-stock-A.audit.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if code != 2 || o != string(want) {
		t.Errorf("audit: exit %d, want 2; output:\n%s\nwant:\n%s", code, o, want)
	}
	if after, _ := os.ReadFile(db); !bytes.Equal(after, b) {
		t.Errorf("the database changed")
	}
	// A patched build's database: its events name snapshots only mtxdb holds.
	patched := filepath.Join(dir, "patched.db")
	os.WriteFile(patched, b, 0o644)
	sdb, err := sql.Open("sqlite", "file:"+patched)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sdb.Exec("DELETE FROM roomserver_state_snapshots"); err != nil {
		t.Fatal(err)
	}
	sdb.Close()
	if o, code := run(t, "import", "--store", filepath.Join(dir, "p"), "--from", "dendrite:"+patched); code != 1 || !strings.Contains(o, "keeps its state in mtxdb") {
		t.Errorf("a patched build's database: exit %d\n%s", code, o)
	}
}

// TestCLIImportFromDamaged: a PDU whose content was changed in the database
// (so that it no longer gives the event ID the database names it by) is refused
// at import, and audit reports that room's events it cannot compare as problem
// lines while it audits the other rooms (exit 2); a database path with '#', '%'
// and '?' is opened as named, read-only; --room naming a room without a
// recording is a problem.
func TestCLIImportFromDamaged(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "a#b %41?.db")
	real := filepath.Join(testrooms.Dir(), "real")
	ids, err := synapsedb.Build(db, []string{filepath.Join(real, "room001"), filepath.Join(real, "room163")})
	if err != nil {
		t.Fatal(err)
	}
	sdb, err := sql.Open("sqlite", "file:"+serverdb.SQLitePath(db))
	if err != nil {
		t.Fatal(err)
	}
	var victim, js string
	if err := sdb.QueryRow("SELECT event_id, json FROM event_json WHERE room_id = ? ORDER BY event_id LIMIT 1 OFFSET 300", ids[0]).Scan(&victim, &js); err != nil {
		t.Fatal(err)
	}
	if _, err := sdb.Exec("UPDATE event_json SET json = ? WHERE event_id = ?", strings.Replace(js, `"depth":`, `"depth":9`, 1), victim); err != nil {
		t.Fatal(err)
	}
	sdb.Close()
	before, _ := os.ReadFile(db)
	store := filepath.Join(dir, "s")
	o, code := run(t, "import", "--store", store, "--from", "synapse:"+db)
	if code != 0 || !strings.Contains(o, "refused=1") || !strings.Contains(o, victim) || !strings.Contains(o, "event_id does not match") {
		t.Fatalf("import: exit %d, want 0 and the changed PDU refused\n%s", code, o)
	}
	if after, _ := os.ReadFile(db); !bytes.Equal(before, after) {
		t.Errorf("the database changed")
	}
	if _, err := os.Stat(filepath.Join(dir, "a")); err == nil {
		t.Errorf("a file %s/a was created: the path was cut at '#'", dir)
	}
	if o, code := run(t, "replay", "--store", store); code != 0 {
		t.Fatalf("replay: exit %d\n%s", code, o)
	}
	o, code = run(t, "audit", "--store", store)
	if code != 2 || !strings.Contains(o, "problem room="+ids[0]+": event "+victim+": ours (event not imported)") ||
		!strings.Contains(o, "room: room="+ids[1]+" events=8 differing_events=0 findings=0") {
		t.Errorf("audit: exit %d, want 2, a problem for the refused event and room163 audited clean\n%s", code, o[max(0, len(o)-3000):])
	}
	if err := os.RemoveAll(filepath.Join(store, "recorded", serverdb.RecordingDir(ids[1]))); err != nil {
		t.Fatal(err)
	}
	if o, code := run(t, "audit", "--store", store, "--room", ids[1]); code != 2 || !strings.Contains(o, "no recorded state for this room") {
		t.Errorf("audit --room without a recording: exit %d\n%s", code, o)
	}
	if o, code := run(t, "import", "--store", store, "--from", "synapse:"+db, "--room", ""); code != 1 || !strings.Contains(o, "--room is empty") {
		t.Errorf("import --from --room '': exit %d\n%s", code, o)
	}
}

// TestSourceLabel: a URL's password masked in what is written of --from.
func TestSourceLabel(t *testing.T) {
	if got := sourceLabel("synapse:postgres://u:secret@h:5432/db?sslmode=disable"); strings.Contains(got, "secret") || !strings.HasPrefix(got, "synapse:postgres://u:") {
		t.Errorf("sourceLabel: %q", got)
	}
	if got := sourceLabel("dendrite:/var/lib/d.db"); got != "dendrite:/var/lib/d.db" {
		t.Errorf("sourceLabel of a path: %q", got)
	}
}
