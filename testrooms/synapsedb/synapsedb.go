// Package synapsedb builds SQLite databases in Synapse's layout from room
// directories (testrooms/real: events.jsonl, events_internal.jsonl,
// expected_state.jsonl, current_state.json, meta.json), for the tests of
// serverdb and mtxdb import --from synapse: and audit.
//
// The tables and columns are those serverdb reads, as Synapse's main schema
// version 72 declares them (synapse/storage/schema/main/full_schemas/72/
// full.sql.sqlite and state/full_schemas/72, https://github.com/element-hq/synapse),
// written here with only the columns read and those Synapse declares NOT NULL;
// schema_version says 72. State groups are written as Synapse stores them: a
// group whose state only adds to or changes the previous distinct group's is
// that group's differences and an edge to it (at most maxDeltaHops edges in a
// row), any other group its whole state.
package synapsedb

import (
	"bufio"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"

	"github.com/mtxdb/mtxdb/serverdb" // and the database/sql drivers it registers: "pgx", "sqlite"
)

// SchemaVersion is the main schema version the databases say they are.
const SchemaVersion = 72

// maxDeltaHops bounds a chain of differences (Synapse bounds its own).
const maxDeltaHops = 50

const ddl = `
CREATE TABLE schema_version( Lock CHAR(1) NOT NULL DEFAULT 'X' UNIQUE, version INTEGER NOT NULL, upgraded BOOL NOT NULL, CHECK (Lock='X') );
CREATE TABLE rooms( room_id TEXT PRIMARY KEY NOT NULL, is_public BOOL, creator TEXT, room_version TEXT, has_auth_chain_index BOOLEAN );
CREATE TABLE events( stream_ordering INTEGER PRIMARY KEY, topological_ordering BIGINT NOT NULL, event_id TEXT NOT NULL, type TEXT NOT NULL, room_id TEXT NOT NULL, processed BOOL NOT NULL, outlier BOOL NOT NULL, depth BIGINT DEFAULT 0 NOT NULL, state_key TEXT DEFAULT NULL, rejection_reason TEXT DEFAULT NULL, UNIQUE (event_id) );
CREATE TABLE event_json( event_id TEXT NOT NULL, room_id TEXT NOT NULL, internal_metadata TEXT NOT NULL, json TEXT NOT NULL, format_version INTEGER, UNIQUE (event_id) );
CREATE TABLE rejections( event_id TEXT NOT NULL, reason TEXT NOT NULL, last_check TEXT NOT NULL, UNIQUE (event_id) );
CREATE TABLE event_to_state_groups( event_id TEXT NOT NULL, state_group BIGINT NOT NULL, UNIQUE (event_id) );
CREATE TABLE state_groups( id BIGINT PRIMARY KEY, room_id TEXT NOT NULL, event_id TEXT NOT NULL );
CREATE TABLE state_groups_state( state_group BIGINT NOT NULL, room_id TEXT NOT NULL, type TEXT NOT NULL, state_key TEXT NOT NULL, event_id TEXT NOT NULL );
CREATE TABLE state_group_edges( state_group BIGINT NOT NULL, prev_state_group BIGINT NOT NULL );
CREATE INDEX state_group_edges_idx ON state_group_edges (state_group);
CREATE INDEX state_groups_state_type_idx ON state_groups_state (state_group, type, state_key);
CREATE TABLE current_state_events( event_id TEXT NOT NULL, room_id TEXT NOT NULL, type TEXT NOT NULL, state_key TEXT NOT NULL, membership TEXT, UNIQUE (event_id), UNIQUE (room_id, type, state_key) );
CREATE TABLE event_forward_extremities( event_id TEXT NOT NULL, room_id TEXT NOT NULL, UNIQUE (event_id, room_id) );
CREATE INDEX events_room_stream on events(room_id, stream_ordering);
`

// Build writes the tables into target, a new SQLite file's path or an empty
// PostgreSQL database's postgres:// URL, with the rooms of roomDirs (distinct
// room IDs), and returns the room IDs in the order given.
func Build(target string, roomDirs []string) ([]string, error) {
	driver, dsn := "sqlite", "file:"+serverdb.SQLitePath(target)
	pg := strings.HasPrefix(target, "postgres://") || strings.HasPrefix(target, "postgresql://")
	if pg {
		driver, dsn = "pgx", target
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	for _, stmt := range strings.Split(ddl, ";") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := db.Exec(stmt); err != nil {
			return nil, fmt.Errorf("synapsedb: %s: %w", strings.TrimSpace(stmt), err)
		}
	}
	sqlTx, err := db.Begin()
	if err != nil {
		return nil, err
	}
	defer sqlTx.Rollback()
	tx := &rebinder{tx: sqlTx, pg: pg}
	if _, err := tx.Exec("INSERT INTO schema_version(version, upgraded) VALUES (?, TRUE)", SchemaVersion); err != nil {
		return nil, err
	}
	var ids []string
	seen := map[string]bool{}
	for _, dir := range roomDirs {
		id, err := addRoom(tx, dir)
		if err != nil {
			return nil, fmt.Errorf("synapsedb: %s: %w", dir, err)
		}
		if seen[id] {
			return nil, fmt.Errorf("synapsedb: %s: room %s is in the database already", dir, id)
		}
		seen[id] = true
		ids = append(ids, id)
	}
	return ids, sqlTx.Commit()
}

// rebinder runs statements written with ? placeholders on either database.
type rebinder struct {
	tx *sql.Tx
	pg bool
	// stream is the last stream_ordering given: events are numbered in the
	// order of their rooms and of events.jsonl (each room's stream order), as
	// the rooms come from different servers' databases.
	stream int64
	// group is the last state group ID given: each room's groups are numbered
	// anew, for the same reason.
	group int64
	stmts map[string]*sql.Stmt // prepared, by query
}

func (r *rebinder) Exec(query string, args ...any) (sql.Result, error) {
	st, ok := r.stmts[query]
	if !ok {
		q := query
		if r.pg {
			q = serverdb.Placeholders(query)
		}
		var err error
		if st, err = r.tx.Prepare(q); err != nil {
			return nil, err
		}
		if r.stmts == nil {
			r.stmts = map[string]*sql.Stmt{}
		}
		r.stmts[query] = st
	}
	return st.Exec(args...)
}

// meta is what Build reads of meta.json.
type meta struct {
	RoomID             string   `json:"room_id"`
	RoomVersion        string   `json:"room_version"`
	ForwardExtremities []string `json:"forward_extremities"`
}

// internal is a line of events_internal.jsonl.
type internal struct {
	EventID    string `json:"event_id"`
	Outlier    bool   `json:"outlier"`
	StateGroup *int64 `json:"state_group"`
	Rejected   any    `json:"rejected"`
}

func addRoom(tx *rebinder, dir string) (string, error) {
	var m meta
	if err := readJSON(filepath.Join(dir, "meta.json"), &m); err != nil {
		return "", err
	}
	if _, err := tx.Exec("INSERT INTO rooms(room_id, room_version) VALUES (?, ?)", m.RoomID, m.RoomVersion); err != nil {
		return "", err
	}
	// events_internal.jsonl (the real rooms'): outliers and rejections; a
	// generated room has none, and its events are neither.
	var in map[string]internal
	if _, err := os.Stat(filepath.Join(dir, "events_internal.jsonl")); err == nil {
		in = map[string]internal{}
		if err := eachLine(filepath.Join(dir, "events_internal.jsonl"), func(b []byte) error {
			var e internal
			err := json.Unmarshal(b, &e)
			in[e.EventID] = e
			return err
		}); err != nil {
			return "", err
		}
	}
	groups, err := addStateGroups(tx, dir, m.RoomID)
	if err != nil {
		return "", err
	}
	if err := addEvents(tx, dir, m, in, groups); err != nil {
		return "", err
	}
	var cur map[string]string // none: the server had left the room (room004_union)
	if err := readJSON(filepath.Join(dir, "current_state.json"), &cur); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	for k, id := range cur {
		t, sk, _ := strings.Cut(k, "\x00")
		if _, err := tx.Exec("INSERT INTO current_state_events(event_id, room_id, type, state_key) VALUES (?, ?, ?, ?)", id, m.RoomID, t, sk); err != nil {
			return "", err
		}
	}
	for _, id := range m.ForwardExtremities {
		if _, err := tx.Exec("INSERT INTO event_forward_extremities(event_id, room_id) VALUES (?, ?)", id, m.RoomID); err != nil {
			return "", err
		}
	}
	return m.RoomID, nil
}

// addEvents writes events, event_json, rejections and event_to_state_groups;
// for room versions 3 and later the PDU is stored without the event_id the room
// directory adds. An event without a recorded state (groups) has no state group,
// except in a generated room (no events_internal.jsonl), which records the state
// of every k-th event only: there an event takes the group of the last event
// before it that has one, so that every event is mapped as in Synapse (the
// database then serves to measure import, not to audit).
func addEvents(tx *rebinder, dir string, m meta, in map[string]internal, groups map[string]int64) error {
	var last int64
	return eachLine(filepath.Join(dir, "events.jsonl"), func(b []byte) error {
		var pdu map[string]json.RawMessage
		if err := json.Unmarshal(b, &pdu); err != nil {
			return err
		}
		var id, typ string
		var stateKey *string
		var depth int64
		json.Unmarshal(pdu["event_id"], &id)
		json.Unmarshal(pdu["type"], &typ)
		json.Unmarshal(pdu["state_key"], &stateKey)
		json.Unmarshal(pdu["depth"], &depth)
		e, ok := in[id]
		if !ok && in != nil {
			return fmt.Errorf("event %s not in events_internal.jsonl", id)
		}
		if m.RoomVersion != "1" && m.RoomVersion != "2" {
			delete(pdu, "event_id")
		}
		js, err := json.Marshal(pdu)
		if err != nil {
			return err
		}
		tx.stream++
		if _, err := tx.Exec(`INSERT INTO events(stream_ordering, topological_ordering, event_id, type, room_id, processed, outlier, depth, state_key)
			VALUES (?, ?, ?, ?, ?, TRUE, ?, ?, ?)`, tx.stream, depth, id, typ, m.RoomID, e.Outlier, depth, stateKey); err != nil {
			return err
		}
		if _, err := tx.Exec("INSERT INTO event_json(event_id, room_id, internal_metadata, json, format_version) VALUES (?, ?, '{}', ?, 3)", id, m.RoomID, string(js)); err != nil {
			return err
		}
		if g, ok := groups[id]; ok {
			last = g
		}
		if g, ok := groups[id]; ok || (in == nil && last != 0) {
			if !ok {
				g = last
			}
			if _, err := tx.Exec("INSERT INTO event_to_state_groups(event_id, state_group) VALUES (?, ?)", id, g); err != nil {
				return err
			}
		}
		if e.Rejected != nil {
			if _, err := tx.Exec("INSERT INTO rejections(event_id, reason, last_check) VALUES (?, ?, '')", id, fmt.Sprint(e.Rejected)); err != nil {
				return err
			}
		}
		return nil
	})
}

// addStateGroups writes each distinct state group of expected_state.jsonl and
// returns the group of each event recorded there.
func addStateGroups(tx *rebinder, dir, roomID string) (map[string]int64, error) {
	groups := map[string]int64{}
	var prev map[string]string
	var prevGroup int64
	hops := 0
	ids := map[int64]int64{} // the room's own group -> the database's
	var own int64            // groups of lines without one: -1, -2, ...
	return groups, eachLine(filepath.Join(dir, "expected_state.jsonl"), func(b []byte) error {
		var l struct {
			EventID    string            `json:"event_id"`
			StateGroup int64             `json:"state_group"`
			State      map[string]string `json:"state"`
		}
		if err := json.Unmarshal(b, &l); err != nil {
			return err
		}
		if l.StateGroup == 0 { // a generated room's lines name no group: one per distinct state in a row
			if prev == nil || !maps.Equal(prev, l.State) {
				own--
			}
			l.StateGroup = own
		}
		id, written := ids[l.StateGroup]
		if !written {
			tx.group++
			id, ids[l.StateGroup] = tx.group, tx.group
		}
		l.StateGroup = id
		groups[l.EventID] = id
		if written {
			return nil
		}
		if _, err := tx.Exec("INSERT INTO state_groups(id, room_id, event_id) VALUES (?, ?, ?)", l.StateGroup, roomID, l.EventID); err != nil {
			return err
		}
		rows := l.State
		if prev != nil && hops < maxDeltaHops && extends(l.State, prev) {
			rows = map[string]string{}
			for k, v := range l.State {
				if prev[k] != v {
					rows[k] = v
				}
			}
			if _, err := tx.Exec("INSERT INTO state_group_edges(state_group, prev_state_group) VALUES (?, ?)", l.StateGroup, prevGroup); err != nil {
				return err
			}
			hops++
		} else {
			hops = 0
		}
		for k, id := range rows {
			t, sk, _ := strings.Cut(k, "\x00")
			if _, err := tx.Exec("INSERT INTO state_groups_state(state_group, room_id, type, state_key, event_id) VALUES (?, ?, ?, ?, ?)", l.StateGroup, roomID, t, sk, id); err != nil {
				return err
			}
		}
		prev, prevGroup = l.State, id
		return nil
	})
}

// extends reports whether st has every key of prev.
func extends(st, prev map[string]string) bool {
	for k := range prev {
		if _, ok := st[k]; !ok {
			return false
		}
	}
	return true
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func eachLine(path string, fn func([]byte) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		if len(strings.TrimSpace(sc.Text())) == 0 {
			continue
		}
		if err := fn(sc.Bytes()); err != nil {
			return err
		}
	}
	return sc.Err()
}
