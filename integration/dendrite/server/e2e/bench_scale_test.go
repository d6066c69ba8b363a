package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"
)

// scaleRun is one run of the room-size workload on one (database, build).
type scaleRun struct {
	Database       string  `json:"database"`
	Build          string  `json:"build"`
	Members        int     `json:"members"`
	Run            int     `json:"run"`
	StateChanges   int     `json:"state_changes"`
	Requests       int     `json:"requests"`
	Seconds        float64 `json:"seconds"`
	RequestsPerS   float64 `json:"requests_per_s"`
	StateP50Ms     float64 `json:"state_write_p50_ms"`
	StateP99Ms     float64 `json:"state_write_p99_ms"`
	StateBytes     int64   `json:"state_bytes"`
	BytesPerChange float64 `json:"state_bytes_per_change"`
	EventJSON      int64   `json:"event_json_bytes"`
	StateOverJSON  float64 `json:"state_over_event_json"`
	PeakRSSBytes   int64   `json:"server_peak_rss_bytes"`
	Load           string  `json:"load"` // /proc/loadavg's three averages before the run
}

// scaleWorkloadText says what scaleWorkload does, for the published page.
const scaleWorkloadText = "N members register (bcrypt cost 4) and join one public room in batches of 10 concurrent joins, each batch's members sending a message; " +
	"alice changes the topic after every 10th join and adds a user to the power levels after every 100th; then N/2 changes by random members: " +
	"a display name or an avatar set in their member event, or a leave (1 in 10) and later a join again, each followed by a message"

// scaleWorkload runs the room-size workload with members members on s and returns
// the state changes' latencies, the request count and the wall time.
func scaleWorkload(t *testing.T, s *server, members int, seed uint64) (lat []time.Duration, requests int, secs float64) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, seed+1))
	var mu sync.Mutex
	count := func(n int) { mu.Lock(); requests += n; mu.Unlock() }
	timed := func(what string, f func() error) {
		t0 := time.Now()
		if err := f(); err != nil {
			t.Errorf("%s: %v", what, err)
			return
		}
		d := time.Since(t0)
		mu.Lock()
		lat, requests = append(lat, d), requests+1
		mu.Unlock()
	}
	reg := func(name string) *mautrix.Client {
		c := client(t, s)
		r := m(c.RegisterDummy(ctx, &mautrix.ReqRegister[any]{Username: name, Password: name + "-password-1"})).or(t, "register "+name)
		c.SetCredentials(r.UserID, r.AccessToken)
		count(1)
		return c
	}
	start := time.Now()
	alice := reg("alice")
	room := m(alice.CreateRoom(ctx, &mautrix.ReqCreateRoom{Preset: "public_chat", Name: "scale", RoomVersion: "10"})).or(t, "create room").RoomID
	count(1)
	var pl map[string]any
	check(t, "power levels", alice.StateEvent(ctx, room, event.StatePowerLevels, "", &pl))
	count(1)
	clients := make([]*mautrix.Client, members)
	const batch = 10
	for b0 := 0; b0 < members; b0 += batch {
		var wg sync.WaitGroup
		for i := b0; i < min(b0+batch, members); i++ {
			wg.Go(func() {
				c := reg(fmt.Sprintf("m%05d", i))
				clients[i] = c
				timed("join", func() error { _, err := c.JoinRoomByID(ctx, room); return err })
				_, err := c.SendText(ctx, room, fmt.Sprintf("hello from %d", i))
				check(t, "message", err)
				count(1)
			})
		}
		wg.Wait()
		for j := b0 + 1; j <= min(b0+batch, members); j++ {
			if j%10 == 0 {
				timed("topic", func() error {
					_, err := alice.SendStateEvent(ctx, room, event.StateTopic, "", map[string]any{"topic": fmt.Sprintf("after %d joins", j)})
					return err
				})
			}
			if j%100 == 0 {
				users, _ := pl["users"].(map[string]any)
				users[clients[j-1].UserID.String()] = 10
				timed("power levels", func() error { _, err := alice.SendStateEvent(ctx, room, event.StatePowerLevels, "", pl); return err })
			}
		}
	}
	left := map[int]bool{}
	for n := range members / 2 {
		i := rng.IntN(members)
		c := clients[i]
		me := c.UserID.String()
		switch r := rng.IntN(10); {
		case left[i]:
			timed("rejoin", func() error { _, err := c.JoinRoomByID(ctx, room); return err })
			delete(left, i)
		case r == 0:
			timed("leave", func() error { _, err := c.LeaveRoom(ctx, room); return err })
			left[i] = true
			continue
		case r < 6:
			timed("display name", func() error {
				_, err := c.SendStateEvent(ctx, room, event.StateMember, me, map[string]any{"membership": "join", "displayname": fmt.Sprintf("member %d (%d)", i, n)})
				return err
			})
		default:
			timed("avatar", func() error {
				_, err := c.SendStateEvent(ctx, room, event.StateMember, me, map[string]any{"membership": "join", "avatar_url": fmt.Sprintf("mxc://localhost/a%d-%d", i, n)})
				return err
			})
		}
		_, err := c.SendText(ctx, room, fmt.Sprintf("change %d", n))
		check(t, "message", err)
		count(1)
	}
	last := m(alice.SendText(ctx, room, "end of workload")).or(t, "last message").EventID
	count(1)
	settle(t, &world{alice: alice, rooms: []id.RoomID{room}, last: []id.EventID{last}})
	return lat, requests, time.Since(start).Seconds()
}

// peakRSS is the server process's peak resident set (VmHWM), in bytes.
func peakRSS(t *testing.T, s *server) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb * 1024
		}
	}
	t.Fatal("no VmHWM in /proc status")
	return 0
}

// TestBenchDendriteScale is make bench-dendrite-scale: the room-size workload
// (scaleWorkload) for each size of MTXDB_BENCH_MEMBERS (comma-separated; 100,1000,10000),
// MTXDB_BENCH_RUNS times (3) on stock and mtxdb Dendrite, SQLite and PostgreSQL,
// runs interleaved (for each run and size: sqlite stock, sqlite mtxdb, postgres
// stock, postgres mtxdb); writes dendrite-scale.{json,md,png} (medians per cell)
// to MTXDB_BENCH_OUT.
func TestBenchDendriteScale(t *testing.T) {
	bin, out, pg := os.Getenv("MTXDB_DENDRITE_BIN"), os.Getenv("MTXDB_BENCH_OUT"), os.Getenv("MTXDB_PG_URL")
	if bin == "" || out == "" || pg == "" {
		t.Skip("MTXDB_DENDRITE_BIN, MTXDB_BENCH_OUT and MTXDB_PG_URL not all set: make bench-dendrite-scale sets them")
	}
	sizes := []int{100, 1000, 10000}
	if v := os.Getenv("MTXDB_BENCH_MEMBERS"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 10 {
				t.Fatalf("MTXDB_BENCH_MEMBERS=%q: want sizes of at least 10", v)
			}
			sizes = append(sizes, n)
		}
	}
	runs := envCount(t, "MTXDB_BENCH_RUNS", 3, 1)
	var all []scaleRun
	for run := range runs {
		for _, members := range sizes {
			for _, backend := range []string{"sqlite", "postgres"} {
				for _, build := range []string{"stock", "mtxdb"} {
					all = append(all, scaleCell(t, bin, pg, backend, build, members, run))
				}
			}
		}
	}
	writeScale(t, out, all)
}

// scaleCell runs the workload once on a fresh server and database and measures it.
func scaleCell(t *testing.T, bin, pg, backend, build string, members, run int) scaleRun {
	s, dbURL := startBuild(t, bin, pg, backend, build, "scale_", nil)
	load, _ := os.ReadFile("/proc/loadavg")
	lat, reqs, secs := scaleWorkload(t, s, members, uint64(run*1_000_003+members))
	r := scaleRun{Database: backend, Build: build, Members: members, Run: run + 1, StateChanges: len(lat), Requests: reqs,
		Seconds: secs, RequestsPerS: float64(reqs) / secs, StateP50Ms: percentile(lat, 0.5), StateP99Ms: percentile(lat, 0.99),
		PeakRSSBytes: peakRSS(t, s), Load: strings.Join(strings.Fields(string(load))[:3], " ")}
	s.stop()
	var sqlBytes int64
	if backend == "sqlite" {
		sqlBytes, r.EventJSON = sqliteTableBytes(t, filepath.Join(s.dir, "dendrite_roomserver.db"))
	} else {
		sqlBytes, r.EventJSON = pgTableBytes(t, dbURL)
	}
	r.StateBytes = sqlBytes
	if build == "mtxdb" {
		if backend == "postgres" {
			r.StateBytes += pgStoreBytes(t, dbURL)
		} else {
			r.StateBytes += storeDirBytes(t, filepath.Join(s.dir, "dendrite_roomserver.db.mtxdb-state"))
		}
	}
	r.BytesPerChange = float64(r.StateBytes) / float64(max(r.StateChanges, 1))
	if r.EventJSON > 0 {
		r.StateOverJSON = float64(r.StateBytes) / float64(r.EventJSON)
	}
	t.Logf("%+v", r)
	return r
}

// scaleCellMedian is the medians of one cell's runs.
type scaleCellMedian struct {
	Database, Build                      string
	Members, Runs                        int
	StateBytes, BytesPerChange, OverJSON float64
	P50, P99, RPS, RSSMiB                float64
}

func scaleMedians(all []scaleRun) []scaleCellMedian {
	type cellKey struct {
		db, build string
		members   int
	}
	var order []cellKey
	by := map[cellKey][]scaleRun{}
	for _, r := range all {
		k := cellKey{r.Database, r.Build, r.Members}
		if by[k] == nil {
			order = append(order, k)
		}
		by[k] = append(by[k], r)
	}
	slices.SortStableFunc(order, func(a, b cellKey) int { return a.members - b.members })
	med := func(rs []scaleRun, f func(scaleRun) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	var out []scaleCellMedian
	for _, k := range order {
		rs := by[k]
		out = append(out, scaleCellMedian{Database: k.db, Build: k.build, Members: k.members, Runs: len(rs),
			StateBytes:     med(rs, func(r scaleRun) float64 { return float64(r.StateBytes) }),
			BytesPerChange: med(rs, func(r scaleRun) float64 { return r.BytesPerChange }),
			OverJSON:       med(rs, func(r scaleRun) float64 { return r.StateOverJSON }),
			P50:            med(rs, func(r scaleRun) float64 { return r.StateP50Ms }),
			P99:            med(rs, func(r scaleRun) float64 { return r.StateP99Ms }),
			RPS:            med(rs, func(r scaleRun) float64 { return r.RequestsPerS }),
			RSSMiB:         med(rs, func(r scaleRun) float64 { return float64(r.PeakRSSBytes) / (1 << 20) })})
	}
	return out
}

// writeScale writes dendrite-scale.json (every run), .md (the medians, stock and
// mtxdb side by side) and .png (state bytes and state-write p99 against room
// size, log axes) to out.
func writeScale(t *testing.T, out string, all []scaleRun) {
	host, _ := os.Hostname()
	doc := map[string]any{"host": host, "date": time.Now().UTC().Format(time.RFC3339), "workload": scaleWorkloadText, "runs": all}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	check(t, "write json", os.WriteFile(filepath.Join(out, "dendrite-scale.json"), append(b, '\n'), 0o644))
	meds := scaleMedians(all)
	var md strings.Builder
	fmt.Fprintf(&md, "# Dendrite v0.13.8 by room size: stock SQL state tables against mtxdb (make bench-dendrite-scale)\n\n")
	fmt.Fprintf(&md, "%s, host %s. Workload: %s. Medians over the runs of each cell; the load before each run is in dendrite-scale.json. "+
		"State bytes as in dendrite.md (stock: the two SQL state tables; mtxdb: its store, shard files without the zeros written ahead of their frames, plus those tables); per change: state bytes over the state changes the workload made; "+
		"state / event JSON: the ratio of dendrite #2464 (11 GB of state blocks beside 914 MB of event JSON).\n\n", doc["date"], host, scaleWorkloadText)
	md.WriteString("| members | database | build | runs | state bytes | B / state change | state / event JSON | x stock | state-write p50 ms | p99 ms | requests/s | server peak RSS MiB |\n")
	md.WriteString("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	stock := map[string]float64{}
	for _, c := range meds {
		if c.Build == "stock" {
			stock[fmt.Sprint(c.Members, c.Database)] = c.StateBytes
		}
	}
	for _, c := range meds {
		x := "-"
		if s := stock[fmt.Sprint(c.Members, c.Database)]; s > 0 {
			x = fmt.Sprintf("%.2f", c.StateBytes/s)
		}
		fmt.Fprintf(&md, "| %d | %s | %s | %d | %.0f | %.0f | %.2f | %s | %.1f | %.1f | %.1f | %.0f |\n",
			c.Members, c.Database, c.Build, c.Runs, c.StateBytes, c.BytesPerChange, c.OverJSON, x, c.P50, c.P99, c.RPS, c.RSSMiB)
	}
	check(t, "write md", os.WriteFile(filepath.Join(out, "dendrite-scale.md"), []byte(md.String()), 0o644))
	check(t, "write png", writeScalePlot(filepath.Join(out, "dendrite-scale.png"), meds))
}

// writeScalePlot draws state bytes and state-write p99 against members, one line
// per (database, build), both axes logarithmic.
func writeScalePlot(path string, meds []scaleCellMedian) error {
	panel := func(title, ylabel string, y func(scaleCellMedian) float64) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, "room members", ylabel
		p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
		p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
		p.Add(plotter.NewGrid())
		lines := map[string]plotter.XYs{}
		var names []string
		for _, c := range meds {
			name := c.Database + " " + c.Build
			if lines[name] == nil {
				names = append(names, name)
			}
			lines[name] = append(lines[name], plotter.XY{X: float64(c.Members), Y: max(y(c), 1e-3)})
		}
		for i, name := range names {
			l, pts, err := plotter.NewLinePoints(lines[name])
			if err != nil {
				return nil, err
			}
			l.Color, pts.Color = plotutil.Color(i), plotutil.Color(i)
			l.Dashes = plotutil.Dashes(i)
			pts.Shape = plotutil.Shape(i)
			p.Add(l, pts)
			p.Legend.Add(name, l, pts)
		}
		p.Legend.Top, p.Legend.Left = true, true
		return p, nil
	}
	pb, err := panel("State bytes by room size", "state bytes", func(c scaleCellMedian) float64 { return c.StateBytes })
	if err != nil {
		return err
	}
	pl, err := panel("State-write latency p99 by room size", "p99 (ms)", func(c scaleCellMedian) float64 { return c.P99 })
	if err != nil {
		return err
	}
	img := vgimg.New(12*vg.Inch, 4.5*vg.Inch)
	dc := draw.New(img)
	canvases := plot.Align([][]*plot.Plot{{pb, pl}}, draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Inch / 4}, dc)
	pb.Draw(canvases[0][0])
	pl.Draw(canvases[0][1])
	return writePNG(path, img)
}

// storeDirBytes is dirBytes of a packstore directory with each shard file's
// trailing zeros left out: the active shard is written up to 1 MiB ahead of its
// frames (packstore's preallocation), which Close truncates, and a server
// stopped by SIGTERM leaves it in place.
func storeDirBytes(t *testing.T, dir string) int64 {
	n := dirBytes(t, dir)
	shards, err := filepath.Glob(filepath.Join(dir, "shard-*.mtdb"))
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range shards {
		n -= trailingZeros(t, sh)
	}
	return n
}

// trailingZeros counts the zero bytes that end file path, reading only its last
// MiB (the most packstore writes ahead of its frames) and one byte more.
func trailingZeros(t *testing.T, path string) int64 {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	tail := min(fi.Size(), 1<<20+1)
	b := make([]byte, tail)
	if _, err := f.ReadAt(b, fi.Size()-tail); err != nil {
		t.Fatal(err)
	}
	end := len(b)
	for end > 0 && b[end-1] == 0 {
		end--
	}
	return int64(len(b) - end)
}
