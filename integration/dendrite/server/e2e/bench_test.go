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
	"strconv"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
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
// SQLite and PostgreSQL, one run each; writes dendrite.{json,md,png} to
// MTXDB_BENCH_OUT.
func TestBenchDendrite(t *testing.T) {
	bin, out, pg := os.Getenv("MTXDB_DENDRITE_BIN"), os.Getenv("MTXDB_BENCH_OUT"), os.Getenv("MTXDB_PG_URL")
	if bin == "" || out == "" || pg == "" {
		t.Skip("MTXDB_DENDRITE_BIN, MTXDB_BENCH_OUT and MTXDB_PG_URL not all set: make bench-dendrite sets them")
	}
	users := 100
	if v := os.Getenv("MTXDB_BENCH_USERS"); v != "" {
		users, _ = strconv.Atoi(v)
	}
	load0, _ := os.ReadFile("/proc/loadavg")
	var runs []benchRun
	for _, backend := range []string{"sqlite", "postgres"} {
		for _, build := range []string{"stock", "mtxdb"} {
			dbURL := ""
			if backend == "postgres" {
				dbURL = pgDatabase(t, pg, "bench_"+build)
			}
			b := bin
			if build == "stock" {
				b = filepath.Join(bin, "stock")
			}
			root := t.TempDir()
			env := []string{"MTXDB_DENDRITE_STATE_BASE=" + filepath.Join(root, "mtxdb-state")}
			s := newServer(t, build, b, dbURL, env)
			if err := s.start(); err != nil {
				t.Fatal(err)
			}
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
	writeBench(t, out, runs, strings.Join(strings.Fields(string(load0))[:3], " "), strings.Join(strings.Fields(string(load1))[:3], " "))
}

func writeBench(t *testing.T, out string, runs []benchRun, load0, load1 string) {
	host, _ := os.Hostname()
	meta := map[string]any{"runs": runs, "load_before": load0, "load_after": load1, "host": host,
		"date": time.Now().UTC().Format(time.RFC3339), "workload": "users register and join one public room; each sets a state event of its own twice and sends two messages; alice changes the topic after every tenth join"}
	js, _ := json.MarshalIndent(meta, "", "  ")
	if err := os.WriteFile(filepath.Join(out, "dendrite.json"), append(js, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Dendrite v0.13.8: stock SQL state tables against mtxdb (make bench-dendrite)\n\n")
	fmt.Fprintf(&b, "%s, one run per row, %d users (%s). Load average (1/5/15 min) %s before, %s after.\n\n", meta["date"], runs[0].Users, meta["workload"], load0, load1)
	fmt.Fprintf(&b, "State bytes: stock = the two SQL tables with their indexes (SQLite: a VACUUMed copy minus a VACUUMed copy without the two tables; PostgreSQL: pg_total_relation_size, dead tuples included, as a running server holds them); mtxdb = the store (SQLite: its directory; PostgreSQL: pg_total_relation_size of mtxdb_records in the same database) plus the same SQL measure (0 rows). Event JSON = SUM(LENGTH(event_json)) of roomserver_event_json, the anchor of dendrite #2464 (11 GB of state blocks beside 914 MB of event JSON: 12x).\n\n")
	fmt.Fprintf(&b, "| database | build | state bytes | state / event JSON | x stock | state-write p50 ms | p99 ms | requests/s | SQL snapshot/block rows |\n|---|---|---:|---:|---:|---:|---:|---:|---|\n")
	stock := map[string]int64{}
	for _, r := range runs {
		if r.Build == "stock" {
			stock[r.Database] = r.StateBytes
		}
	}
	for _, r := range runs {
		fmt.Fprintf(&b, "| %s | %s | %d | %.2f | %.2f | %.1f | %.1f | %.1f | %d/%d |\n", r.Database, r.Build, r.StateBytes,
			float64(r.StateBytes)/float64(r.EventJSON), float64(r.StateBytes)/float64(stock[r.Database]), r.StateP50Ms, r.StateP99Ms, r.RequestsPerS, r.SQLSnapshots, r.SQLBlocks)
	}
	if err := os.WriteFile(filepath.Join(out, "dendrite.md"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Dendrite state bytes, %d users", runs[0].Users)
	p.Y.Label.Text = "state bytes (KiB)"
	var names []string
	vals := plotter.Values{}
	for _, r := range runs {
		names = append(names, r.Database+"/"+r.Build)
		vals = append(vals, float64(r.StateBytes)/1024)
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(30))
	if err != nil {
		t.Fatal(err)
	}
	p.Add(bars)
	p.NominalX(names...)
	if err := p.Save(6*vg.Inch, 4*vg.Inch, filepath.Join(out, "dendrite.png")); err != nil {
		t.Fatal(err)
	}
	t.Log(b.String())
}
