package e2e

// TestFederationPartition: three Dendrite servers on loopback federate over TLS
// through partitionProxy; per scenario a fresh room of version 10 where everyone is
// joined, a cut between the servers, conflicting changes on both sides of it, the
// cut healed, messages from every server until their states agree, and the agreed
// state compared with mtxdb replay of the room's events exported from each server's
// roomserver database. Run on the patched build (asserted) and the stock build
// (reported only) by make test-dendrite-partition.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"
)

const (
	// roundPause is the wait after each round of messages before the states are read.
	roundPause = 3 * time.Second
	// agreeTimeout bounds the wait for all servers to agree after the heal: Dendrite
	// backs off 2^n s (x0.8-1.4) after the n-th failed transaction to a server.
	agreeTimeout = 6 * time.Minute
	// divergedRounds: rounds in which every event is stored on every server but their
	// states still differ, after which the servers are reported as diverged.
	divergedRounds = 6
	// stableRounds: consecutive rounds of agreement that count as converged.
	stableRounds = 2
	// cutHold is the least time a cut lasts, so that each side's federation queue has
	// failed several times and backs off (2, 4, 8 s, ...) when the cut heals.
	cutHold = 15 * time.Second
)

// fedNode is one server of the cluster: A, B or C.
type fedNode struct {
	*server
	label string
	name  string // federation server name: 127.0.0.1:PORT of its proxy front
}

// fedCluster is three servers of one build behind one partitionProxy, with their
// users: alice on A (room creator, power 100), bob on B (the moderator whose power
// the scenarios contest), carol, cleo and dave on C (carol is a target, dave joins
// during a cut). alice, bob and cleo are the servers' tickers: never the target of
// a change, they send the messages that merge the DAG and read /state.
type fedCluster struct {
	build   string
	proxy   *partitionProxy
	nodes   []*fedNode
	users   map[string]*mautrix.Client
	tickers []*mautrix.Client // one per node, in node order
}

func startCluster(t *testing.T, build, bin, dir string) *fedCluster {
	_ = os.RemoveAll(dir)
	ca := newTestCA(t, mkdir(t, dir))
	c := &fedCluster{build: build, proxy: newPartitionProxy(ca), users: map[string]*mautrix.Client{}}
	t.Cleanup(c.proxy.close)
	c.nodes = startFedNodes(t, c.proxy, ca, build, bin, dir, "info", []string{"A", "B", "C"}, nil)
	ctx := context.Background()
	for _, u := range []struct {
		name string
		node int
	}{{"alice", 0}, {"bob", 1}, {"carol", 2}, {"cleo", 2}, {"dave", 2}} {
		cl := client(t, c.nodes[u.node].server)
		r := m(cl.RegisterDummy(ctx, &mautrix.ReqRegister[any]{Username: u.name, Password: u.name + "-password-1"})).or(t, build+": register "+u.name)
		cl.SetCredentials(r.UserID, r.AccessToken)
		c.users[u.name] = cl
	}
	c.tickers = []*mautrix.Client{c.users["alice"], c.users["bob"], c.users["cleo"]}
	t.Logf("%s: servers A=%s B=%s C=%s (federation names: TLS fronts of the partition proxy)", build, c.nodes[0].name, c.nodes[1].name, c.nodes[2].name)
	return c
}

// mkdir creates dir and its parents and returns it.
func mkdir(t *testing.T, dir string) string {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startFedNodes configures one server of build per label in dir/LABEL, its
// federation name a front of p with a certificate from ca, on dbURLs[i] ("" or
// absent = SQLite), logging at level, and starts them all.
func startFedNodes(t *testing.T, p *partitionProxy, ca *testCA, build, bin, dir, level string, labels, dbURLs []string) []*fedNode {
	var nodes []*fedNode
	for i, label := range labels {
		name := p.reserve(t, label)
		sdir := mkdir(t, filepath.Join(dir, label))
		certFile, keyFile := filepath.Join(sdir, "server.crt"), filepath.Join(sdir, "server.key")
		pair := ca.issue(t, int64(i+2), certFile, keyFile)
		dbURL := ""
		if i < len(dbURLs) {
			dbURL = dbURLs[i]
		}
		s := configureServer(t, sdir, build+"-"+label, name, bin, dbURL, []string{"SSL_CERT_FILE=" + ca.file}, func(cfg string) string {
			cfg = strings.Replace(cfg, "enable_inbound: true", "enable_inbound: false", 1)
			cfg = strings.Replace(cfg, "enable_outbound: true", "enable_outbound: false", 1)
			return setLogLevel(cfg, level)
		})
		s.httpsPort, s.tlsCert, s.tlsKey = freePort(t), certFile, keyFile
		p.serve(name, s.httpsPort, pair)
		nodes = append(nodes, &fedNode{server: s, label: label, name: name})
	}
	for _, n := range nodes {
		if err := n.start(); err != nil {
			t.Fatal(err)
		}
	}
	return nodes
}

func (c *fedCluster) stop() {
	for _, n := range c.nodes {
		n.stop()
	}
}

// uid is the Matrix user ID of a user of the cluster.
func (c *fedCluster) uid(name string) string { return c.users[name].UserID.String() }

// who renders a user ID as name@label.
func (c *fedCluster) who(user string) string {
	for _, n := range c.nodes {
		if local, ok := strings.CutSuffix(user, ":"+n.name); ok {
			return strings.TrimPrefix(local, "@") + "@" + n.label
		}
	}
	return user
}

// states reads /state on every node, as the node's ticker: (type NUL state_key) -> event ID.
func (c *fedCluster) states(ctx context.Context, room id.RoomID) ([]map[string]string, error) {
	var out []map[string]string
	for i, tk := range c.tickers {
		flat, err := flatState(ctx, tk, room)
		if err != nil {
			return nil, fmt.Errorf("/state on %s: %w", c.nodes[i].label, err)
		}
		out = append(out, flat)
	}
	return out, nil
}

// flatState is /state as c's server reports it: (type NUL state_key) -> event ID.
func flatState(ctx context.Context, c *mautrix.Client, room id.RoomID) (map[string]string, error) {
	st, err := c.State(ctx, room)
	if err != nil {
		return nil, err
	}
	flat := map[string]string{}
	for typ, byKey := range st {
		for key, e := range byKey {
			flat[typ.Type+"\x00"+key] = e.ID.String()
		}
	}
	return flat, nil
}

// stored reports whether every node's roomserver holds every event of ids.
func (c *fedCluster) stored(ids []string, nodes []int) (bool, error) {
	for _, i := range nodes {
		got, err := storedEvents(c.nodes[i].server, ids)
		if err != nil {
			return false, fmt.Errorf("%s: %w", c.nodes[i].label, err)
		}
		if len(got) != len(ids) {
			return false, nil
		}
	}
	return true, nil
}

// logSizes is the size of every node's server.log.
func (c *fedCluster) logSizes() []int64 {
	var out []int64
	for _, n := range c.nodes {
		fi, err := os.Stat(filepath.Join(n.dir, "server.log"))
		if err != nil {
			out = append(out, 0)
			continue
		}
		out = append(out, fi.Size())
	}
	return out
}

// logCounts counts, in what every node logged since logSizes gave from, the gaps
// Dendrite filled with /get_missing_events and the events it stored soft-failed or
// rejected.
func (c *fedCluster) logCounts(from []int64) string {
	var out []string
	for i, n := range c.nodes {
		b, err := os.ReadFile(filepath.Join(n.dir, "server.log"))
		if err != nil || int64(len(b)) < from[i] {
			out = append(out, n.label+": log unreadable")
			continue
		}
		log := string(b[from[i]:])
		out = append(out, fmt.Sprintf("%s: /get_missing_events gap fills %d, soft-failed %d, rejected %d", n.label,
			strings.Count(log, "Gap filled by /get_missing_events"), strings.Count(log, "Stored soft-failed event"), strings.Count(log, "Stored rejected event")))
	}
	return strings.Join(out, "; ")
}

// snapshotResolutions counts, over every node's whole log, the states the patched
// build resolved from mtxdb snapshots and those it resolved from event lists after
// the snapshot path failed (roomserver/state in the patch).
func (c *fedCluster) snapshotResolutions() (fromSnapshots, fellBack int) {
	for _, n := range c.nodes {
		b, err := os.ReadFile(filepath.Join(n.dir, "server.log"))
		if err != nil {
			continue
		}
		fromSnapshots += strings.Count(string(b), "mtxdb: state resolved from snapshots")
		fellBack += strings.Count(string(b), "mtxdb: state not resolved from snapshots")
	}
	return fromSnapshots, fellBack
}

// stateEventID is the event ID of (typ, key) in the current state a client's server reports.
func stateEventID(ctx context.Context, cl *mautrix.Client, room id.RoomID, typ event.Type, key string) (string, error) {
	st, err := cl.State(ctx, room)
	if err != nil {
		return "", err
	}
	e := st[typ][key]
	if e == nil {
		return "", fmt.Errorf("no %s/%q in the state", typ.Type, key)
	}
	return e.ID.String(), nil
}

func equalStates(states []map[string]string) bool {
	for _, s := range states[1:] {
		if len(s) != len(states[0]) {
			return false
		}
		for k, v := range states[0] {
			if s[k] != v {
				return false
			}
		}
	}
	return true
}

// powerLevels is the power levels content every scenario starts from: alice 100,
// bob bobLevel; ban, kick, name and topic need 50; power levels and join rules 100.
func (c *fedCluster) powerLevels(bobLevel int) map[string]any {
	return map[string]any{
		"users":          map[string]any{c.uid("alice"): 100, c.uid("bob"): bobLevel},
		"users_default":  0,
		"events_default": 0,
		"state_default":  50,
		"ban":            50,
		"kick":           50,
		"redact":         50,
		"invite":         0,
		"events": map[string]any{"m.room.power_levels": 100, "m.room.join_rules": 100,
			"m.room.history_visibility": 100, "m.room.name": 50, "m.room.topic": 50},
	}
}

// edit returns a deep copy of content with f applied.
func edit(content map[string]any, f func(map[string]any)) map[string]any {
	b, _ := json.Marshal(content)
	var cp map[string]any
	_ = json.Unmarshal(b, &cp)
	f(cp)
	return cp
}

// partitionScenario is one conflict: the two sides of the cut (node indexes), bob's
// power level before it, and the changes made on each side while it lasts.
type partitionScenario struct {
	name     string
	what     string
	sides    [2][]int
	bobLevel int
	// during makes the changes and returns each event with the node that made it.
	during func(ctx context.Context, c *fedCluster, room id.RoomID, pl map[string]any) (map[string]int, error)
	// watch lists the contested state keys: type and the user name of the state
	// key ("" for the empty key).
	watch [][2]string
}

func sendState(ctx context.Context, cl *mautrix.Client, room id.RoomID, typ string, key string, content any) (string, error) {
	r, err := cl.SendStateEvent(ctx, room, event.NewEventType(typ), key, content)
	if err != nil {
		return "", fmt.Errorf("%s sets %s/%q: %w", cl.UserID, typ, key, err)
	}
	return r.EventID.String(), nil
}

// demoteBob: alice sets bob's power level to 0.
func demoteBob(ctx context.Context, c *fedCluster, room id.RoomID, pl map[string]any) (string, error) {
	return sendState(ctx, c.users["alice"], room, "m.room.power_levels", "", edit(pl, func(p map[string]any) {
		p["users"].(map[string]any)[c.uid("bob")] = 0
	}))
}

// bobRemovesCarol: bob bans (ban) or kicks carol; the member event's ID as B's
// state has it.
func bobRemovesCarol(ctx context.Context, c *fedCluster, room id.RoomID, ban bool) (string, error) {
	bob, carol := c.users["bob"], c.users["carol"].UserID
	var err error
	if ban {
		_, err = bob.BanUser(ctx, room, &mautrix.ReqBanUser{UserID: carol, Reason: "during the cut"})
	} else {
		_, err = bob.KickUser(ctx, room, &mautrix.ReqKickUser{UserID: carol, Reason: "during the cut"})
	}
	if err != nil {
		return "", fmt.Errorf("bob removes carol (ban: %v): %w", ban, err)
	}
	return stateEventID(ctx, bob, room, event.StateMember, carol.String())
}

var partitionScenarios = []partitionScenario{
	{
		name:     "ban-vs-demotion",
		what:     "A: alice sets bob's power 50 -> 0; B: bob bans carol@C",
		sides:    [2][]int{{0}, {1, 2}},
		bobLevel: 50,
		during: func(ctx context.Context, c *fedCluster, room id.RoomID, pl map[string]any) (map[string]int, error) {
			demote, err := demoteBob(ctx, c, room, pl)
			if err != nil {
				return nil, err
			}
			ban, err := bobRemovesCarol(ctx, c, room, true)
			return map[string]int{demote: 0, ban: 1}, err
		},
		watch: [][2]string{{"m.room.power_levels", ""}, {"m.room.member", "carol"}},
	},
	{
		name:     "join-rule-vs-join",
		what:     "A: alice sets the join rule public -> invite; C: dave@C joins",
		sides:    [2][]int{{0, 1}, {2}},
		bobLevel: 50,
		during: func(ctx context.Context, c *fedCluster, room id.RoomID, pl map[string]any) (map[string]int, error) {
			rule, err := sendState(ctx, c.users["alice"], room, "m.room.join_rules", "", map[string]any{"join_rule": "invite"})
			if err != nil {
				return nil, err
			}
			if _, err := c.users["dave"].JoinRoomByID(ctx, room); err != nil {
				return nil, fmt.Errorf("dave joins: %w", err)
			}
			join, err := stateEventID(ctx, c.users["dave"], room, event.StateMember, c.uid("dave"))
			return map[string]int{rule: 0, join: 2}, err
		},
		watch: [][2]string{{"m.room.join_rules", ""}, {"m.room.member", "dave"}},
	},
	{
		name:     "topic-vs-topic-power",
		what:     "B: bob (50) sets the topic; A: alice raises m.room.topic's level 50 -> 100",
		sides:    [2][]int{{0}, {1, 2}},
		bobLevel: 50,
		during: func(ctx context.Context, c *fedCluster, room id.RoomID, pl map[string]any) (map[string]int, error) {
			topic, err := sendState(ctx, c.users["bob"], room, "m.room.topic", "", map[string]any{"topic": "bob's topic during the cut"})
			if err != nil {
				return nil, err
			}
			raise, err := sendState(ctx, c.users["alice"], room, "m.room.power_levels", "", edit(pl, func(p map[string]any) {
				p["events"].(map[string]any)["m.room.topic"] = 100
			}))
			return map[string]int{topic: 1, raise: 0}, err
		},
		watch: [][2]string{{"m.room.power_levels", ""}, {"m.room.topic", ""}},
	},
	{
		name:     "admin-demoted-while-acting",
		what:     "A: alice sets bob's power 75 -> 0; B: bob kicks carol@C and renames the room",
		sides:    [2][]int{{0, 2}, {1}},
		bobLevel: 75,
		during: func(ctx context.Context, c *fedCluster, room id.RoomID, pl map[string]any) (map[string]int, error) {
			demote, err := demoteBob(ctx, c, room, pl)
			if err != nil {
				return nil, err
			}
			kick, err := bobRemovesCarol(ctx, c, room, false)
			if err != nil {
				return nil, err
			}
			name, err := sendState(ctx, c.users["bob"], room, "m.room.name", "", map[string]any{"name": "bob's name during the cut"})
			return map[string]int{demote: 0, kick: 1, name: 1}, err
		},
		watch: [][2]string{{"m.room.power_levels", ""}, {"m.room.member", "carol"}, {"m.room.name", ""}},
	},
}

// scenarioRun is what one scenario did on one build.
type scenarioRun struct {
	build    string
	sc       *partitionScenario
	room     id.RoomID
	err      string        // the step that failed, "" if none
	outcome  string        // "converged", "diverged" or "no agreement"
	agreeIn  time.Duration // from the heal to the first round of agreement
	took     time.Duration // the whole scenario on the running servers, room creation to the last round
	rounds   int
	cutSeen  string // the cut's check: each side's events absent on the other side until the heal
	traffic  string // federation requests through the proxy during the cut and after it
	logged   string // what the servers' logs say of the scenario's events (logCounts)
	states   []map[string]string
	exports  []*roomExport
	replays  []*replayResult
	replayOK []bool         // node i's state equals the replay of node A's export
	audits   []*auditResult // stock: mtxdb audit of each node's database (auditScenario)
	notes    []string
}

// ok is the patched build's criterion: converged, and every server's state and
// every replay equal to the replay of A's export.
func (r *scenarioRun) ok() bool {
	if r.err != "" || r.outcome != "converged" || len(r.replays) != len(r.states) {
		return false
	}
	for i := range r.states {
		if !r.replayOK[i] || !sameState(r.replays[i].state, r.replays[0].state) {
			return false
		}
	}
	return true
}

func sameState(a, b map[string]string) bool { return equalStates([]map[string]string{a, b}) }

// runScenario plays one scenario on a running cluster; the export and replay come
// later (replayScenario), once the servers are stopped.
func runScenario(t *testing.T, c *fedCluster, sc *partitionScenario) *scenarioRun {
	ctx := context.Background()
	r := &scenarioRun{build: c.build, sc: sc}
	start := time.Now()
	logAt := c.logSizes()
	defer func() { r.took, r.logged = time.Since(start), c.logCounts(logAt) }()
	fail := func(format string, args ...any) *scenarioRun {
		r.err = fmt.Sprintf(format, args...)
		t.Logf("%s %s: %s", c.build, sc.name, r.err)
		return r
	}
	logf := func(format string, args ...any) { t.Logf("%s %s: %s", c.build, sc.name, fmt.Sprintf(format, args...)) }
	alice := c.users["alice"]
	created, err := alice.CreateRoom(ctx, &mautrix.ReqCreateRoom{Preset: "public_chat", Name: "partition " + sc.name,
		Topic: "original topic", RoomVersion: "10"})
	if err != nil {
		return fail("create room: %v", err)
	}
	r.room = created.RoomID
	for _, u := range []string{"bob", "carol", "cleo"} {
		if _, err := c.users[u].JoinRoomByID(ctx, r.room); err != nil {
			return fail("%s joins: %v", u, err)
		}
	}
	pl := c.powerLevels(sc.bobLevel)
	plID, err := sendState(ctx, alice, r.room, "m.room.power_levels", "", pl)
	if err != nil {
		return fail("%v", err)
	}
	all := []int{0, 1, 2}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		states, err := c.states(ctx, r.room)
		if err == nil && equalStates(states) && states[0]["m.room.power_levels\x00"] == plID {
			break
		}
		if time.Now().After(deadline) {
			return fail("before the cut: the servers do not agree on the room within 3 min (%v)", err)
		}
		time.Sleep(time.Second)
	}
	logf("room %s, everyone joined, power levels agreed on A, B, C", r.room)

	label := func(nodes []int) string {
		var s []string
		for _, i := range nodes {
			s = append(s, c.nodes[i].label)
		}
		return strings.Join(s, " ")
	}
	names := func(nodes []int) []string {
		var s []string
		for _, i := range nodes {
			s = append(s, c.nodes[i].name)
		}
		return s
	}
	c.proxy.takeCounts()
	c.proxy.partition(names(sc.sides[0]), names(sc.sides[1]))
	defer c.proxy.heal() // on every return; the scenario heals the cut itself below
	cutAt := time.Now()
	logf("cut %s | %s", label(sc.sides[0]), label(sc.sides[1]))
	made, err := sc.during(ctx, c, r.room, pl)
	if err != nil {
		return fail("during the cut: %v", err)
	}
	var madeIDs []string
	for ev := range made {
		madeIDs = append(madeIDs, ev)
	}
	sort.Strings(madeIDs)
	// Each side's events reach the other servers of that side, and no server of the
	// other side.
	deadline = time.Now().Add(2 * time.Minute)
	for _, ev := range madeIDs {
		side, other := sc.sides[0], sc.sides[1]
		if !containsInt(side, made[ev]) {
			side, other = other, side
		}
		for {
			ok, err := c.stored([]string{ev}, side)
			if err != nil {
				return fail("during the cut: %v", err)
			}
			if ok {
				break
			}
			if time.Now().After(deadline) {
				return fail("during the cut: %s (made on %s) does not reach %s within 2 min", ev, c.nodes[made[ev]].label, label(side))
			}
			time.Sleep(500 * time.Millisecond)
		}
		for _, o := range other {
			got, err := storedEvents(c.nodes[o].server, []string{ev})
			if err != nil {
				return fail("during the cut: %v", err)
			}
			if len(got) != 0 {
				r.cutSeen += fmt.Sprintf("%s reached %s through the cut; ", ev, c.nodes[o].label)
			}
		}
	}
	if r.cutSeen == "" {
		r.cutSeen = "held: no event crossed the cut"
	}
	time.Sleep(time.Until(cutAt.Add(cutHold)))
	traffic := c.proxy.takeCounts()
	c.proxy.heal()
	healed := time.Now()
	logf("made %d events during the cut (%s); %s; healed after %.0f s; federation during the cut: %s", len(made), strings.Join(madeIDs, " "), r.cutSeen, time.Since(cutAt).Seconds(), traffic)
	r.traffic = "during the cut: " + traffic

	// Rounds: every ticker sends a message, then the states are read. Agreement
	// counts once every event made during the cut and every message of the round
	// before is stored on every server.
	var lastTicks []string
	agree, storedDiffer := 0, 0
	var states []map[string]string
	for round := 1; ; round++ {
		r.rounds = round
		var ticks []string
		for i, tk := range c.tickers {
			resp, err := tk.SendText(ctx, r.room, fmt.Sprintf("round %d from %s", round, c.nodes[i].label))
			if err != nil {
				r.notes = append(r.notes, fmt.Sprintf("round %d: %s's message: %v", round, c.nodes[i].label, err))
				continue
			}
			ticks = append(ticks, resp.EventID.String())
		}
		time.Sleep(roundPause)
		var err error
		states, err = c.states(ctx, r.room)
		if err != nil {
			return fail("after the heal: %v", err)
		}
		delivered, err := c.stored(append(append([]string{}, madeIDs...), lastTicks...), all)
		if err != nil {
			return fail("after the heal: %v", err)
		}
		lastTicks = ticks
		equal := equalStates(states)
		switch {
		case delivered && equal:
			agree++
			storedDiffer = 0
		case delivered:
			agree = 0
			storedDiffer++
		default:
			agree = 0
		}
		if agree == 1 {
			r.agreeIn = time.Since(healed)
		}
		if agree >= stableRounds {
			r.outcome = "converged"
			break
		}
		if storedDiffer >= divergedRounds {
			r.outcome = "diverged"
			break
		}
		if time.Since(healed) > agreeTimeout {
			r.outcome = "no agreement"
			break
		}
	}
	r.states = states
	r.traffic += "; after the heal: " + c.proxy.takeCounts()
	logf("%s after %d rounds (%.1f s after the heal; agreement from %.1f s)", r.outcome, r.rounds, time.Since(healed).Seconds(), r.agreeIn.Seconds())
	return r
}

func containsString(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// replayScenario exports the room from every (stopped) server, replays each export
// with mtxdb and compares: each server's state with the replay of A's export.
func replayScenario(t *testing.T, c *fedCluster, r *scenarioRun, cli, dir string) {
	if r.err != "" {
		return
	}
	for _, n := range c.nodes {
		ex, err := exportRoom(n.server, r.room.String())
		if err != nil {
			r.err = fmt.Sprintf("export from %s: %v", n.label, err)
			return
		}
		rep, err := replayExport(cli, filepath.Join(dir, r.sc.name, n.label), r.room.String(), ex)
		if err != nil {
			r.err = fmt.Sprintf("replay of %s's export: %v", n.label, err)
			return
		}
		r.exports = append(r.exports, ex)
		r.replays = append(r.replays, rep)
		t.Logf("%s %s: %s's export: %d events, %d rejected by Dendrite, %d forward extremities; mtxdb: %s", c.build, r.sc.name, n.label,
			len(ex.events), len(ex.rejected), len(ex.extremities), strings.ReplaceAll(rep.summary, "\n", " | "))
	}
	for i := range r.states {
		r.replayOK = append(r.replayOK, sameState(r.states[i], r.replays[0].state))
	}
}

// describe renders an event of the exports briefly: its type, sender and the content
// that matters for the scenarios.
func (c *fedCluster) describe(r *scenarioRun, evID string) string {
	if evID == "" {
		return "(absent)"
	}
	var pdu json.RawMessage
	for _, ex := range r.exports {
		if p, ok := ex.byID[evID]; ok {
			pdu = p
			break
		}
	}
	short := evID
	if len(short) > 9 {
		short = short[:9]
	}
	if pdu == nil {
		return short + " (not exported)"
	}
	var e struct {
		Type     string         `json:"type"`
		StateKey string         `json:"state_key"`
		Sender   string         `json:"sender"`
		Content  map[string]any `json:"content"`
	}
	_ = json.Unmarshal(pdu, &e)
	var what string
	switch e.Type {
	case "m.room.member":
		what = fmt.Sprintf("%s %s", e.Content["membership"], c.who(e.StateKey))
	case "m.room.power_levels":
		users, _ := e.Content["users"].(map[string]any)
		var us []string
		for u, l := range users {
			us = append(us, fmt.Sprintf("%s=%v", c.who(u), l))
		}
		sort.Strings(us)
		events, _ := e.Content["events"].(map[string]any)
		what = fmt.Sprintf("power levels %s topic=%v", strings.Join(us, ","), events["m.room.topic"])
	case "m.room.join_rules":
		what = fmt.Sprintf("join_rule=%v", e.Content["join_rule"])
	case "m.room.topic":
		what = fmt.Sprintf("topic=%q", e.Content["topic"])
	case "m.room.name":
		what = fmt.Sprintf("name=%q", e.Content["name"])
	default:
		what = e.Type
	}
	return fmt.Sprintf("%s (%s by %s)", short, what, c.who(e.Sender))
}

// diffKeys lists the keys on which the states differ, each with every state's value.
func (c *fedCluster) diffKeys(r *scenarioRun, labels []string, states []map[string]string) []string {
	keys := map[string]bool{}
	for _, s := range states {
		for k := range s {
			keys[k] = true
		}
	}
	var out []string
	for k := range keys {
		same := true
		for _, s := range states[1:] {
			if s[k] != states[0][k] {
				same = false
			}
		}
		if same {
			continue
		}
		var vals []string
		for i, s := range states {
			vals = append(vals, labels[i]+": "+c.describe(r, s[k]))
		}
		typ, key, _ := strings.Cut(k, "\x00")
		out = append(out, fmt.Sprintf("%s/%s: %s", typ, c.who(key), strings.Join(vals, "; ")))
	}
	sort.Strings(out)
	return out
}

func TestFederationPartition(t *testing.T) {
	bin := os.Getenv("MTXDB_DENDRITE_BIN")
	if bin == "" {
		t.Skip("MTXDB_DENDRITE_BIN is not set: make test-dendrite-partition builds Dendrite (make dendrite) and runs this test")
	}
	work := os.Getenv("MTXDB_PARTITION_WORK")
	if work == "" {
		work = t.TempDir()
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	builds := []string{"patched", "stock"}
	if b := os.Getenv("MTXDB_PARTITION_BUILDS"); b != "" {
		builds = strings.Split(b, ",")
	}
	rep := &partitionReport{started: time.Now(), loadStart: loadavg()}
	cli := buildMtxdb(t, work)
	defer func() { rep.write(t, os.Getenv("MTXDB_PARTITION_OUT")) }()
	for _, build := range builds {
		b := bin
		if build == "stock" {
			b = filepath.Join(bin, "stock")
		} else if build != "patched" {
			t.Fatalf("MTXDB_PARTITION_BUILDS: unknown build %q (patched, stock)", build)
		}
		t.Run(build, func(t *testing.T) {
			start := time.Now()
			dir := filepath.Join(work, build)
			c := startCluster(t, build, b, dir)
			var runs []*scenarioRun
			only := os.Getenv("MTXDB_PARTITION_SCENARIOS")
			for i := range partitionScenarios {
				if only == "" || containsString(strings.Split(only, ","), partitionScenarios[i].name) {
					runs = append(runs, runScenario(t, c, &partitionScenarios[i]))
				}
			}
			c.stop()
			for _, r := range runs {
				replayScenario(t, c, r, cli, filepath.Join(dir, "replay"))
				auditScenario(t, c, r, cli, filepath.Join(dir, "replay"))
				rep.add(c, r)
				for _, line := range rep.detail(c, r) {
					t.Logf("%s %s: %s", build, r.sc.name, line)
				}
				if build == "patched" && !r.ok() {
					t.Errorf("patched %s: not converged to mtxdb's replay (outcome %q, error %q); details above; server logs in %s/{A,B,C}/server.log",
						r.sc.name, r.outcome, r.err, dir)
				}
			}
			if build == "patched" {
				fromSnapshots, fellBack := c.snapshotResolutions()
				t.Logf("patched: %d resolutions from mtxdb snapshots, %d fell back to event lists", fromSnapshots, fellBack)
				if fromSnapshots == 0 || fellBack > 0 {
					t.Errorf("patched: %d resolutions from mtxdb snapshots and %d fallbacks to event lists, want some and none; server logs in %s/{A,B,C}/server.log",
						fromSnapshots, fellBack, dir)
				}
			}
			rep.wall = append(rep.wall, fmt.Sprintf("%s %.0f s", build, time.Since(start).Seconds()))
		})
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
