package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"
)

// newFederatedServer writes keys, a certificate signed by ca for 127.0.0.1 and a
// configuration for a server named 127.0.0.1:PORT (PORT its HTTPS federation
// listener) that federates with the others on loopback over TLS verified against ca
// (SSL_CERT_FILE), on dbURL ("" = SQLite files in its directory).
func newFederatedServer(t *testing.T, ca *testCA, serial int64, name, bin, dbURL string) *fedServer {
	dir := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	ca.issue(t, serial, certFile, keyFile)
	port := freePort(t)
	s := configureServer(t, dir, name, fmt.Sprintf("127.0.0.1:%d", port), bin, dbURL, []string{"SSL_CERT_FILE=" + ca.file},
		func(cfg string) string { return setLogLevel(cfg, "info") })
	s.httpsPort, s.tlsCert, s.tlsKey = port, certFile, keyFile
	return &fedServer{s, dbURL}
}

// fedServer is a server of newFederatedServer and its database ("" = SQLite).
type fedServer struct {
	*server
	dbURL string
}

// serverName is the server's Matrix name (the one its user IDs carry).
func (s *fedServer) serverName() string { return fmt.Sprintf("127.0.0.1:%d", s.httpsPort) }

// registered registers a user on s through /register and returns its client.
func registered(t *testing.T, s *fedServer, name string) *mautrix.Client {
	c := client(t, s.server)
	r := m(c.RegisterDummy(context.Background(), &mautrix.ReqRegister[any]{Username: name, Password: name + "-password-1"})).or(t, "register "+name)
	c.SetCredentials(r.UserID, r.AccessToken)
	return c
}

// joinVia joins room through server (the server_name query parameter Dendrite
// v0.13.8 reads; a room ID of room version 12 names no server).
func joinVia(c *mautrix.Client, room id.RoomID, server string) error {
	u := c.BuildURLWithQuery(mautrix.ClientURLPath{"v3", "join", room}, map[string]string{"server_name": server})
	_, err := c.MakeRequest(context.Background(), http.MethodPost, u, struct{}{}, nil)
	return err
}

// eventually polls cond every 200 ms until it holds, failing the test after
// deadline with what; federation delivers events asynchronously.
func eventually(t *testing.T, what string, deadline time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %s", what, deadline)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sees reports whether c's /messages of room holds a message with body.
func sees(c *mautrix.Client, room id.RoomID, body string) bool {
	msgs, err := c.Messages(context.Background(), room, "", "", mautrix.DirectionBackward, nil, 50)
	if err != nil {
		return false
	}
	for _, e := range msgs.Chunk {
		var content struct{ Body string }
		if json.Unmarshal(e.Content.VeryRaw, &content) == nil && content.Body == body {
			return true
		}
	}
	return false
}

// stateContent decodes the content of room's state event (typ, "") as c sees it;
// nil when the server has none.
func stateContent(c *mautrix.Client, room id.RoomID, typ event.Type) map[string]any {
	var content map[string]any
	if err := c.StateEvent(context.Background(), room, typ, "", &content); err != nil {
		return nil
	}
	return content
}

// TestRoomV12Federation creates rooms of room version 12 on one patched server
// (hs1), joins them from a second (hs2) over federation, and sends messages and
// state both ways, on SQLite and (with MTXDB_PG_URL) PostgreSQL. It checks what
// version 12 changes: the room ID is "!" and the create event's reference hash; the
// create event has no room_id and no other event cites it in auth_events (as both
// servers stored them); the creators (sender, content.additional_creators, and with
// trusted_private_chat the invitees) are not in the power levels' users yet hold
// every power (a creator absent from them changes the power levels, renames the
// room from hs2, kicks), cannot be kicked, and may not be listed (400, as a second
// create event is). Then an invitation over federation, a fork (hs2 down while hs1
// sets the topic, hs2 sets it on its own branch) that both servers resolve to the
// same state, and a restart of both.
func TestRoomV12Federation(t *testing.T) {
	bin := os.Getenv("MTXDB_DENDRITE_BIN")
	if bin == "" {
		t.Skip("MTXDB_DENDRITE_BIN is not set: make test-dendrite-v12 builds Dendrite (make dendrite) and runs this test")
	}
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			pg := os.Getenv("MTXDB_PG_URL")
			var db1, db2 string
			if backend == "postgres" {
				if pg == "" {
					t.Skip("MTXDB_PG_URL is not set: make test-dendrite-v12 starts a PostgreSQL (scripts/pgserver.sh) and sets it")
				}
				db1, db2 = pgDatabase(t, pg, "v12_hs1"), pgDatabase(t, pg, "v12_hs2")
			}
			ca := newTestCA(t, t.TempDir())
			roomV12Federation(t, newFederatedServer(t, ca, 2, "hs1", bin, db1), newFederatedServer(t, ca, 3, "hs2", bin, db2))
		})
	}
}

func roomV12Federation(t *testing.T, hs1, hs2 *fedServer) {
	ctx := context.Background()
	const wait = 3 * time.Minute // federation on a loaded 2-core machine
	for _, s := range []*fedServer{hs1, hs2} {
		if err := s.start(); err != nil {
			t.Fatal(err)
		}
	}
	alice := registered(t, hs1, "alice")
	bob, carol := registered(t, hs2, "bob"), registered(t, hs2, "carol")
	t.Logf("users: %s on hs1; %s and %s on hs2", alice.UserID, bob.UserID, carol.UserID)

	// Creation on hs1, carol (on hs2) an additional creator.
	room := m(alice.CreateRoom(ctx, &mautrix.ReqCreateRoom{Preset: "public_chat", Name: "v12 room", RoomVersion: "12",
		CreationContent: map[string]any{"additional_creators": []string{carol.UserID.String()}}})).or(t, "create a v12 room").RoomID
	if !regexp.MustCompile(`^![A-Za-z0-9_-]{43}$`).MatchString(room.String()) {
		t.Fatalf("room ID %s is not of room version 12's form (! and 43 unpadded URL-safe base64 characters)", room)
	}
	st := m(alice.State(ctx, room)).or(t, "state on hs1")
	create := st[event.StateCreate][""]
	if create == nil || create.ID.String() != "$"+room.String()[1:] {
		t.Fatalf("room %s: the create event (%v) is not the event the room ID names", room, create)
	}
	var createContent struct {
		RoomVersion        string   `json:"room_version"`
		AdditionalCreators []string `json:"additional_creators"`
	}
	check(t, "create content", json.Unmarshal(create.Content.VeryRaw, &createContent))
	if createContent.RoomVersion != "12" || !slices.Equal(createContent.AdditionalCreators, []string{carol.UserID.String()}) {
		t.Fatalf("create content %s: want room_version 12 and additional_creators [%s]", create.Content.VeryRaw, carol.UserID)
	}
	pl := stateContent(alice, room, event.StatePowerLevels)
	users, _ := pl["users"].(map[string]any)
	for _, u := range []id.UserID{alice.UserID, carol.UserID} {
		if _, listed := users[u.String()]; listed {
			t.Fatalf("power levels %v list the creator %s", pl, u)
		}
	}
	t.Logf("room %s created on %s: create event %s, power levels users %v", room, hs1.serverName(), create.ID, users)

	// A power levels event that lists a creator is refused (auth rules of version 12).
	withCreator := map[string]any{}
	for k, v := range pl {
		withCreator[k] = v
	}
	withCreator["users"] = map[string]any{alice.UserID.String(): 100}
	_, err := alice.SendStateEvent(ctx, room, event.StatePowerLevels, "", withCreator)
	t.Log(badJSON(t, "alice lists herself in the power levels", err))
	_, err = alice.SendStateEvent(ctx, room, event.StateCreate, "", map[string]any{"room_version": "12"})
	t.Log(badJSON(t, "alice sends a second create event", err))

	// trusted_private_chat: the invitee (bob, on hs2) becomes an additional creator
	// and gets the invitation over federation.
	dm := m(alice.CreateRoom(ctx, &mautrix.ReqCreateRoom{Preset: "trusted_private_chat", RoomVersion: "12", Invite: []id.UserID{bob.UserID}, IsDirect: true})).or(t, "create a v12 trusted_private_chat").RoomID
	dmCreate := stateContent(alice, dm, event.StateCreate)
	if creators, _ := dmCreate["additional_creators"].([]any); len(creators) != 1 || creators[0] != bob.UserID.String() {
		t.Fatalf("trusted_private_chat create content %v: want additional_creators [%s]", dmCreate, bob.UserID)
	}
	if u, _ := stateContent(alice, dm, event.StatePowerLevels)["users"].(map[string]any); len(u) != 0 {
		t.Fatalf("trusted_private_chat power levels users %v: want none (both are creators)", u)
	}
	eventually(t, "hs2 has bob's invitation to the trusted_private_chat", wait, func() bool {
		return joinVia(bob, dm, hs1.serverName()) == nil
	})

	// bob and carol join from hs2 through hs1.
	for _, c := range []*mautrix.Client{bob, carol} {
		check(t, fmt.Sprintf("%s joins over federation", c.UserID), joinVia(c, room, hs1.serverName()))
	}
	eventually(t, "hs1 sees bob and carol joined", wait, func() bool {
		j, err := alice.JoinedMembers(ctx, room)
		return err == nil && len(j.Joined) == 3
	})

	// Messages both ways.
	m(alice.SendText(ctx, room, "hello from hs1")).or(t, "alice's message")
	eventually(t, "hs2 receives alice's message", wait, func() bool { return sees(bob, room, "hello from hs1") })
	m(bob.SendText(ctx, room, "hello from hs2")).or(t, "bob's message")
	eventually(t, "hs1 receives bob's message", wait, func() bool { return sees(alice, room, "hello from hs2") })

	// State both ways: alice's topic; carol, an additional creator absent from the
	// power levels, renames the room from hs2.
	m(alice.SendStateEvent(ctx, room, event.StateTopic, "", map[string]any{"topic": "topic from hs1"})).or(t, "alice sets the topic")
	eventually(t, "hs2 has alice's topic", wait, func() bool { return stateContent(bob, room, event.StateTopic)["topic"] == "topic from hs1" })
	m(carol.SendStateEvent(ctx, room, event.StateRoomName, "", map[string]any{"name": "named on hs2"})).or(t, "carol (additional creator) renames the room")
	eventually(t, "hs1 has carol's name", wait, func() bool { return stateContent(alice, room, event.StateRoomName)["name"] == "named on hs2" })

	// bob (power 0) may not set the topic until alice gives him 50.
	_, err = bob.SendStateEvent(ctx, room, event.StateTopic, "", map[string]any{"topic": "bob's topic"})
	t.Log(forbidden(t, "bob (0) sets the topic", err))
	raised := map[string]any{}
	for k, v := range pl {
		raised[k] = v
	}
	raised["users"] = map[string]any{bob.UserID.String(): 50}
	m(alice.SendStateEvent(ctx, room, event.StatePowerLevels, "", raised)).or(t, "alice gives bob 50")
	eventually(t, "hs2 has bob at 50", wait, func() bool {
		u, _ := stateContent(bob, room, event.StatePowerLevels)["users"].(map[string]any)
		return u[bob.UserID.String()] == float64(50)
	})
	m(bob.SendStateEvent(ctx, room, event.StateTopic, "", map[string]any{"topic": "topic from hs2"})).or(t, "bob (50) sets the topic")
	eventually(t, "hs1 has bob's topic", wait, func() bool { return stateContent(alice, room, event.StateTopic)["topic"] == "topic from hs2" })

	// Both servers hold the same state.
	norm := func(c *mautrix.Client) string {
		st := m(c.State(ctx, room)).or(t, "state")
		var keys []string
		for typ, byKey := range st {
			for key, e := range byKey {
				keys = append(keys, fmt.Sprintf("%s|%s|%s", typ.Type, key, e.ID))
			}
		}
		slices.Sort(keys)
		return strings.Join(keys, "\n")
	}
	eventually(t, "hs1 and hs2 agree on the state", wait, func() bool { return norm(alice) == norm(bob) })

	// Creators cannot be kicked, not even by a creator.
	_, err = alice.KickUser(ctx, room, &mautrix.ReqKickUser{UserID: carol.UserID})
	t.Log(forbidden(t, "alice kicks carol (a creator)", err))
	// alice, a creator absent from the power levels, kicks bob.
	m(alice.KickUser(ctx, room, &mautrix.ReqKickUser{UserID: bob.UserID, Reason: "v12 test"})).or(t, "alice kicks bob")
	eventually(t, "hs2 has bob kicked", wait, func() bool {
		return stateMember(carol, room, bob.UserID) == "leave"
	})
	// An invitation over federation, and bob's join on it.
	m(alice.InviteUser(ctx, room, &mautrix.ReqInviteUser{UserID: bob.UserID})).or(t, "alice invites bob")
	eventually(t, "hs2 has bob invited", wait, func() bool { return stateMember(carol, room, bob.UserID) == "invite" })
	check(t, "bob joins on the invitation", joinVia(bob, room, hs1.serverName()))
	eventually(t, "hs1 has bob joined again", wait, func() bool { return stateMember(alice, room, bob.UserID) == "join" })

	// A fork: alice sets the topic while hs2 is down, carol sets it on hs2 as soon
	// as hs2 is back (hs1 waits out its backoff before it sends to hs2 again). Each
	// server then holds two forward extremities whose states differ in the topic,
	// and resolves them (state resolution v2.1 through mtxdb's resolver).
	hs2.stop()
	aliceTopic := m(alice.SendStateEvent(ctx, room, event.StateTopic, "", map[string]any{"topic": "hs1's branch"})).or(t, "alice sets the topic while hs2 is down").EventID
	if err := hs2.start(); err != nil {
		t.Fatal(err)
	}
	bob.HomeserverURL, _ = url.Parse(hs2.url)
	carol.HomeserverURL, _ = url.Parse(hs2.url)
	carolTopic := m(carol.SendStateEvent(ctx, room, event.StateTopic, "", map[string]any{"topic": "hs2's branch"})).or(t, "carol sets the topic on hs2's branch").EventID
	eventually(t, "hs1 and hs2 agree on the state after the fork", wait, func() bool { return norm(alice) == norm(carol) })
	topic := stateContent(alice, room, event.StateTopic)["topic"]
	t.Logf("fork: alice's topic %s (hs1), carol's %s (hs2); resolved topic %q on both", aliceTopic, carolTopic, topic)

	// After a restart of both, messages still go both ways.
	for _, s := range []*fedServer{hs1, hs2} {
		s.stop()
		if err := s.start(); err != nil {
			t.Fatal(err)
		}
	}
	alice.HomeserverURL, _ = url.Parse(hs1.url)
	bob.HomeserverURL, _ = url.Parse(hs2.url)
	carol.HomeserverURL, _ = url.Parse(hs2.url)
	m(alice.SendText(ctx, room, "after the restart, from hs1")).or(t, "alice's message after the restart")
	eventually(t, "hs2 receives alice's message after the restart", wait, func() bool { return sees(carol, room, "after the restart, from hs1") })
	m(carol.SendText(ctx, room, "after the restart, from hs2")).or(t, "carol's message after the restart")
	eventually(t, "hs1 receives carol's message after the restart", wait, func() bool { return sees(alice, room, "after the restart, from hs2") })
	eventually(t, "hs1 and hs2 agree on the state after the restart", wait, func() bool { return norm(alice) == norm(carol) })
	for _, s := range []*fedServer{hs1, hs2} {
		s.stop()
	}

	// What each server stored: the create event has no room_id and no auth
	// events, no other event cites it; each log names the rules that refused.
	for _, s := range []*fedServer{hs1, hs2} {
		n := 0
		stored := roomserverEvents(t, s)
		if c := stored[carolTopic.String()]; slices.Contains(c.PrevEvents, aliceTopic.String()) {
			t.Errorf("%s: carol's topic follows alice's (prev_events %v): no fork to resolve", s.name, c.PrevEvents)
		}
		merged := false
		for _, ev := range stored {
			merged = merged || len(ev.PrevEvents) > 1
		}
		if !merged {
			t.Errorf("%s: no event has two prev_events: the fork was not merged", s.name)
		}
		rooms := map[string]bool{room.String(): true, dm.String(): true}
		creates := 0
		for id, ev := range stored {
			if ev.Type == "m.room.create" {
				creates++
				if !rooms["!"+id[1:]] || ev.RoomID != nil || len(ev.AuthEvents) != 0 {
					t.Errorf("%s: create event %s: names none of the rooms, or room_id %v, auth_events %v", s.name, id, ev.RoomID, ev.AuthEvents)
				}
				continue
			}
			n++
			if ev.RoomID == nil || !rooms[*ev.RoomID] || slices.Contains(ev.AuthEvents, "$"+(*ev.RoomID)[1:]) {
				t.Errorf("%s: event %s (%s): room_id %v, auth_events %v", s.name, id, ev.Type, ev.RoomID, ev.AuthEvents)
			}
		}
		if creates != 2 {
			t.Errorf("%s: %d create events stored, want 2 (two rooms)", s.name, creates)
		}
		b, err := os.ReadFile(filepath.Join(s.dir, "server.log"))
		check(t, "read log", err)
		rules := strings.Count(string(b), "authorization rule ")
		t.Logf("%s: %d events besides the create events stored; its log names an authorization rule %d times", s.name, n, rules)
		if rules == 0 {
			t.Errorf("%s refused a change but its log names no authorization rule (mtxdb's rules not in effect?)", s.name)
		}
		if strings.Contains(string(b), "panic") {
			t.Errorf("%s's log mentions a panic:\n%s", s.name, s.logTail())
		}
	}
}

// badJSON asserts that err is the server refusing with 400 M_BAD_JSON.
func badJSON(t *testing.T, what string, err error) string {
	t.Helper()
	var he mautrix.HTTPError
	if !errors.As(err, &he) || he.Response == nil || he.Response.StatusCode != 400 || !errors.Is(err, mautrix.MBadJSON) {
		t.Fatalf("%s: want 400 M_BAD_JSON, got %v", what, err)
	}
	return what + ": 400 " + he.RespError.ErrCode
}

// stateMember is the membership of user in room as c's server has it ("" if none).
func stateMember(c *mautrix.Client, room id.RoomID, user id.UserID) string {
	var content struct{ Membership string }
	if err := c.StateEvent(context.Background(), room, event.StateMember, user.String(), &content); err != nil {
		return ""
	}
	return content.Membership
}

// storedEvent is what roomserverEvents reads of an event's JSON.
type storedEvent struct {
	Type       string   `json:"type"`
	RoomID     *string  `json:"room_id"`
	AuthEvents []string `json:"auth_events"`
	PrevEvents []string `json:"prev_events"`
}

// roomserverEvents reads the events of s's roomserver database by event ID.
func roomserverEvents(t *testing.T, s *fedServer) map[string]storedEvent {
	var db *sql.DB
	var err error
	if s.dbURL == "" {
		db, err = sql.Open("sqlite3", "file:"+filepath.Join(s.dir, "dendrite_roomserver.db")+"?mode=ro")
	} else {
		db, err = sql.Open("postgres", s.dbURL)
	}
	check(t, "open the roomserver database", err)
	defer db.Close()
	rows, err := db.Query("SELECT e.event_id, j.event_json FROM roomserver_events e JOIN roomserver_event_json j ON e.event_nid = j.event_nid")
	check(t, "read roomserver_event_json", err)
	defer rows.Close()
	out := map[string]storedEvent{}
	for rows.Next() {
		var id, js string
		check(t, "scan", rows.Scan(&id, &js))
		var ev storedEvent
		check(t, "event JSON of "+id, json.Unmarshal([]byte(js), &ev))
		out[id] = ev
	}
	check(t, "rows", rows.Err())
	return out
}
