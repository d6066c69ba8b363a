package serverdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/mtxdb/mtxdb/recorded"
)

// The Synapse main schema versions read (schema_version.version).
const (
	SynapseMinSchema = 72
	SynapseMaxSchema = 92
)

// ErrNotSynapse is returned (wrapped, saying what is missing) for a database
// that is not a Synapse database of a supported schema version.
var ErrNotSynapse = errors.New("serverdb: not a Synapse database this version reads")

// Room is one room of a server's database.
type Room struct {
	ID      string
	Version string // room version (rooms.room_version)
	Events  int    // events rows, outliers included
}

// Synapse is an open Synapse database. Not safe for concurrent use.
type Synapse struct {
	database
	schema int
}

// OpenSynapse opens a Synapse database read-only: target is a SQLite file path
// or a postgres:// (postgresql://) URL. Errors: the database cannot be opened or
// read, or is not Synapse's (ErrNotSynapse, naming the missing table or
// column, or the unsupported version).
func OpenSynapse(ctx context.Context, target string) (*Synapse, error) {
	s := &Synapse{}
	if err := s.open(ctx, "Synapse", target); err != nil {
		return nil, err
	}
	if err := s.check(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Schema is the database's main schema version.
func (s *Synapse) Schema() int { return s.schema }

// synapseColumns are the tables and columns read (doc.go).
var synapseColumns = [][2]string{
	{"rooms", "room_id, room_version"},
	{"events", "event_id, room_id, stream_ordering, outlier"},
	{"event_json", "event_id, json"},
	{"event_to_state_groups", "event_id, state_group"},
	{"state_group_edges", "state_group, prev_state_group"},
	{"state_groups_state", "state_group, type, state_key, event_id"},
	{"current_state_events", "room_id, type, state_key, event_id"},
	{"event_forward_extremities", "room_id, event_id"},
}

// check reads the schema version and probes every table and column read.
func (s *Synapse) check(ctx context.Context) error {
	var v string
	if err := s.tx.QueryRowContext(ctx, "SELECT version FROM schema_version").Scan(&v); err != nil {
		if notTheSchema(err) || errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: %s: schema_version: %v", ErrNotSynapse, s.where, err)
		}
		return fmt.Errorf("serverdb: %s: cannot read schema_version: %w", s.where, err)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return fmt.Errorf("%w: %s: schema_version.version is %q", ErrNotSynapse, s.where, v)
	}
	s.schema = n
	if n < SynapseMinSchema || n > SynapseMaxSchema {
		return fmt.Errorf("%w: %s: main schema version %d, this version of mtxdb reads %d to %d", ErrNotSynapse, s.where, n, SynapseMinSchema, SynapseMaxSchema)
	}
	return s.probe(ctx, ErrNotSynapse, synapseColumns)
}

// Rooms lists the database's rooms with their versions and event counts, by
// room ID. A room without a version is an error naming it.
func (s *Synapse) Rooms(ctx context.Context) ([]Room, error) {
	rows, err := s.tx.QueryContext(ctx, `SELECT r.room_id, r.room_version, COUNT(e.event_id)
		FROM rooms r LEFT JOIN events e ON e.room_id = r.room_id
		GROUP BY r.room_id, r.room_version ORDER BY r.room_id`)
	if err != nil {
		return nil, fmt.Errorf("serverdb: %s: rooms: %w", s.where, err)
	}
	defer rows.Close()
	var out []Room
	for rows.Next() {
		var r Room
		var v sql.NullString
		if err := rows.Scan(&r.ID, &v, &r.Events); err != nil {
			return nil, fmt.Errorf("serverdb: %s: rooms: %w", s.where, err)
		}
		if !v.Valid || v.String == "" {
			return nil, fmt.Errorf("serverdb: %s: room %s has no room_version", s.where, r.ID)
		}
		r.Version = v.String
		out = append(out, r)
	}
	return out, rows.Err()
}

// PDUs calls fn with the room's PDUs (event_json.json) in stream order.
func (s *Synapse) PDUs(ctx context.Context, roomID string, fn func(eventID string, pdu []byte) error) error {
	rows, err := s.tx.QueryContext(ctx, s.q(`SELECT e.event_id, j.json FROM events e
		JOIN event_json j ON j.event_id = e.event_id
		WHERE e.room_id = ? ORDER BY e.stream_ordering`), roomID)
	if err != nil {
		return fmt.Errorf("serverdb: %s: events of room %s: %w", s.where, roomID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var js []byte
		if err := rows.Scan(&id, &js); err != nil {
			return fmt.Errorf("serverdb: %s: events of room %s: %w", s.where, roomID, err)
		}
		if err := fn(id, js); err != nil {
			return err
		}
	}
	return rows.Err()
}

// RecordedState calls fn, in stream order, with each event of the room that has
// a state group and the state after it ("type\x00state_key" -> event ID; the
// map is the group's, shared by the events of that group: not to be changed).
// Memory: the room's (event, group) pairs and at most groupCacheSize states.
// Errors name the group: a cycle of edges, a group without rows or edge.
func (s *Synapse) RecordedState(ctx context.Context, roomID string, fn func(eventID string, group int64, state map[string]string) error) error {
	evs, err := s.eventGroups(ctx, roomID)
	if err != nil {
		return err
	}
	groups, _ := lru.New[int64, map[string]string](groupCacheSize)
	for _, e := range evs {
		st, err := s.group(ctx, e.group, groups)
		if err != nil {
			return fmt.Errorf("serverdb: %s: room %s, event %s: %w", s.where, roomID, e.id, err)
		}
		if err := fn(e.id, e.group, st); err != nil {
			return err
		}
	}
	return nil
}

// groupCacheSize bounds the expanded state groups kept while a room is read: a
// group's differences are mostly from a recent group (Synapse's delta chains
// are short), so a few suffice and memory stays bounded by that many states.
const groupCacheSize = 64

// group expands a state group: its chain of edges down to a group without one
// or one in memo, then each group's rows applied back up; expanded groups enter
// memo.
func (s *Synapse) group(ctx context.Context, g int64, memo *lru.Cache[int64, map[string]string]) (map[string]string, error) {
	var chain []int64
	seen := map[int64]bool{}
	var base map[string]string
	for cur := g; ; {
		if st, ok := memo.Get(cur); ok {
			base = st
			break
		}
		if seen[cur] {
			return nil, fmt.Errorf("state group %d: its edges make a cycle through group %d", g, cur)
		}
		seen[cur] = true
		chain = append(chain, cur)
		var prev int64
		err := s.tx.QueryRowContext(ctx, s.q("SELECT prev_state_group FROM state_group_edges WHERE state_group = ?"), cur).Scan(&prev)
		if errors.Is(err, sql.ErrNoRows) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("state group %d: edges: %w", cur, err)
		}
		cur = prev
	}
	for i := len(chain) - 1; i >= 0; i-- {
		st := make(map[string]string, len(base))
		for k, v := range base {
			st[k] = v
		}
		if err := s.groupRows(ctx, chain[i], st); err != nil {
			return nil, err
		}
		memo.Add(chain[i], st)
		base = st
	}
	return base, nil
}

// groupRows applies a group's state_groups_state rows to st. On SQLite a row
// comes as one column, type, state_key and event_id joined by NULs (fewer
// columns to decode: the rows are most of what an import reads besides the
// PDUs); PostgreSQL text cannot hold a NUL, so there it is three.
func (s *Synapse) groupRows(ctx context.Context, g int64, st map[string]string) error {
	query := "SELECT type || char(0) || state_key || char(0) || event_id FROM state_groups_state WHERE state_group = ?"
	if s.pg {
		query = "SELECT type, state_key, event_id FROM state_groups_state WHERE state_group = $1"
	}
	rows, err := s.tx.QueryContext(ctx, query, g)
	if err != nil {
		return fmt.Errorf("state group %d: %w", g, err)
	}
	defer rows.Close()
	for rows.Next() {
		var t, k, id string
		if s.pg {
			err = rows.Scan(&t, &k, &id)
		} else if err = rows.Scan(&t); err == nil {
			// type NUL state_key NUL event_id: event IDs hold no NUL, so the
			// last one ends the key.
			cut := strings.LastIndexByte(t, 0)
			if cut < 0 || strings.IndexByte(t, 0) == cut {
				return fmt.Errorf("state group %d: a row without a type, state_key and event_id", g)
			}
			st[t[:cut]] = t[cut+1:]
			continue
		}
		if err != nil {
			return fmt.Errorf("state group %d: %w", g, err)
		}
		st[t+"\x00"+k] = id
	}
	return rows.Err()
}

// CurrentState is the room's current_state_events ("type\x00state_key" ->
// event ID; empty when the server left the room).
func (s *Synapse) CurrentState(ctx context.Context, roomID string) (map[string]string, error) {
	rows, err := s.tx.QueryContext(ctx, s.q("SELECT type, state_key, event_id FROM current_state_events WHERE room_id = ?"), roomID)
	if err != nil {
		return nil, fmt.Errorf("serverdb: %s: current state of room %s: %w", s.where, roomID, err)
	}
	defer rows.Close()
	st := map[string]string{}
	for rows.Next() {
		var t, k, id string
		if err := rows.Scan(&t, &k, &id); err != nil {
			return nil, fmt.Errorf("serverdb: %s: current state of room %s: %w", s.where, roomID, err)
		}
		st[t+"\x00"+k] = id
	}
	return st, rows.Err()
}

// ForwardExtremities is the room's event_forward_extremities, sorted.
func (s *Synapse) ForwardExtremities(ctx context.Context, roomID string) ([]string, error) {
	rows, err := s.tx.QueryContext(ctx, s.q("SELECT event_id FROM event_forward_extremities WHERE room_id = ? ORDER BY event_id"), roomID)
	if err != nil {
		return nil, fmt.Errorf("serverdb: %s: forward extremities of room %s: %w", s.where, roomID, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// RecordedGroups gives the room's state groups as Synapse stores them (a group
// with an edge: its rows are its differences from the previous group; without:
// its whole state) and each event's group, in stream order (Source). Memory:
// the room's (event, group) pairs and the set of groups given.
func (s *Synapse) RecordedGroups(ctx context.Context, roomID string, group func(recorded.Group) error, event func(eventID string, group int64) error) error {
	evs, err := s.eventGroups(ctx, roomID)
	if err != nil {
		return err
	}
	given := map[int64]bool{}
	var give func(g int64, depth int) error
	give = func(g int64, depth int) error {
		if given[g] {
			return nil
		}
		if depth > 10000 {
			return fmt.Errorf("state group %d: more than 10,000 edges below it (a cycle?)", g)
		}
		var prev int64
		err := s.tx.QueryRowContext(ctx, s.q("SELECT prev_state_group FROM state_group_edges WHERE state_group = ?"), g).Scan(&prev)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("state group %d: edges: %w", g, err)
		}
		if prev != 0 {
			if err := give(prev, depth+1); err != nil {
				return err
			}
		}
		set := map[string]string{}
		if err := s.groupRows(ctx, g, set); err != nil {
			return err
		}
		given[g] = true
		return group(recorded.Group{ID: g, Prev: prev, Set: set})
	}
	for _, e := range evs {
		if err := give(e.group, 0); err != nil {
			return fmt.Errorf("serverdb: %s: room %s, event %s: %w", s.where, roomID, e.id, err)
		}
		if err := event(e.id, e.group); err != nil {
			return err
		}
	}
	return nil
}

// eventGroup is an event and its state group.
type eventGroup struct {
	id    string
	group int64
}

// eventGroups reads the room's events with a state group, in stream order.
func (s *Synapse) eventGroups(ctx context.Context, roomID string) ([]eventGroup, error) {
	rows, err := s.tx.QueryContext(ctx, s.q(`SELECT e.event_id, g.state_group FROM events e
		JOIN event_to_state_groups g ON g.event_id = e.event_id
		WHERE e.room_id = ? ORDER BY e.stream_ordering`), roomID)
	if err != nil {
		return nil, fmt.Errorf("serverdb: %s: state groups of room %s: %w", s.where, roomID, err)
	}
	defer rows.Close()
	var evs []eventGroup
	for rows.Next() {
		var e eventGroup
		if err := rows.Scan(&e.id, &e.group); err != nil {
			return nil, fmt.Errorf("serverdb: %s: state groups of room %s: %w", s.where, roomID, err)
		}
		evs = append(evs, e)
	}
	return evs, rows.Err()
}
