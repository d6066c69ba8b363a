package e2e

import (
	"bufio"
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// roomserverDB opens a Dendrite server's SQLite roomserver database read-only.
func roomserverDB(s *server) (*sql.DB, error) {
	return sql.Open("sqlite3", "file:"+filepath.Join(s.dir, "dendrite_roomserver.db")+"?mode=ro&_busy_timeout=10000")
}

// storedEvents returns which of ids the server's roomserver has stored (event row and
// JSON), each with its rejected flag.
func storedEvents(s *server, ids []string) (map[string]bool, error) {
	db, err := roomserverDB(s)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	out := map[string]bool{}
	for _, id := range ids {
		var rejected bool
		err := db.QueryRow(`SELECT e.is_rejected FROM roomserver_events e JOIN roomserver_event_json j ON j.event_nid = e.event_nid
			WHERE e.event_id = ?`, id).Scan(&rejected)
		if err == sql.ErrNoRows {
			continue
		}
		if err != nil {
			return nil, err
		}
		out[id] = rejected
	}
	return out, nil
}

// roomExport is one room's events as a server's roomserver database holds them.
type roomExport struct {
	// events are the PDUs with a top-level event_id, ordered so that each comes
	// after its prev_events and auth_events that the export holds (ties by depth,
	// then by the server's event NID).
	events []json.RawMessage
	byID   map[string]json.RawMessage
	// extremities are the server's forward extremities (roomserver_rooms.latest_event_nids).
	extremities []string
	rejected    []string // events the server stored as rejected
}

// exportRoom reads every event of roomID from the server's roomserver database.
func exportRoom(s *server, roomID string) (*roomExport, error) {
	db, err := roomserverDB(s)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rows, err := db.Query(`SELECT e.event_nid, e.event_id, e.depth, e.is_rejected, j.event_json
		FROM roomserver_events e JOIN roomserver_event_json j ON j.event_nid = e.event_nid
		JOIN roomserver_rooms r ON r.room_nid = e.room_nid WHERE r.room_id = ? ORDER BY e.event_nid`, roomID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	type ev struct {
		nid, depth int64
		id         string
		pdu        json.RawMessage
		parents    []string
	}
	var evs []*ev
	ex := &roomExport{byID: map[string]json.RawMessage{}}
	nidToID := map[int64]string{}
	for rows.Next() {
		var e ev
		var rejected bool
		var js string
		if err := rows.Scan(&e.nid, &e.id, &e.depth, &rejected, &js); err != nil {
			return nil, err
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal([]byte(js), &fields); err != nil {
			return nil, fmt.Errorf("event %s: %w", e.id, err)
		}
		idJSON, _ := json.Marshal(e.id)
		fields["event_id"] = idJSON
		if e.pdu, err = json.Marshal(fields); err != nil {
			return nil, err
		}
		var edges struct {
			Prev []string `json:"prev_events"`
			Auth []string `json:"auth_events"`
		}
		if err := json.Unmarshal([]byte(js), &edges); err != nil {
			return nil, fmt.Errorf("event %s: prev/auth events: %w", e.id, err)
		}
		e.parents = append(edges.Prev, edges.Auth...)
		if rejected {
			ex.rejected = append(ex.rejected, e.id)
		}
		nidToID[e.nid] = e.id
		evs = append(evs, &e)
		ex.byID[e.id] = e.pdu
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var latest string
	if err := db.QueryRow(`SELECT latest_event_nids FROM roomserver_rooms WHERE room_id = ?`, roomID).Scan(&latest); err != nil {
		return nil, err
	}
	var nids []int64
	if err := json.Unmarshal([]byte(latest), &nids); err != nil {
		return nil, fmt.Errorf("latest_event_nids %q: %w", latest, err)
	}
	for _, n := range nids {
		ex.extremities = append(ex.extremities, nidToID[n])
	}
	sort.Strings(ex.extremities)

	// Kahn's algorithm over the edges inside the export, the ready set by depth and NID.
	children := map[string][]*ev{}
	waiting := map[*ev]int{}
	var ready []*ev
	for _, e := range evs {
		for _, p := range e.parents {
			if _, ok := ex.byID[p]; ok {
				children[p] = append(children[p], e)
				waiting[e]++
			}
		}
		if waiting[e] == 0 {
			ready = append(ready, e)
		}
	}
	for len(ready) > 0 {
		sort.Slice(ready, func(i, j int) bool {
			if ready[i].depth != ready[j].depth {
				return ready[i].depth < ready[j].depth
			}
			return ready[i].nid < ready[j].nid
		})
		e := ready[0]
		ready = ready[1:]
		ex.events = append(ex.events, e.pdu)
		for _, c := range children[e.id] {
			if waiting[c]--; waiting[c] == 0 {
				ready = append(ready, c)
			}
		}
	}
	if len(ex.events) != len(evs) {
		return nil, fmt.Errorf("room %s: %d of %d events in a cycle of prev/auth events", roomID, len(evs)-len(ex.events), len(evs))
	}
	return ex, nil
}

// replayResult is what mtxdb computes from one export.
type replayResult struct {
	state    map[string]string // type NUL state_key -> event ID: mtxdb state (current state)
	rejected []string          // "event: reason" lines of verify --rejected
	summary  string            // the import, replay and rooms lines
}

// buildMtxdb builds the mtxdb command from this repository into dir.
func buildMtxdb(t *testing.T, dir string) string {
	root, err := filepath.Abs("../../../..")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "mtxdb")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/mtxdb")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/mtxdb in %s: %v\n%s", root, err, b)
	}
	return out
}

// replayExport writes the export as events.jsonl in dir, imports it into a fresh
// store there, replays it and reads the current state of the room.
func replayExport(cli, dir, roomID string, ex *roomExport) (*replayResult, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	for _, e := range ex.events {
		buf.Write(e)
		buf.WriteByte('\n')
	}
	file := filepath.Join(dir, "events.jsonl")
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		return nil, err
	}
	store := filepath.Join(dir, "store")
	_ = os.RemoveAll(store)
	mtxdb := func(args ...string) (string, error) {
		cmd := exec.Command(cli, args...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return out.String(), fmt.Errorf("mtxdb %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
		}
		return out.String(), nil
	}
	res := &replayResult{state: map[string]string{}}
	imp, err := mtxdb("import", "--store", store, file)
	if err != nil {
		return nil, err
	}
	rep, err := mtxdb("replay", "--store", store)
	if err != nil {
		return nil, err
	}
	rooms, err := mtxdb("rooms", "--store", store)
	if err != nil {
		return nil, err
	}
	res.summary = strings.TrimSpace(imp) + "\n" + strings.TrimSpace(rep) + "\n" + strings.TrimSpace(rooms)
	st, err := mtxdb("state", "--store", store, "--room", roomID)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(strings.NewReader(st))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 3 {
			return nil, fmt.Errorf("mtxdb state: unexpected line %q", sc.Text())
		}
		res.state[f[0]+"\x00"+f[1]] = f[2]
	}
	ver, err := mtxdb("verify", "--store", store, "--rejected")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(ver, "\n") {
		if strings.HasPrefix(line, "rejected ") {
			res.rejected = append(res.rejected, strings.TrimPrefix(line, "rejected "))
		}
	}
	return res, nil
}

// auditResult is mtxdb audit of one server's roomserver database for one room.
type auditResult struct {
	findings int
	events   int               // events whose recorded state differs
	current  map[string]string // current-state findings: "type\x00state_key" -> kind
	kinds    map[string]int
}

// auditDatabase imports one room of a stopped stock server's roomserver database
// with mtxdb import --from dendrite:, replays it and audits it.
func auditDatabase(cli, dir string, s *server, roomID string) (*auditResult, error) {
	store := filepath.Join(dir, "audit-store")
	_ = os.RemoveAll(store)
	db := filepath.Join(s.dir, "dendrite_roomserver.db")
	for _, args := range [][]string{
		{"import", "--store", store, "--from", "dendrite:" + db, "--room", roomID},
		{"replay", "--store", store},
	} {
		if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("mtxdb %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	cmd := exec.Command(cli, "audit", "--store", store, "--room", roomID, "--json")
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); err != nil && (!ok || ee.ExitCode() != 2) {
		return nil, fmt.Errorf("mtxdb audit: %v\n%s", err, out)
	}
	res := &auditResult{current: map[string]string{}, kinds: map[string]int{}}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var f map[string]any
		if json.Unmarshal([]byte(line), &f) != nil || f["kind"] != "finding" {
			continue
		}
		ev, key, kind := f["event"].(string), f["key"].(string), f["finding"].(string)
		res.findings++
		res.kinds[kind]++
		if ev == "current state" {
			res.current[strings.Replace(key, "|", "\x00", 1)] = kind
		} else if !seen[ev] {
			seen[ev] = true
			res.events++
		}
	}
	return res, nil
}

// auditScenario audits every stock server's database for the scenario's room
// and checks that the keys audit names in the current state are exactly those
// on which the server's /state departs from the replay of its own export.
func auditScenario(t *testing.T, c *fedCluster, r *scenarioRun, cli, dir string) {
	if r.err != "" || c.build != "stock" || len(r.states) != len(c.nodes) || len(r.replays) != len(c.nodes) {
		return
	}
	for i, n := range c.nodes {
		a, err := auditDatabase(cli, filepath.Join(dir, r.sc.name, n.label), n.server, r.room.String())
		if err != nil {
			t.Errorf("stock %s: audit of %s's database: %v", r.sc.name, n.label, err)
			continue
		}
		r.audits = append(r.audits, a)
		want := map[string]bool{}
		for k := range union(r.states[i], r.replays[i].state) {
			if r.states[i][k] != r.replays[i].state[k] {
				want[k] = true
			}
		}
		var missing, extra []string
		for k := range want {
			if _, ok := a.current[k]; !ok {
				missing = append(missing, k)
			}
		}
		for k := range a.current {
			if !want[k] {
				extra = append(extra, k)
			}
		}
		if len(missing)+len(extra) > 0 {
			t.Errorf("stock %s: audit of %s's database: current-state findings miss %q and add %q to the keys where /state departs from the replay", r.sc.name, n.label, missing, extra)
		}
	}
}

func union(a, b map[string]string) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}
