// Package e2e starts real Dendrite v0.13.8 servers on loopback, the stock build and
// the one whose state snapshots and blocks live in mtxdb (make dendrite), drives both
// through the client-server API with mautrix (maunium.net/go/mautrix), and compares
// their answers, before and after a restart. Run by make test-dendrite-e2e, which
// builds the servers and sets MTXDB_DENDRITE_BIN (and MTXDB_PG_URL for PostgreSQL);
// without MTXDB_DENDRITE_BIN the test is skipped.
package e2e

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/lib/pq"
	_ "github.com/mattn/go-sqlite3"
	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"
)

// server is one Dendrite process and its directory.
type server struct {
	t      *testing.T
	name   string
	bin    string // directory of dendrite, generate-config, generate-keys, create-account
	dir    string
	env    []string
	url    string
	cmd    *exec.Cmd
	exited chan error
	// httpsPort, when set, is the port of the HTTPS listener (else a free one), and
	// tlsCert/tlsKey its certificate and key files (Dendrite serves HTTPS only with both).
	httpsPort       int
	tlsCert, tlsKey string
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", filepath.Base(name), args, err, out)
	}
	return string(out)
}

// newServer writes keys and a configuration (federation off, registration open,
// rate limits off: generate-config -ci) for a server on dbURL ("" = SQLite files).
func newServer(t *testing.T, name, bin, dbURL string, env []string) *server {
	return configureServer(t, filepath.Join(t.TempDir(), name), name, "localhost", bin, dbURL, env, func(cfg string) string {
		cfg = strings.Replace(cfg, "disable_federation: false", "disable_federation: true", 1)
		return setLogLevel(cfg, "warn")
	})
}

// configureServer writes keys and generate-config -ci's configuration for server
// name serverName into dir, passed through edit, for a server on dbURL ("" = SQLite).
func configureServer(t *testing.T, dir, name, serverName, bin, dbURL string, env []string, edit func(string) string) *server {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, dir, env, filepath.Join(bin, "generate-keys"), "-private-key", "matrix_key.pem")
	args := []string{"-ci", "-dir", dir, "-server", serverName}
	if dbURL != "" {
		args = append(args, "-db", dbURL)
	}
	cfg := edit(run(t, dir, env, filepath.Join(bin, "generate-config"), args...))
	if err := os.WriteFile(filepath.Join(dir, "dendrite.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, name: name, bin: bin, dir: dir, env: env}
	t.Cleanup(s.stop)
	return s
}

// setLogLevel sets the level of generate-config's log hook (trace) to level.
func setLogLevel(cfg, level string) string {
	return regexp.MustCompile(`(?m)^(\s+)level: trace$`).ReplaceAllString(cfg, "${1}level: "+level)
}

// start runs the server and waits until /versions answers; it returns the error of
// a server that exited instead (with the end of its log).
func (s *server) start() error {
	port := freePort(s.t)
	s.url = fmt.Sprintf("http://127.0.0.1:%d", port)
	logf, err := os.OpenFile(filepath.Join(s.dir, "server.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	httpsPort := s.httpsPort
	if httpsPort == 0 {
		httpsPort = freePort(s.t)
	}
	args := []string{"-config", "dendrite.yaml", "-really-enable-open-registration",
		"-http-bind-address", fmt.Sprintf("127.0.0.1:%d", port), "-https-bind-address", fmt.Sprintf("127.0.0.1:%d", httpsPort)}
	if s.tlsCert != "" {
		args = append(args, "-tls-cert", s.tlsCert, "-tls-key", s.tlsKey)
	}
	s.cmd = exec.Command(filepath.Join(s.bin, "dendrite"), args...)
	s.cmd.Dir = s.dir
	s.cmd.Env = append(os.Environ(), s.env...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	s.exited = make(chan error, 1)
	go func() { s.exited <- s.cmd.Wait(); logf.Close() }()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-s.exited:
			s.cmd = nil
			return fmt.Errorf("%s exited (%v); log:\n%s", s.name, err, s.logTail())
		default:
		}
		resp, err := http.Get(s.url + "/_matrix/client/versions")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	s.stop()
	return fmt.Errorf("%s did not answer within 90 s; log:\n%s", s.name, s.logTail())
}

func (s *server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

func (s *server) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.cmd = nil
}

// world is what the workload made: the users' clients and the rooms in creation order.
type world struct {
	alice, bob, carol *mautrix.Client
	rooms             []id.RoomID
	forbidden         []string
	// last is, per room, the ID of the workload's last event (a message by alice).
	last []id.EventID
}

func client(t *testing.T, s *server) *mautrix.Client {
	c, err := mautrix.NewClient(s.url, "", "")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// res carries a call's two results to or, which fails the test on an error.
type res[T any] struct {
	v   T
	err error
}

func m[T any](v T, err error) res[T] { return res[T]{v, err} }

func (r res[T]) or(t *testing.T, what string) T {
	t.Helper()
	if r.err != nil {
		t.Fatalf("%s: %v", what, r.err)
	}
	return r.v
}

func check(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// forbidden asserts that err is the server refusing with 403 M_FORBIDDEN.
func forbidden(t *testing.T, what string, err error) string {
	t.Helper()
	var he mautrix.HTTPError
	if !errors.As(err, &he) || he.Response == nil || he.Response.StatusCode != 403 || !errors.Is(err, mautrix.MForbidden) {
		t.Fatalf("%s: want 403 M_FORBIDDEN, got %v", what, err)
	}
	return what + ": 403 " + he.RespError.ErrCode
}

// drive registers three users (alice through create-account, bob and carol through
// /register) and runs the same room history on a server.
func drive(t *testing.T, s *server) *world {
	ctx := context.Background()
	w := &world{}
	run(t, s.dir, s.env, filepath.Join(s.bin, "create-account"), "-config", "dendrite.yaml", "-url", s.url,
		"-username", "alice", "-password", "alice-password-1", "-admin")
	w.alice = client(t, s)
	m(w.alice.Login(ctx, &mautrix.ReqLogin{Type: mautrix.AuthTypePassword,
		Identifier: mautrix.UserIdentifier{Type: mautrix.IdentifierTypeUser, User: "alice"}, Password: "alice-password-1", StoreCredentials: true})).or(t, "login alice")
	reg := func(name string) *mautrix.Client {
		c := client(t, s)
		r := m(c.RegisterDummy(ctx, &mautrix.ReqRegister[any]{Username: name, Password: name + "-password-1"})).or(t, "register "+name)
		c.SetCredentials(r.UserID, r.AccessToken)
		return c
	}
	w.bob, w.carol = reg("bob"), reg("carol")
	bobID, carolID := w.bob.UserID, w.carol.UserID

	r1 := m(w.alice.CreateRoom(ctx, &mautrix.ReqCreateRoom{Preset: "public_chat", Name: "Room one", Topic: "first topic", RoomVersion: "10"})).or(t, "create room 1").RoomID
	r2 := m(w.alice.CreateRoom(ctx, &mautrix.ReqCreateRoom{Preset: "private_chat", Name: "Room two", Invite: []id.UserID{bobID}})).or(t, "create room 2").RoomID
	w.rooms = []id.RoomID{r1, r2}
	send := func(c *mautrix.Client, r id.RoomID, typ event.Type, key string, content any) {
		t.Helper()
		m(c.SendStateEvent(ctx, r, typ, key, content)).or(t, fmt.Sprintf("%s sets %s/%q", c.UserID, typ.Type, key))
	}
	text := func(c *mautrix.Client, r id.RoomID, msg string) {
		t.Helper()
		m(c.SendText(ctx, r, msg)).or(t, "message")
	}
	m(w.bob.JoinRoomByID(ctx, r1)).or(t, "bob joins 1")
	m(w.carol.JoinRoomByID(ctx, r1)).or(t, "carol joins 1")
	text(w.alice, r1, "hello")
	send(w.alice, r1, event.StateTopic, "", map[string]any{"topic": "second topic"})
	send(w.alice, r1, event.StateRoomName, "", map[string]any{"name": "Room one, renamed"})
	pl := m(w.alice.State(ctx, r1)).or(t, "power levels")[event.StatePowerLevels][""]
	var plc map[string]any
	check(t, "power levels content", json.Unmarshal(pl.Content.VeryRaw, &plc))
	users := plc["users"].(map[string]any)
	users[bobID.String()] = 50
	send(w.alice, r1, event.StatePowerLevels, "", plc)
	text(w.bob, r1, "thanks")
	send(w.bob, r1, event.StateTopic, "", map[string]any{"topic": "bob's topic"})
	// bob (50) may not give himself 100, nor change the power levels at all (needs 100).
	users[bobID.String()] = 100
	_, err := w.bob.SendStateEvent(ctx, r1, event.StatePowerLevels, "", plc)
	w.forbidden = append(w.forbidden, forbidden(t, "bob raises his own power level", err))
	_, err = w.carol.SendStateEvent(ctx, r1, event.StateRoomName, "", map[string]any{"name": "carol's name"})
	w.forbidden = append(w.forbidden, forbidden(t, "carol (0) renames the room", err))
	send(w.alice, r1, event.StateJoinRules, "", map[string]any{"join_rule": "invite"})
	m(w.carol.LeaveRoom(ctx, r1)).or(t, "carol leaves 1")
	_, err = w.carol.JoinRoomByID(ctx, r1)
	w.forbidden = append(w.forbidden, forbidden(t, "carol rejoins an invite-only room", err))
	m(w.alice.InviteUser(ctx, r1, &mautrix.ReqInviteUser{UserID: carolID})).or(t, "alice invites carol")
	m(w.carol.JoinRoomByID(ctx, r1)).or(t, "carol joins 1 again")
	for i := 0; i < 5; i++ {
		text(w.carol, r1, fmt.Sprintf("message %d", i))
		send(w.alice, r1, event.NewEventType("org.example.counter"), fmt.Sprintf("k%d", i%2), map[string]any{"n": i})
	}
	m(w.bob.LeaveRoom(ctx, r1)).or(t, "bob leaves 1")

	m(w.bob.JoinRoomByID(ctx, r2)).or(t, "bob joins 2")
	send(w.alice, r2, event.StateTopic, "", map[string]any{"topic": "two"})
	text(w.bob, r2, "in room two")
	_, err = w.bob.SendStateEvent(ctx, r2, event.StateTopic, "", map[string]any{"topic": "bob in two"})
	w.forbidden = append(w.forbidden, forbidden(t, "bob (0) sets the topic of room 2", err))
	for _, r := range w.rooms {
		w.last = append(w.last, m(w.alice.SendText(ctx, r, "end of workload")).or(t, "last message").EventID)
	}
	return w
}

// settle waits until /messages of every room starts at the workload's last event:
// Dendrite's sync API learns events asynchronously (through NATS JetStream), so
// answers read right after the writes may lag, on stock builds too.
func settle(t *testing.T, w *world) {
	ctx := context.Background()
	for i, r := range w.rooms {
		deadline := time.Now().Add(60 * time.Second)
		for {
			msgs := m(w.alice.Messages(ctx, r, "", "", mautrix.DirectionBackward, nil, 1)).or(t, "messages")
			if len(msgs.Chunk) > 0 && msgs.Chunk[0].ID == w.last[i] {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("room %d: /messages does not reach the last event %s within 60 s", i+1, w.last[i])
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// answers reads /state, /joined_members and /messages of every room as alice,
// normalised: room IDs by creation order, event IDs, timestamps, unsigned and
// pagination tokens left out.
func answers(t *testing.T, w *world) map[string]string {
	settle(t, w)
	ctx := context.Background()
	out := map[string]string{}
	norm := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		for i, r := range w.rooms {
			s = strings.ReplaceAll(s, r.String(), fmt.Sprintf("!room%d", i+1))
		}
		return s
	}
	ev := func(e *event.Event) map[string]any {
		var content any
		_ = json.Unmarshal(e.Content.VeryRaw, &content)
		m := map[string]any{"type": e.Type.Type, "sender": e.Sender, "content": content}
		if e.StateKey != nil {
			m["state_key"] = *e.StateKey
		}
		return m
	}
	for i, r := range w.rooms {
		st := m(w.alice.State(ctx, r)).or(t, "state")
		var list []map[string]any
		for _, byKey := range st {
			for _, e := range byKey {
				list = append(list, ev(e))
			}
		}
		sort.Slice(list, func(a, b int) bool {
			return fmt.Sprint(list[a]["type"], "\x00", list[a]["state_key"]) < fmt.Sprint(list[b]["type"], "\x00", list[b]["state_key"])
		})
		out[fmt.Sprintf("room%d /state", i+1)] = norm(list)
		out[fmt.Sprintf("room%d /joined_members", i+1)] = norm(m(w.alice.JoinedMembers(ctx, r)).or(t, "joined members").Joined)
		msgs := m(w.alice.Messages(ctx, r, "", "", mautrix.DirectionBackward, nil, 100)).or(t, "messages")
		var chunk []map[string]any
		for _, e := range msgs.Chunk {
			chunk = append(chunk, ev(e))
		}
		out[fmt.Sprintf("room%d /messages", i+1)] = norm(chunk)
		// /state/m.room.member/{user} for every member key of the state.
		for key := range st[event.StateMember] {
			var c map[string]any
			check(t, "member event", w.alice.StateEvent(ctx, r, event.StateMember, key, &c))
			out[fmt.Sprintf("room%d /state/m.room.member/%s", i+1, key)] = norm(c)
		}
	}
	for _, f := range w.forbidden {
		out["refused: "+f] = f
	}
	return out
}

func sqlCount(t *testing.T, db *sql.DB, table string) int {
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

// stateRows counts the rows of the roomserver's SQL snapshot and block tables.
func stateRows(t *testing.T, s *server, pgURL string) (snapshots, blocks int) {
	var db *sql.DB
	var err error
	if pgURL == "" {
		db, err = sql.Open("sqlite3", "file:"+filepath.Join(s.dir, "dendrite_roomserver.db")+"?mode=ro")
	} else {
		db, err = sql.Open("postgres", pgURL)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	return sqlCount(t, db, "roomserver_state_snapshots"), sqlCount(t, db, "roomserver_state_block")
}

// mtxdbRows counts the rows and payload bytes of mtxdb_records (pgstore's table) in
// the PostgreSQL database at url.
func mtxdbRows(t *testing.T, url string) (rows, bytes int64) {
	db, err := sql.Open("postgres", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.QueryRow("SELECT count(*), coalesce(sum(length(data)), 0) FROM mtxdb_records").Scan(&rows, &bytes); err != nil {
		t.Fatalf("count mtxdb_records: %v", err)
	}
	return rows, bytes
}

// sharedTransactions counts the transactions (xmin, the ID of the transaction that
// wrote a row version) that wrote rows of mtxdb_records but lease records, and how many of them also
// wrote a row version of roomserver_events that is still current: Dendrite's room
// updater marks an event sent (roomserver_events) in the transaction in which it
// stores the state after it, so each state change that made a new snapshot should
// show one.
func sharedTransactions(t *testing.T, url string) (shared, total int) {
	db, err := sql.Open("postgres", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// Lease records (NID ranges) are committed on their own (statetables/doc.go):
	// left out. Their ID: SHA-256("mtxdb/dendrite/state/lease")[:16].
	lease := sha256.Sum256([]byte("mtxdb/dendrite/state/lease"))
	err = db.QueryRow(`SELECT count(DISTINCT m.xmin::text) FILTER (WHERE m.xmin::text IN (SELECT e.xmin::text FROM roomserver_events e)),
		count(DISTINCT m.xmin::text) FROM mtxdb_records m WHERE m.id <> $1`, lease[:16]).Scan(&shared, &total)
	if err != nil {
		t.Fatalf("transactions of mtxdb_records: %v", err)
	}
	return shared, total
}

// dirBytes is the size of the files under dir; the test fails when there are none.
func dirBytes(t *testing.T, dir string) int64 {
	var n int64
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return err
	})
	if err != nil || n == 0 {
		t.Errorf("mtxdb state store %s: %d bytes, %v", dir, n, err)
	}
	return n
}

// pgDatabase creates a fresh database on the server of MTXDB_PG_URL and returns its URL.
func pgDatabase(t *testing.T, base, name string) string {
	db, err := sql.Open("postgres", base)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	name = fmt.Sprintf("%s_%d", name, time.Now().UnixNano())
	if _, err := db.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("postgres", base)
		if err == nil {
			_, _ = db.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)")
			db.Close()
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

func TestStockAndMtxdbAgree(t *testing.T) {
	forBackends(t, "test-dendrite-e2e", func(t *testing.T, bin, backend, pg string) {
		var stockURL, mtxdbURL string
		var env []string
		if backend == "postgres" {
			stockURL, mtxdbURL = pgDatabase(t, pg, "e2e_stock"), pgDatabase(t, pg, "e2e_mtxdb")
		}
		stock := newServer(t, "stock", filepath.Join(bin, "stock"), stockURL, nil)
		dir := t.TempDir()
		legacyBase := filepath.Join(dir, "mtxdb-state")
		if backend == "postgres" {
			// A PostgreSQL Dendrite keeps its state in its database; where earlier
			// versions put a store directory (under MTXDB_DENDRITE_STATE_BASE)
			// nothing may appear.
			env = []string{"MTXDB_DENDRITE_STATE_BASE=" + legacyBase, "MTXDB_DENDRITE_STATE_DIR="}
		}
		swapped := newServer(t, "mtxdb", bin, mtxdbURL, env)
		results := map[string][2]map[string]string{}
		var stockWorld []*world
		for _, s := range []*server{stock, swapped} {
			if err := s.start(); err != nil {
				t.Fatal(err)
			}
			w := drive(t, s)
			if s == stock {
				stockWorld = append(stockWorld, w)
			}
			before := answers(t, w)
			s.stop()
			if err := s.start(); err != nil {
				t.Fatal(err)
			}
			for _, c := range []*mautrix.Client{w.alice, w.bob, w.carol} {
				c.HomeserverURL, _ = url.Parse(s.url)
			}
			after := answers(t, w)
			s.stop()
			results[s.name] = [2]map[string]string{before, after}
		}
		n := 0
		for name, want := range results["stock"][0] {
			for i, label := range []string{"before restart", "after restart"} {
				got := results["mtxdb"][i][name]
				if got != want {
					t.Errorf("%s %s:\n stock: %s\n mtxdb: %s", name, label, want, got)
				}
				if results["stock"][i][name] != want {
					t.Errorf("stock %s changed across the restart", name)
				}
				n++
			}
		}
		if len(results["mtxdb"][0]) != len(results["stock"][0]) {
			t.Errorf("%d answers from mtxdb, %d from stock", len(results["mtxdb"][0]), len(results["stock"][0]))
		}
		t.Logf("%s: %d answers compared (%d kinds, before and after a restart), stock and mtxdb equal unless reported above", backend, n, len(results["stock"][0]))

		stockSnap, stockBlocks := stateRows(t, stock, stockURL)
		snap, blocks := stateRows(t, swapped, mtxdbURL)
		t.Logf("%s: SQL roomserver_state_snapshots/roomserver_state_block rows: stock %d/%d, mtxdb %d/%d", backend, stockSnap, stockBlocks, snap, blocks)
		if stockSnap == 0 || stockBlocks == 0 {
			t.Errorf("stock server wrote no SQL state rows: the check below would prove nothing")
		}
		if snap != 0 || blocks != 0 {
			t.Errorf("mtxdb server wrote state to SQL: %d snapshots, %d blocks", snap, blocks)
		}
		if backend == "postgres" {
			rows, bytes := mtxdbRows(t, mtxdbURL)
			t.Logf("%s: mtxdb state in the roomserver's own database: %d rows in mtxdb_records (%d payload bytes)", backend, rows, bytes)
			if rows == 0 {
				t.Errorf("the PostgreSQL Dendrite wrote no state rows to mtxdb_records in its database")
			}
			shared, total := sharedTransactions(t, mtxdbURL)
			t.Logf("%s: %d of the %d transactions that wrote mtxdb_records rows (lease records aside) also wrote roomserver_events rows (same xmin): snapshots committed with Dendrite's rows", backend, shared, total)
			if shared == 0 {
				t.Errorf("no mtxdb_records row was written in a transaction of Dendrite's that also wrote roomserver_events: the state is not written in Dendrite's transactions")
			}
			if _, err := os.Stat(legacyBase); !os.IsNotExist(err) {
				t.Errorf("the PostgreSQL Dendrite made a store directory %s (%v): its state belongs in its database", legacyBase, err)
			}
		} else {
			storeDir := filepath.Join(swapped.dir, "dendrite_roomserver.db.mtxdb-state")
			t.Logf("%s: mtxdb state store %s: %d bytes", backend, storeDir, dirBytes(t, storeDir))
		}

		// The refused changes are refused by mtxdb's rules (roomrules), and the
		// mtxdb server's log names the rule (stock's log has none of it).
		for _, s := range []*server{stock, swapped} {
			b, err := os.ReadFile(filepath.Join(s.dir, "server.log"))
			if err != nil {
				t.Fatal(err)
			}
			n := strings.Count(string(b), "authorization rule ")
			t.Logf("%s: %s's log names an authorization rule %d times", backend, s.name, n)
			if s == swapped && n == 0 {
				t.Errorf("the mtxdb server refused changes but its log names no authorization rule (mtxdb's rules not in effect?):\n%s", s.logTail())
			}
		}

		// The startup guard: the mtxdb build refuses the stock server's database,
		// whose state is in SQL, instead of failing every state request later.
		// SQLite: a store directory of its own; PostgreSQL: the database itself.
		migrated := filepath.Join(t.TempDir(), "migrated-state")
		onStockEnv := []string{"MTXDB_DENDRITE_STATE_DIR=" + migrated}
		if backend == "postgres" {
			onStockEnv = env
		}
		onStock := &server{t: t, name: "mtxdb-on-stock-db", bin: bin, dir: stock.dir, env: onStockEnv}
		t.Cleanup(onStock.stop)
		err := onStock.start()
		if err == nil {
			onStock.stop()
			t.Fatal("the mtxdb build started on an unmigrated database")
		}
		if !strings.Contains(err.Error(), "mtxdb-dendrite-migrate") {
			t.Fatalf("unmigrated database: the server exited without naming the migration: %v", err)
		}
		t.Logf("%s: unmigrated database refused: %s", backend, regexp.MustCompile(`statetables: [^"]*`).FindString(err.Error()))

		// The migration of the stock database: then the mtxdb build on it gives
		// stock's answers.
		args := []string{"-db", "file:" + filepath.Join(stock.dir, "dendrite_roomserver.db"), "-store", migrated}
		if backend == "postgres" {
			args = []string{"-db", stockURL} // into the database's own mtxdb tables
		}
		out := run(t, stock.dir, onStockEnv, filepath.Join(bin, "mtxdb-dendrite-migrate"), args...)
		t.Logf("%s: %s", backend, strings.TrimSpace(out))
		if backend == "postgres" {
			rows, _ := mtxdbRows(t, stockURL)
			t.Logf("%s: migrated into the stock database's mtxdb_records: %d rows", backend, rows)
			if rows == 0 {
				t.Errorf("the migration wrote no rows to the stock database's mtxdb_records")
			}
		}
		if err := onStock.start(); err != nil {
			t.Fatal(err)
		}
		w := stockWorld[0]
		for _, c := range []*mautrix.Client{w.alice, w.bob, w.carol} {
			c.HomeserverURL, _ = url.Parse(onStock.url)
		}
		got := answers(t, w)
		onStock.stop()
		for name, want := range results["stock"][0] {
			if got[name] != want {
				t.Errorf("after migration, %s:\n stock: %s\n mtxdb: %s", name, want, got[name])
			}
		}
		t.Logf("%s: after migration, the mtxdb build on the stock database: %d answers compared with stock's", backend, len(got))
	})
}

// forBackends runs f as a subtest per database, "sqlite" and "postgres", with the
// patched build's directory (MTXDB_DENDRITE_BIN; the test is skipped without it)
// and the PostgreSQL server's URL (MTXDB_PG_URL; the postgres subtest is skipped
// without it). target names the make target that sets both.
func forBackends(t *testing.T, target string, f func(t *testing.T, bin, backend, pg string)) {
	bin := os.Getenv("MTXDB_DENDRITE_BIN")
	if bin == "" {
		t.Skipf("MTXDB_DENDRITE_BIN is not set: make %s builds Dendrite (make dendrite) and runs this test", target)
	}
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			pg := os.Getenv("MTXDB_PG_URL")
			if backend == "postgres" && pg == "" {
				t.Skipf("MTXDB_PG_URL is not set: make %s starts a PostgreSQL (scripts/pgserver.sh) and sets it", target)
			}
			f(t, bin, backend, pg)
		})
	}
}

// envCount is the integer in environment variable name, def when it is unset;
// the test fails on a value that is not an integer of at least min.
func envCount(t *testing.T, name string, def, min int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min {
		t.Fatalf("%s=%q: want an integer >= %d", name, v, min)
	}
	return n
}
