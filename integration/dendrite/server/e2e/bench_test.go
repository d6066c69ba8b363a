package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"
)

// benchRun is one (database, build) run of the workload.
type benchRun struct {
	Database      string  `json:"database"`
	Build         string  `json:"build"`
	Users         int     `json:"users"`
	Requests      int     `json:"requests"`
	StateWrites   int     `json:"state_writes"`
	Seconds       float64 `json:"seconds"`
	RequestsPerS  float64 `json:"requests_per_s"`
	StateP50Ms    float64 `json:"state_write_p50_ms"`
	StateP99Ms    float64 `json:"state_write_p99_ms"`
	SQLStateBytes int64   `json:"sql_state_bytes"`
	StoreBytes    int64   `json:"mtxdb_store_bytes"`
	StateBytes    int64   `json:"state_bytes"`
	EventJSON     int64   `json:"event_json_bytes"`
	SQLSnapshots  int     `json:"sql_snapshot_rows"`
	SQLBlocks     int     `json:"sql_block_rows"`
}

// benchWorkload: USERS users register and join one public room; each sets a state
// event of its own twice and sends two messages; alice changes the topic after every
// tenth join. Joins and state events are the state writes whose latency is recorded.
func benchWorkload(t *testing.T, s *server, users int) (requests int, lat []time.Duration, secs float64, last id.EventID, alice *mautrix.Client, room id.RoomID) {
	ctx := context.Background()
	reg := func(name string) *mautrix.Client {
		c := client(t, s)
		r := m(c.RegisterDummy(ctx, &mautrix.ReqRegister[any]{Username: name, Password: name + "-password-1"})).or(t, "register "+name)
		c.SetCredentials(r.UserID, r.AccessToken)
		return c
	}
	start := time.Now()
	alice = reg("alice")
	requests++
	zero := 0 // members may set state (their own org.example.profile)
	room = m(alice.CreateRoom(ctx, &mautrix.ReqCreateRoom{Preset: "public_chat", Name: "bench", RoomVersion: "10",
		PowerLevelOverride: &event.PowerLevelsEventContent{StateDefaultPtr: &zero}})).or(t, "create room").RoomID
	requests++
	timed := func(what string, f func() error) {
		t0 := time.Now()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		lat = append(lat, time.Since(t0))
		requests++
	}
	clients := make([]*mautrix.Client, users)
	for i := range clients {
		clients[i] = reg(fmt.Sprintf("user%03d", i))
		requests++
		c := clients[i]
		timed("join", func() error { _, err := c.JoinRoomByID(ctx, room); return err })
		if i%10 == 9 {
			timed("topic", func() error {
				_, err := alice.SendStateEvent(ctx, room, event.StateTopic, "", map[string]any{"topic": fmt.Sprintf("after %d joins", i+1)})
				return err
			})
		}
	}
	for round := 0; round < 2; round++ {
		for i, c := range clients {
			timed("state", func() error {
				_, err := c.SendStateEvent(ctx, room, event.NewEventType("org.example.profile"), c.UserID.String(), map[string]any{"round": round, "i": i})
				return err
			})
			m(c.SendText(ctx, room, fmt.Sprintf("round %d from %d", round, i))).or(t, "message")
			requests++
		}
	}
	last = m(alice.SendText(ctx, room, "end of workload")).or(t, "last message").EventID
	requests++
	secs = time.Since(start).Seconds()
	return
}

func percentile(d []time.Duration, p float64) float64 {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p*float64(len(s)-1) + 0.5)
	return float64(s[i].Microseconds()) / 1000
}

func copyFile(t *testing.T, from, to string) {
	in, err := os.Open(from)
	if os.IsNotExist(err) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// sqliteTableBytes is what the two state tables and their indexes take in a SQLite
// file: the size of a VACUUMed copy minus that of a VACUUMed copy without them (their
// pages, rows and indexes: an empty table still has pages, as in PostgreSQL's measure).
func sqliteTableBytes(t *testing.T, dbPath string) (bytes int64, eventJSON int64) {
	size := func(empty bool) int64 {
		dir := t.TempDir()
		cp := filepath.Join(dir, "rs.db")
		copyFile(t, dbPath, cp)
		copyFile(t, dbPath+"-wal", cp+"-wal")
		db, err := sql.Open("sqlite3", "file:"+cp)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if !empty {
			if err := db.QueryRow("SELECT COALESCE(SUM(LENGTH(event_json)), 0) FROM roomserver_event_json").Scan(&eventJSON); err != nil {
				t.Fatal(err)
			}
		}
		if empty {
			for _, tb := range []string{"roomserver_state_snapshots", "roomserver_state_block"} {
				if _, err := db.Exec("DROP TABLE " + tb); err != nil {
					t.Fatal(err)
				}
			}
		}
		out := filepath.Join(dir, "vacuumed.db")
		if _, err := db.Exec("VACUUM INTO '" + out + "'"); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(out)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	full := size(false)
	return full - size(true), eventJSON
}

func pgTableBytes(t *testing.T, url string) (bytes int64, eventJSON int64) {
	db, err := sql.Open("postgres", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.QueryRow("SELECT pg_total_relation_size('roomserver_state_snapshots') + pg_total_relation_size('roomserver_state_block')").Scan(&bytes); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow("SELECT COALESCE(SUM(LENGTH(event_json)), 0) FROM roomserver_event_json").Scan(&eventJSON); err != nil {
		t.Fatal(err)
	}
	return bytes, eventJSON
}

// pgStoreBytes is pg_total_relation_size of mtxdb_records (heap, TOAST, indexes),
// where a PostgreSQL Dendrite with mtxdb keeps its state; the test fails when the
// table is empty.
func pgStoreBytes(t *testing.T, url string) int64 {
	db, err := sql.Open("postgres", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var rows, bytes int64
	if err := db.QueryRow("SELECT count(*), pg_total_relation_size('mtxdb_records') FROM mtxdb_records").Scan(&rows, &bytes); err != nil || rows == 0 {
		t.Errorf("mtxdb_records: %d rows, %d bytes, %v", rows, bytes, err)
	}
	return bytes
}

// TestBenchDendrite is make bench-dendrite: the workload on stock and mtxdb Dendrite,
// SQLite and PostgreSQL, one run each (MTXDB_BENCH_USERS users), then the fork part
// (bench_fork_test.go: MTXDB_BENCH_FORKS merged forks in a room of
// MTXDB_BENCH_FORK_MEMBERS members, on the databases of MTXDB_BENCH_FORK_DBS); writes
// dendrite.{json,md,png} to MTXDB_BENCH_OUT. 0 users or 0 forks leave that part out
// and keep its previous results and text (previousBench).
func TestBenchDendrite(t *testing.T) {
	bin, out, pg := os.Getenv("MTXDB_DENDRITE_BIN"), os.Getenv("MTXDB_BENCH_OUT"), os.Getenv("MTXDB_PG_URL")
	if bin == "" || out == "" || pg == "" {
		t.Skip("MTXDB_DENDRITE_BIN, MTXDB_BENCH_OUT and MTXDB_PG_URL not all set: make bench-dendrite sets them")
	}
	knob := func(name string, def int) int { return envCount(t, name, def, 0) }
	users := knob("MTXDB_BENCH_USERS", 100)
	forks, members := knob("MTXDB_BENCH_FORKS", 20), knob("MTXDB_BENCH_FORK_MEMBERS", 1000)
	forkDBs := []string{"sqlite", "postgres"}
	if v := os.Getenv("MTXDB_BENCH_FORK_DBS"); v != "" {
		forkDBs = strings.Split(v, ",")
	}
	if forks > 0 && members < 2 {
		t.Fatalf("MTXDB_BENCH_FORK_MEMBERS=%d: the fork part needs alice and bob", members)
	}
	load0, _ := os.ReadFile("/proc/loadavg")
	var runs []benchRun
	workloadDBs := []string{"sqlite", "postgres"}
	if users == 0 {
		workloadDBs = nil
	}
	for _, backend := range workloadDBs {
		for _, build := range []string{"stock", "mtxdb"} {
			env := []string{"MTXDB_DENDRITE_STATE_BASE=" + filepath.Join(t.TempDir(), "mtxdb-state")}
			s, dbURL := startBuild(t, bin, pg, backend, build, "bench_", env)
			reqs, lat, secs, last, alice, room := benchWorkload(t, s, users)
			settle(t, &world{alice: alice, rooms: []id.RoomID{room}, last: []id.EventID{last}})
			s.stop()
			r := benchRun{Database: backend, Build: build, Users: users, Requests: reqs, StateWrites: len(lat), Seconds: secs,
				RequestsPerS: float64(reqs) / secs, StateP50Ms: percentile(lat, 0.5), StateP99Ms: percentile(lat, 0.99)}
			if backend == "sqlite" {
				r.SQLStateBytes, r.EventJSON = sqliteTableBytes(t, filepath.Join(s.dir, "dendrite_roomserver.db"))
			} else {
				r.SQLStateBytes, r.EventJSON = pgTableBytes(t, dbURL)
			}
			r.SQLSnapshots, r.SQLBlocks = stateRows(t, s, dbURL)
			if build == "mtxdb" {
				if backend == "postgres" {
					r.StoreBytes = pgStoreBytes(t, dbURL) // the state is in the roomserver's database
				} else {
					r.StoreBytes = dirBytes(t, filepath.Join(s.dir, "dendrite_roomserver.db.mtxdb-state"))
				}
			}
			r.StateBytes = r.SQLStateBytes + r.StoreBytes
			t.Logf("%+v", r)
			runs = append(runs, r)
		}
	}
	load1, _ := os.ReadFile("/proc/loadavg")
	var forkRuns []forkRun
	up0, up1 := "", ""
	if forks > 0 {
		up0 = uptime()
		forkRuns = forkBenches(t, bin, pg, forkDBs, members, forks)
		up1 = uptime()
	}
	host, _ := os.Hostname()
	now := time.Now().UTC().Format(time.RFC3339)
	res, md := previousBench(t, out)
	res.Host = host
	if users > 0 {
		res.Date, res.Runs, res.Workload = now, runs, benchWorkloadText
		res.LoadBefore, res.LoadAfter = strings.Join(strings.Fields(string(load0))[:3], " "), strings.Join(strings.Fields(string(load1))[:3], " ")
		var b strings.Builder
		writeWorkloadSection(&b, res.Runs, res.Date, res.Workload, res.LoadBefore, res.LoadAfter)
		md[0] = b.String()
	}
	if forks > 0 {
		res.ForkDate, res.ForkRuns, res.ForkUptimeBefore, res.ForkUptimeAfter = now, forkRuns, up0, up1
		var b strings.Builder
		writeForkSection(&b, res.ForkRuns, res.ForkDate, up0, up1)
		md[1] = b.String()
	}
	writeBench(t, out, res, md)
}

const benchWorkloadText = "users register and join one public room; each sets a state event of its own twice and sends two messages; alice changes the topic after every tenth join"

// benchResults is dendrite.json: the workload's runs and the fork part's, each
// with when it was measured (RFC 3339, UTC) and the load around it.
type benchResults struct {
	Host       string     `json:"host"`
	Date       string     `json:"date"`
	Workload   string     `json:"workload"`
	LoadBefore string     `json:"load_before"` // /proc/loadavg's three averages
	LoadAfter  string     `json:"load_after"`
	Runs       []benchRun `json:"runs"`

	ForkDate         string    `json:"fork_date"`
	ForkUptimeBefore string    `json:"fork_uptime_before"` // uptime(1)'s line
	ForkUptimeAfter  string    `json:"fork_uptime_after"`
	ForkRuns         []forkRun `json:"fork_runs"`
}

// previousBench reads dendrite.json and dendrite.md in out, so that a run that
// leaves a part out (MTXDB_BENCH_USERS=0, MTXDB_BENCH_FORKS=0) keeps that part's
// results and its text, hand-written notes included: md[0] is the workload's text
// (after the title, up to the fork part's heading), md[1] the fork part's (from its
// heading to the end). Missing files give empty results.
func previousBench(t *testing.T, out string) (res benchResults, md [2]string) {
	b, err := os.ReadFile(filepath.Join(out, "dendrite.json"))
	if os.IsNotExist(err) {
		return res, md
	}
	if err == nil {
		err = json.Unmarshal(b, &res)
	}
	if err != nil {
		t.Fatalf("the previous results, %s/dendrite.json: %v", out, err)
	}
	b, err = os.ReadFile(filepath.Join(out, "dendrite.md"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	text := strings.TrimPrefix(string(b), benchTitle)
	if i := strings.Index(text, forkHeading); i >= 0 {
		md = [2]string{text[:i], text[i:]}
	} else {
		md[0] = text
	}
	return res, md
}

// benchTitle and forkHeading start dendrite.md and its fork part.
const (
	benchTitle  = "# Dendrite v0.13.8: stock SQL state tables against mtxdb (make bench-dendrite)\n\n"
	forkHeading = "\n## Inbound federation merge"
)

// writeBench writes dendrite.{json,md,png}: res, and md (the workload's text, then
// the fork part's) under the title.
func writeBench(t *testing.T, out string, res benchResults, md [2]string) {
	js, _ := json.MarshalIndent(res, "", "  ")
	if err := os.WriteFile(filepath.Join(out, "dendrite.json"), append(js, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	text := benchTitle + md[0] + md[1]
	if err := os.WriteFile(filepath.Join(out, "dendrite.md"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeBenchPlot(filepath.Join(out, "dendrite.png"), res.Runs, res.ForkRuns); err != nil {
		t.Fatal(err)
	}
	t.Log(text)
}

func writeWorkloadSection(b *strings.Builder, runs []benchRun, date, workload, load0, load1 string) {
	fmt.Fprintf(b, "%s, one run per row, %d users (%s). Load average (1/5/15 min) %s before, %s after.\n\n", date, runs[0].Users, workload, load0, load1)
	fmt.Fprintf(b, "State bytes: stock = the two SQL tables with their indexes (SQLite: a VACUUMed copy minus a VACUUMed copy without the two tables; PostgreSQL: pg_total_relation_size, dead tuples included, as a running server holds them); mtxdb = the store (SQLite: its directory; PostgreSQL: pg_total_relation_size of mtxdb_records in the same database) plus the same SQL measure (0 rows). Event JSON = SUM(LENGTH(event_json)) of roomserver_event_json, the anchor of dendrite #2464 (11 GB of state blocks beside 914 MB of event JSON: 12x).\n\n")
	fmt.Fprintf(b, "| database | build | state bytes | state / event JSON | x stock | state-write p50 ms | p99 ms | requests/s | SQL snapshot/block rows |\n|---|---|---:|---:|---:|---:|---:|---:|---|\n")
	stock := map[string]int64{}
	for _, r := range runs {
		if r.Build == "stock" {
			stock[r.Database] = r.StateBytes
		}
	}
	for _, r := range runs {
		fmt.Fprintf(b, "| %s | %s | %d | %.2f | %.2f | %.1f | %.1f | %.1f | %d/%d |\n", r.Database, r.Build, r.StateBytes,
			float64(r.StateBytes)/float64(r.EventJSON), float64(r.StateBytes)/float64(stock[r.Database]), r.StateP50Ms, r.StateP99Ms, r.RequestsPerS, r.SQLSnapshots, r.SQLBlocks)
	}
}

// writeBenchPlot draws the workload's state bytes and the fork part's merge medians
// (received->visible), one panel each, side by side when both ran.
func writeBenchPlot(path string, runs []benchRun, forkRuns []forkRun) error {
	var panels []*plot.Plot
	// bar adds a panel of n bars, bar i named and valued by at(i); none when n is 0.
	bar := func(title, ylabel string, n int, at func(i int) (string, float64)) error {
		if n == 0 {
			return nil
		}
		names, vals := make([]string, n), make(plotter.Values, n)
		for i := range n {
			names[i], vals[i] = at(i)
		}
		p := plot.New()
		p.Title.Text, p.Y.Label.Text = title, ylabel
		bars, err := plotter.NewBarChart(vals, vg.Points(30))
		if err != nil {
			return err
		}
		p.Add(bars)
		p.NominalX(names...)
		panels = append(panels, p)
		return nil
	}
	if len(runs) > 0 {
		if err := bar(fmt.Sprintf("Dendrite state bytes, %d users", runs[0].Users), "state bytes (KiB)", len(runs), func(i int) (string, float64) {
			return runs[i].Database + "/" + runs[i].Build, float64(runs[i].StateBytes) / 1024
		}); err != nil {
			return err
		}
	}
	if len(forkRuns) > 0 {
		if err := bar(fmt.Sprintf("Merge received->visible p50, %d members", forkRuns[0].Members), "ms", len(forkRuns), func(i int) (string, float64) {
			return forkRuns[i].Database + "/" + forkRuns[i].Build, forkRuns[i].RecvP50Ms
		}); err != nil {
			return err
		}
	}
	if len(panels) == 0 {
		return nil
	}
	img := vgimg.New(vg.Length(len(panels))*6*vg.Inch, 4*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Inch / 4}
	canvases := plot.Align([][]*plot.Plot{panels}, tiles, dc)
	for i, p := range panels {
		p.Draw(canvases[0][i])
	}
	return writePNG(path, img)
}

// writePNG writes the canvas img to path as PNG.
func writePNG(path string, img *vgimg.Canvas) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// startBuild starts a server of build ("stock" or "mtxdb", the patched build in
// bin) on a fresh database of backend ("sqlite" files, or a new PostgreSQL
// database named with prefix on the server pg) and returns it with the
// database's URL ("" for SQLite).
func startBuild(t *testing.T, bin, pg, backend, build, prefix string, env []string) (*server, string) {
	dbURL := ""
	if backend == "postgres" {
		dbURL = pgDatabase(t, pg, prefix+build)
	}
	b := bin
	if build == "stock" {
		b = filepath.Join(bin, "stock")
	}
	s := newServer(t, build, b, dbURL, env)
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	return s, dbURL
}
