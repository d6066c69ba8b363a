package e2e

// The fork part of make bench-dendrite: two servers of one build, A and B, federate
// over TLS through partitionProxy in a room of MEMBERS joined members (bob on B, the
// others on A). Each fork: A is cut from B, alice sets the topic on A and bob sets
// his display name on B (his m.room.member event), the cut heals, each server gets
// the other's branch, and alice sends a message on A whose prev_events name both
// branches: the merge, whose state before it B resolves when it arrives. What is
// timed is the merge on B: from the moment B's proxy front has the headers of the
// federation transaction that carries it (and from alice's send) until B's
// /messages first shows it. After each merge, /state of A and B must be equal and
// hold alice's topic and bob's member event (state resolution v2: each conflicted
// key has two events of one sender under the same power levels, and the mainline
// order puts the fork's, the later, last).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/id"
)

// forkPoll is the pause between two /messages requests while waiting for the merge;
// a merge is seen at the end of the first request that returns it, so the timing's
// resolution is forkPoll plus one request (forkRun.PollMs gives the mean request).
const forkPoll = 10 * time.Millisecond

// forkMerge is one merged fork.
type forkMerge struct {
	// Merge: B's front got a transaction from A with a PDU whose prev_events name
	// both branches; the latencies below are 0 when it did not.
	Merge           bool    `json:"merge"`
	RecvToVisibleMs float64 `json:"recv_to_visible_ms"`
	SendToVisibleMs float64 `json:"send_to_visible_ms"`
	// Agreed: A's and B's /state equal after the merge; AsExpected: and they hold the
	// fork's topic (A) and bob's member event (B).
	Agreed     bool   `json:"agreed"`
	AsExpected bool   `json:"resolved_as_expected"`
	Load       string `json:"load"` // /proc/loadavg's three averages when the merge was sent
}

// forkRun is the fork part on one (database, build).
type forkRun struct {
	Database     string      `json:"database"`
	Build        string      `json:"build"`
	Members      int         `json:"members"`
	Forks        int         `json:"forks"`
	Merges       int         `json:"merges"`
	Agreed       int         `json:"agreed"`
	AsExpected   int         `json:"resolved_as_expected"`
	RecvP50Ms    float64     `json:"recv_to_visible_p50_ms"`
	RecvP99Ms    float64     `json:"recv_to_visible_p99_ms"`
	SendP50Ms    float64     `json:"send_to_visible_p50_ms"`
	SendP99Ms    float64     `json:"send_to_visible_p99_ms"`
	PollMs       float64     `json:"poll_request_mean_ms"`
	SetupSeconds float64     `json:"setup_seconds"` // registering, joining and bob's federated join
	Seconds      float64     `json:"fork_seconds"`  // the forks
	Load1Min     float64     `json:"load_1min_min"`
	Load1Max     float64     `json:"load_1min_max"`
	Runs         []forkMerge `json:"runs"`
}

// forkWatch finds, among the transactions A sends B, the first whose PDUs include
// one that names every event of want in its prev_events, and when B's front got it.
type forkWatch struct {
	mu           sync.Mutex // guards every field
	origin, dest string     // A's and B's server names
	want         []string
	at           time.Time
}

func (w *forkWatch) observe(origin, dest string, r *http.Request) {
	at := time.Now()
	if r.Method != http.MethodPut || !strings.HasPrefix(r.URL.Path, "/_matrix/federation/v1/send/") {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if origin != w.origin || dest != w.dest || len(w.want) == 0 || !w.at.IsZero() {
		return
	}
	body, err := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return
	}
	var txn struct {
		PDUs []struct {
			PrevEvents []string `json:"prev_events"`
		} `json:"pdus"`
	}
	if json.Unmarshal(body, &txn) != nil {
		return
	}
	for _, pdu := range txn.PDUs {
		all := true
		for _, ev := range w.want {
			all = all && containsString(pdu.PrevEvents, ev)
		}
		if all {
			w.at = at
			return
		}
	}
}

// arm starts watching for a PDU naming want; take returns when it came (zero if not).
func (w *forkWatch) arm(want []string) {
	w.mu.Lock()
	w.want, w.at = want, time.Time{}
	w.mu.Unlock()
}

func (w *forkWatch) take() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	at := w.at
	w.want, w.at = nil, time.Time{}
	return at
}

// startForkPair starts A and B of one build (dbURLs "" = SQLite) behind a
// partitionProxy that feeds a forkWatch.
func startForkPair(t *testing.T, build, bin, dir string, dbURLs [2]string) (*partitionProxy, [2]*fedNode, *forkWatch) {
	ca := newTestCA(t, mkdir(t, dir))
	p := newPartitionProxy(ca)
	w := &forkWatch{}
	p.observe = w.observe
	t.Cleanup(p.close)
	nodes := startFedNodes(t, p, ca, build, bin, dir, "warn", []string{"A", "B"}, dbURLs[:])
	w.origin, w.dest = nodes[0].name, nodes[1].name
	return p, [2]*fedNode{nodes[0], nodes[1]}, w
}

// forkRoom registers alice and members-2 users on A and bob on B, four requests at a
// time; alice creates a public room of version 10, the users of A join it, then bob
// joins over federation; it returns when both servers list every member.
func forkRoom(t *testing.T, nodes [2]*fedNode, members int) (alice, bob *mautrix.Client, room id.RoomID) {
	ctx := context.Background()
	reg := func(s *server, name string) *mautrix.Client {
		c := client(t, s)
		r := m(c.RegisterDummy(ctx, &mautrix.ReqRegister[any]{Username: name, Password: name + "-password-1"})).or(t, "register "+name)
		c.SetCredentials(r.UserID, r.AccessToken)
		return c
	}
	alice, bob = reg(nodes[0].server, "alice"), reg(nodes[1].server, "bob")
	room = m(alice.CreateRoom(ctx, &mautrix.ReqCreateRoom{Preset: "public_chat", Name: "fork bench", Topic: "topic 0", RoomVersion: "10"})).or(t, "create room").RoomID
	work := make(chan int)
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				c := client(t, nodes[0].server)
				name := fmt.Sprintf("member%04d", i)
				r, err := c.RegisterDummy(ctx, &mautrix.ReqRegister[any]{Username: name, Password: name + "-password-1"})
				if err == nil {
					c.SetCredentials(r.UserID, r.AccessToken)
					_, err = c.JoinRoomByID(ctx, room)
				}
				if err != nil {
					errs <- fmt.Errorf("%s: %w", name, err)
					return
				}
			}
		}()
	}
	for i := range members - 2 {
		select {
		case work <- i:
		case err := <-errs:
			close(work)
			wg.Wait()
			t.Fatalf("register and join: %v", err)
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("register and join: %v", err)
	default:
	}
	m(bob.JoinRoomByID(ctx, room)).or(t, "bob joins over federation")
	deadline := time.Now().Add(10 * time.Minute)
	for _, c := range []*mautrix.Client{alice, bob} {
		for {
			jm, err := c.JoinedMembers(ctx, room)
			if err == nil && len(jm.Joined) == members {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s does not list %d joined members within 10 min (%v)", c.UserID, members, err)
			}
			time.Sleep(time.Second)
		}
	}
	return alice, bob, room
}

// seen reports whether ev is among the newest events of c's /messages; d is how long
// the request took.
func seen(ctx context.Context, c *mautrix.Client, room id.RoomID, ev string) (ok bool, d time.Duration, err error) {
	t0 := time.Now()
	msgs, err := c.Messages(ctx, room, "", "", mautrix.DirectionBackward, nil, 3)
	d = time.Since(t0)
	if err != nil {
		return false, d, err
	}
	for _, e := range msgs.Chunk {
		if e.ID.String() == ev {
			return true, d, nil
		}
	}
	return false, d, nil
}

// waitSeen polls until ev is among the newest events of c's /messages.
func waitSeen(ctx context.Context, c *mautrix.Client, room id.RoomID, ev string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		ok, _, err := seen(ctx, c, room, ev)
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s's /messages does not show %s within %s (%v)", c.UserID, ev, limit, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// mergeFork makes fork i and its merge, and times the merge on B.
func mergeFork(t *testing.T, p *partitionProxy, nodes [2]*fedNode, w *forkWatch, alice, bob *mautrix.Client, room id.RoomID, i int) (fm forkMerge, pollD []time.Duration) {
	ctx := context.Background()
	p.partition([]string{nodes[0].name}, []string{nodes[1].name})
	topic, err := sendState(ctx, alice, room, "m.room.topic", "", map[string]any{"topic": fmt.Sprintf("topic %d", i+1)})
	if err == nil {
		var member string
		member, err = sendState(ctx, bob, room, "m.room.member", bob.UserID.String(), map[string]any{"membership": "join", "displayname": fmt.Sprintf("bob %d", i+1)})
		p.heal()
		if err == nil {
			err = waitSeen(ctx, bob, room, topic, 5*time.Minute)
		}
		if err == nil {
			err = waitSeen(ctx, alice, room, member, 5*time.Minute)
		}
		if err == nil {
			fm, pollD, err = timeMerge(ctx, w, alice, bob, room, topic, member)
		}
	}
	p.heal()
	if err != nil {
		t.Fatalf("fork %d: %v", i+1, err)
	}
	return fm, pollD
}

// timeMerge sends the merge on A and polls B's /messages for it, then compares A's
// and B's /state.
func timeMerge(ctx context.Context, w *forkWatch, alice, bob *mautrix.Client, room id.RoomID, topic, member string) (fm forkMerge, pollD []time.Duration, err error) {
	fm.Load = loadavg()
	w.arm([]string{topic, member})
	sent := time.Now()
	resp, err := alice.SendText(ctx, room, "merge")
	if err != nil {
		return fm, nil, fmt.Errorf("the merge: %w", err)
	}
	merge := resp.EventID.String()
	deadline := time.Now().Add(5 * time.Minute)
	var visible time.Time
	for {
		ok, d, perr := seen(ctx, bob, room, merge)
		pollD = append(pollD, d)
		if ok {
			visible = time.Now()
			break
		}
		if time.Now().After(deadline) {
			return fm, pollD, fmt.Errorf("B's /messages does not show the merge %s within 5 min (%v)", merge, perr)
		}
		time.Sleep(forkPoll)
	}
	if recv := w.take(); !recv.IsZero() {
		fm.Merge = true
		fm.RecvToVisibleMs = float64(visible.Sub(recv).Microseconds()) / 1000
		fm.SendToVisibleMs = float64(visible.Sub(sent).Microseconds()) / 1000
	}
	// The state after the merge: equal on both servers, and as the spec resolves it.
	deadline = time.Now().Add(30 * time.Second)
	for {
		a, errA := flatState(ctx, alice, room)
		b, errB := flatState(ctx, bob, room)
		if errA == nil && errB == nil {
			fm.Agreed = sameState(a, b)
			fm.AsExpected = fm.Agreed && a["m.room.topic\x00"] == topic && a["m.room.member\x00"+bob.UserID.String()] == member
		}
		if fm.Agreed || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	return fm, pollD, nil
}

// forkBench runs the fork part on one (database, build): a fresh pair, the room,
// forks merges.
func forkBench(t *testing.T, database, build, bin, dir string, dbURLs [2]string, members, forks int) forkRun {
	r := forkRun{Database: database, Build: build, Members: members, Forks: forks, Load1Min: 1e9}
	p, nodes, w := startForkPair(t, build, bin, dir, dbURLs)
	start := time.Now()
	alice, bob, room := forkRoom(t, nodes, members)
	r.SetupSeconds = time.Since(start).Seconds()
	t.Logf("%s %s: room %s with %d members on A and B in %.0f s", database, build, room, members, r.SetupSeconds)
	start = time.Now()
	var recv, send, polls []time.Duration
	for i := range forks {
		fm, pollD := mergeFork(t, p, nodes, w, alice, bob, room, i)
		polls = append(polls, pollD...)
		r.Runs = append(r.Runs, fm)
		if fm.Merge {
			r.Merges++
			recv = append(recv, time.Duration(fm.RecvToVisibleMs*float64(time.Millisecond)))
			send = append(send, time.Duration(fm.SendToVisibleMs*float64(time.Millisecond)))
		}
		if fm.Agreed {
			r.Agreed++
		}
		if fm.AsExpected {
			r.AsExpected++
		}
		var l1 float64
		fmt.Sscan(fm.Load, &l1)
		r.Load1Min, r.Load1Max = min(r.Load1Min, l1), max(r.Load1Max, l1)
		t.Logf("%s %s fork %d: merge %v, received->visible %.1f ms, sent->visible %.1f ms, agreed %v, as expected %v, load %s",
			database, build, i+1, fm.Merge, fm.RecvToVisibleMs, fm.SendToVisibleMs, fm.Agreed, fm.AsExpected, fm.Load)
	}
	r.Seconds = time.Since(start).Seconds()
	for _, n := range nodes {
		n.stop()
	}
	if len(recv) > 0 {
		r.RecvP50Ms, r.RecvP99Ms = percentile(recv, 0.5), percentile(recv, 0.99)
		r.SendP50Ms, r.SendP99Ms = percentile(send, 0.5), percentile(send, 0.99)
	}
	var sum time.Duration
	for _, d := range polls {
		sum += d
	}
	if len(polls) > 0 {
		r.PollMs = float64(sum.Microseconds()) / 1000 / float64(len(polls))
	}
	return r
}

// forkBenches runs the fork part for every database of dbs and both builds, stock
// first; PostgreSQL servers get a database each on the server of pg.
func forkBenches(t *testing.T, bin, pg string, dbs []string, members, forks int) []forkRun {
	var runs []forkRun
	for _, database := range dbs {
		for _, build := range []string{"stock", "mtxdb"} {
			b := bin
			if build == "stock" {
				b = filepath.Join(bin, "stock")
			}
			var urls [2]string
			switch database {
			case "sqlite":
			case "postgres":
				urls = [2]string{pgDatabase(t, pg, "fork_"+build+"_a"), pgDatabase(t, pg, "fork_"+build+"_b")}
			default:
				t.Fatalf("MTXDB_BENCH_FORK_DBS: unknown database %q (sqlite, postgres)", database)
			}
			r := forkBench(t, database, build, b, filepath.Join(t.TempDir(), build), urls, members, forks)
			t.Logf("%+v", r)
			if build == "mtxdb" && (r.Merges != forks || r.AsExpected != forks) {
				t.Errorf("%s mtxdb: %d of %d forks merged, %d of them resolved alike on A and B with the fork's topic and member event",
					database, r.Merges, forks, r.AsExpected)
			}
			runs = append(runs, r)
		}
	}
	return runs
}

// uptime is uptime(1)'s line, or /proc/loadavg's averages without it.
func uptime() string {
	if out, err := exec.Command("uptime").Output(); err == nil {
		return strings.TrimSpace(string(out))
	}
	return "load average: " + loadavg()
}

// writeForkSection renders the fork runs for dendrite.md.
func writeForkSection(b *strings.Builder, runs []forkRun, date, up0, up1 string) {
	if len(runs) == 0 {
		return
	}
	fmt.Fprintf(b, "%s: a fork in a room of %d members\n\n", forkHeading, runs[0].Members)
	fmt.Fprintf(b, "%s. Two servers of one build, A and B, on 127.0.0.1 federating over verified TLS through the partition test's proxy; bob on B, the other %d members on A. Per fork: A cut from B, alice sets the topic on A and bob his display name on B, the cut healed, each branch delivered to the other server, then alice sends a message on A whose prev_events name both branches (the merge; B resolves the state before it on receipt). Timed on B: from the moment B's proxy front has the headers of the transaction carrying the merge (received) and from alice's send (sent) until B's /messages first shows it, polled every %d ms plus a request (mean request in the table; that is the resolution). After each merge A's and B's /state are compared: equal, with the fork's topic and bob's member event. %d forks per row, stock then mtxdb per database, one run each. `uptime` before: %s; after: %s.\n\n",
		date, runs[0].Members-1, forkPoll.Milliseconds(), runs[0].Forks, up0, up1)
	fmt.Fprintf(b, "| database | build | merges | states equal, as the spec | received->visible p50 ms | p99 ms | sent->visible p50 ms | p99 ms | poll request ms | load (1 min) during forks | setup s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n")
	stock := map[string]forkRun{}
	for _, r := range runs {
		if r.Build == "stock" {
			stock[r.Database] = r
		}
		fmt.Fprintf(b, "| %s | %s | %d/%d | %d/%d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f-%.1f | %.0f |\n", r.Database, r.Build, r.Merges, r.Forks,
			r.AsExpected, r.Forks, r.RecvP50Ms, r.RecvP99Ms, r.SendP50Ms, r.SendP99Ms, r.PollMs, r.Load1Min, r.Load1Max, r.SetupSeconds)
	}
	fmt.Fprintf(b, "\nMedians side by side (mtxdb / stock):\n\n| database | received->visible stock ms | mtxdb ms | mtxdb/stock | sent->visible stock ms | mtxdb ms | mtxdb/stock |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range runs {
		s, ok := stock[r.Database]
		if r.Build != "mtxdb" || !ok || s.RecvP50Ms == 0 || s.SendP50Ms == 0 {
			continue
		}
		fmt.Fprintf(b, "| %s | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f |\n", r.Database, s.RecvP50Ms, r.RecvP50Ms, r.RecvP50Ms/s.RecvP50Ms,
			s.SendP50Ms, r.SendP50Ms, r.SendP50Ms/s.SendP50Ms)
	}
}
