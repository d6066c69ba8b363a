package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"
)

// TestKillDuringStateChanges SIGKILLs a patched Dendrite (SQLite, and PostgreSQL)
// at random moments while clients join, leave, rename themselves, change the
// topic and edit the power levels of one room, MTXDB_KILLS times (50 by default),
// and after each kill requires: mtxdb-dendrite-migrate -check passes on the
// database (every snapshot NID Dendrite's SQL names reads from the store, with
// events the database holds), the server starts again, and every state change a
// client saw acknowledged is in the room's /state (or the change that was in
// flight at the kill on the same key, which may or may not have been stored).
func TestKillDuringStateChanges(t *testing.T) {
	kills := envCount(t, "MTXDB_KILLS", 50, 1)
	forBackends(t, "test-dendrite-kill", func(t *testing.T, bin, backend, pg string) {
		seed := uint64(time.Now().UnixNano())
		if v := os.Getenv("MTXDB_SEED"); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("MTXDB_SEED=%q: %v", v, err)
			}
			seed = n
		}
		t.Logf("seed %d (MTXDB_SEED=%d replays the kill moments and the drivers' choices)", seed, seed)
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		dbURL := ""
		if backend == "postgres" {
			dbURL = pgDatabase(t, pg, "e2e_kill")
		}
		s := newServer(t, "kill", bin, dbURL, nil)
		checkDB := dbURL
		if checkDB == "" {
			checkDB = "file:" + filepath.Join(s.dir, "dendrite_roomserver.db")
		}
		if err := s.start(); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		run(t, s.dir, s.env, filepath.Join(s.bin, "create-account"), "-config", "dendrite.yaml", "-url", s.url,
			"-username", "alice", "-password", "alice-password-1", "-admin")
		alice := client(t, s)
		m(alice.Login(ctx, &mautrix.ReqLogin{Type: mautrix.AuthTypePassword,
			Identifier: mautrix.UserIdentifier{Type: mautrix.IdentifierTypeUser, User: "alice"}, Password: "alice-password-1", StoreCredentials: true})).or(t, "login alice")
		room := m(alice.CreateRoom(ctx, &mautrix.ReqCreateRoom{Preset: "public_chat", Name: "kill", Topic: "t-0"})).or(t, "create room").RoomID
		tr := &tracker{acked: map[stateKey]string{}, inflight: map[stateKey]string{}}
		drivers := []*driver{{name: "alice", c: alice, admin: true}}
		for i := range 3 {
			drivers = append(drivers, &driver{name: fmt.Sprintf("d%d", i)})
		}
		stats := killStats{}
		for k := range kills {
			for _, d := range drivers {
				d.rng = rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
			}
			var wg sync.WaitGroup
			stop := make(chan struct{})
			for _, d := range drivers {
				wg.Add(1)
				go func() { defer wg.Done(); d.drive(ctx, s, room, tr, stop) }()
			}
			time.Sleep(time.Duration(300+rng.IntN(2700)) * time.Millisecond)
			if err := s.cmd.Process.Kill(); err != nil {
				t.Fatalf("kill %d: %v", k, err)
			}
			<-s.exited
			s.cmd = nil
			close(stop)
			wg.Wait()
			stats.kills++

			out, err := exec.Command(filepath.Join(bin, "mtxdb-dendrite-migrate"), "-check", "-db", checkDB).CombinedOutput()
			if err != nil {
				t.Fatalf("kill %d: mtxdb-dendrite-migrate -check: %v\n%s", k, err, out)
			}
			stats.lastCheck = strings.TrimSpace(string(out))
			if err := s.start(); err != nil {
				t.Fatalf("restart after kill %d: %v", k, err)
			}
			for _, d := range drivers {
				if d.c != nil {
					d.c.HomeserverURL, _ = url.Parse(s.url)
				}
			}
			st := roomState(t, alice, room)
			lost := tr.reconcile(st, &stats)
			for _, l := range lost {
				t.Errorf("kill %d: %s", k, l)
			}
			for _, d := range drivers {
				d.sync(st)
			}
		}
		t.Logf("%s: %d kills, %d state changes acknowledged, %d in flight at a kill (%d stored, %d not); last check: %s",
			backend, stats.kills, tr.ackedTotal, stats.inflight, stats.inflightStored, stats.inflight-stats.inflightStored, stats.lastCheck)
		if tr.ackedTotal < kills {
			t.Errorf("only %d acknowledged state changes over %d kills: the drivers did too little", tr.ackedTotal, kills)
		}
	})
}

type killStats struct {
	kills, inflight, inflightStored int
	lastCheck                       string
}

// stateKey is (event type, state key).
type stateKey struct{ typ, sk string }

// tracker holds, per state key, the digest of the last change a client saw
// acknowledged and of the change in flight (sent, not yet answered).
type tracker struct {
	mu         sync.Mutex
	acked      map[stateKey]string
	inflight   map[stateKey]string
	ackedTotal int
}

func (tr *tracker) send(k stateKey, digest string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.inflight[k] = digest
}

func (tr *tracker) ack(k stateKey, digest string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	delete(tr.inflight, k)
	tr.acked[k] = digest
	tr.ackedTotal++
}

// reconcile compares the room's state after a restart with what was
// acknowledged: each acknowledged key must hold its last acknowledged change or
// the one in flight on it at the kill. It returns the losses and takes the state
// as the new truth.
func (tr *tracker) reconcile(st map[stateKey]map[string]any, stats *killStats) []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var lost []string
	for k, want := range tr.acked {
		c, present := st[k]
		fl, inFlight := tr.inflight[k]
		switch {
		case present && matches(k.typ, want, c):
		case present && inFlight && matches(k.typ, fl, c):
		default:
			got := "(absent)"
			if present {
				got = digest(k.typ, c)
			}
			lost = append(lost, fmt.Sprintf("acknowledged %s %q = %s, /state has %s (in flight: %q)", k.typ, k.sk, want, got, fl))
		}
	}
	for k, fl := range tr.inflight {
		stats.inflight++
		if c, ok := st[k]; ok && matches(k.typ, fl, c) {
			stats.inflightStored++
		}
	}
	tr.inflight = map[stateKey]string{}
	for k := range tr.acked {
		if c, ok := st[k]; ok {
			tr.acked[k] = digest(k.typ, c)
		}
	}
	return lost
}

// matches reports whether a state event's content is the change want describes:
// for a member event "join" or "leave" (the membership; the server may add a
// display name) or "join|NAME" (with that display name); otherwise want is the
// digest.
func matches(typ, want string, c map[string]any) bool {
	if typ == "m.room.member" && !strings.Contains(want, "|") {
		return fmt.Sprint(c["membership"]) == want
	}
	return digest(typ, c) == want
}

// digest is what the drivers' changes make unique in a state event's content.
func digest(typ string, c map[string]any) string {
	switch typ {
	case "m.room.member":
		return fmt.Sprintf("%v|%v", c["membership"], c["displayname"])
	case "m.room.topic":
		return fmt.Sprint(c["topic"])
	case "m.room.power_levels":
		users, _ := c["users"].(map[string]any)
		return fmt.Sprint(users[plMarker])
	}
	b, _ := json.Marshal(c)
	return string(b)
}

// plMarker is the user whose power level the admin driver counts up.
const plMarker = "@pl-marker:localhost"

// driver makes one client's state changes in a loop until stop or an error (the
// server was killed). The admin driver (alice) changes the topic and the power
// levels; the others register users who join, rename themselves and leave.
type driver struct {
	name   string
	admin  bool
	c      *mautrix.Client
	rng    *rand.Rand
	n      int
	users  int
	joined bool
	pl     map[string]any // the admin's last power levels content
}

func (d *driver) drive(ctx context.Context, s *server, room id.RoomID, tr *tracker, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		if err := d.step(ctx, s, room, tr); err != nil {
			return
		}
	}
}

func (d *driver) step(ctx context.Context, s *server, room id.RoomID, tr *tracker) error {
	d.n++
	if d.admin {
		return d.adminStep(ctx, room, tr)
	}
	if d.c == nil || d.rng.IntN(20) == 0 {
		// A new user (registration is not room state).
		d.users++
		c, err := mautrix.NewClient(s.url, "", "")
		if err != nil {
			return err
		}
		name := fmt.Sprintf("%s-u%d", d.name, d.users)
		r, err := c.RegisterDummy(ctx, &mautrix.ReqRegister[any]{Username: name, Password: name + "-password-1"})
		if err != nil {
			return err
		}
		c.SetCredentials(r.UserID, r.AccessToken)
		d.c, d.joined = c, false
	}
	k := stateKey{"m.room.member", d.c.UserID.String()}
	switch {
	case !d.joined:
		tr.send(k, "join")
		if _, err := d.c.JoinRoomByID(ctx, room); err != nil {
			return err
		}
		tr.ack(k, "join")
		d.joined = true
	case d.rng.IntN(6) == 0:
		tr.send(k, "leave")
		if _, err := d.c.LeaveRoom(ctx, room); err != nil {
			return err
		}
		tr.ack(k, "leave")
		d.joined = false
	default:
		dn := fmt.Sprintf("%s-n%d", d.name, d.n)
		tr.send(k, "join|"+dn)
		if _, err := d.c.SendStateEvent(ctx, room, event.StateMember, k.sk, map[string]any{"membership": "join", "displayname": dn}); err != nil {
			return err
		}
		tr.ack(k, "join|"+dn)
	}
	_, err := d.c.SendMessageEvent(ctx, room, event.EventMessage, map[string]any{"msgtype": "m.text", "body": fmt.Sprintf("%s %d", d.name, d.n)})
	return err
}

func (d *driver) adminStep(ctx context.Context, room id.RoomID, tr *tracker) error {
	if d.rng.IntN(2) == 0 {
		k := stateKey{"m.room.topic", ""}
		topic := fmt.Sprintf("t-%d", d.n)
		tr.send(k, topic)
		if _, err := d.c.SendStateEvent(ctx, room, event.StateTopic, "", map[string]any{"topic": topic}); err != nil {
			return err
		}
		tr.ack(k, topic)
		return nil
	}
	if d.pl == nil {
		var pl map[string]any
		if err := d.c.StateEvent(ctx, room, event.StatePowerLevels, "", &pl); err != nil {
			return err
		}
		d.pl = pl
	}
	users, _ := d.pl["users"].(map[string]any)
	if users == nil {
		users = map[string]any{}
	}
	users[plMarker] = d.n
	d.pl["users"] = users
	k := stateKey{"m.room.power_levels", ""}
	want := fmt.Sprint(d.n)
	tr.send(k, want)
	if _, err := d.c.SendStateEvent(ctx, room, event.StatePowerLevels, "", d.pl); err != nil {
		return err
	}
	tr.ack(k, want)
	return nil
}

// sync takes the driver's membership from the room's state after a restart (a
// join or leave in flight at the kill may or may not have been stored).
func (d *driver) sync(st map[stateKey]map[string]any) {
	if d.admin {
		d.pl = nil
		return
	}
	if d.c == nil {
		return
	}
	c, ok := st[stateKey{"m.room.member", d.c.UserID.String()}]
	d.joined = ok && c["membership"] == "join"
}

// roomState reads the room's current state through the client-server API.
func roomState(t *testing.T, c *mautrix.Client, room id.RoomID) map[stateKey]map[string]any {
	t.Helper()
	var events []struct {
		Type     string         `json:"type"`
		StateKey *string        `json:"state_key"`
		Content  map[string]any `json:"content"`
	}
	url := c.BuildClientURL("v3", "rooms", room, "state")
	if _, err := c.MakeRequest(context.Background(), "GET", url, nil, &events); err != nil {
		t.Fatalf("/state: %v", err)
	}
	out := map[stateKey]map[string]any{}
	for _, e := range events {
		if e.StateKey != nil {
			out[stateKey{e.Type, *e.StateKey}] = e.Content
		}
	}
	return out
}

// TestTrackerReconcile: the kill test's comparison fails an acknowledged change
// that /state lacks, accepts the change in flight on the same key instead, and
// counts in-flight changes stored or not.
func TestTrackerReconcile(t *testing.T) {
	member := stateKey{"m.room.member", "@a:localhost"}
	topic := stateKey{"m.room.topic", ""}
	pl := stateKey{"m.room.power_levels", ""}
	tr := &tracker{acked: map[stateKey]string{}, inflight: map[stateKey]string{}}
	tr.ack(member, "join|a-n1")
	tr.ack(topic, "t-1")
	tr.ack(pl, "3")
	tr.send(topic, "t-2")
	var stats killStats
	lost := tr.reconcile(map[stateKey]map[string]any{
		member: {"membership": "join", "displayname": "a-n1"},
		topic:  {"topic": "t-2"},
		pl:     {"users": map[string]any{plMarker: 3.0}},
	}, &stats)
	if len(lost) != 0 || stats.inflight != 1 || stats.inflightStored != 1 {
		t.Fatalf("all kept: lost %v, stats %+v", lost, stats)
	}
	tr.ack(member, "leave")
	lost = tr.reconcile(map[stateKey]map[string]any{
		member: {"membership": "join", "displayname": "a-n1"},
		topic:  {"topic": "t-2"},
	}, &stats)
	if len(lost) != 2 {
		t.Fatalf("a reverted leave and absent power levels: lost %v", lost)
	}
}
