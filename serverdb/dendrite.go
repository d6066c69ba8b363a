package serverdb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/mtxdb/mtxdb/recorded"
)

// ErrNotDendrite is returned (wrapped, saying what is missing) for a database
// that is not a Dendrite roomserver database this version reads.
var ErrNotDendrite = errors.New("serverdb: not a Dendrite roomserver database this version reads")

// ErrStateInMtxdb is returned when a Dendrite database's state snapshots are
// kept by mtxdb (a patched build): its events name snapshots its SQL lacks.
var ErrStateInMtxdb = errors.New("serverdb: this Dendrite database keeps its state in mtxdb (a patched build), which import --from does not read as it is; " +
	"on SQLite, mtxdb-dendrite-migrate -export-stock OUT.db -db PATH writes a copy it reads")

// dendriteColumns are the tables and columns of Dendrite v0.13's roomserver
// read (roomserver/storage/{sqlite3,postgres}/*_table.go).
var dendriteColumns = [][2]string{
	{"roomserver_rooms", "room_nid, room_id, room_version, state_snapshot_nid, latest_event_nids"},
	{"roomserver_events", "event_nid, room_nid, event_type_nid, event_state_key_nid, state_snapshot_nid, event_id, is_rejected"},
	{"roomserver_event_json", "event_nid, event_json"},
	{"roomserver_event_types", "event_type_nid, event_type"},
	{"roomserver_event_state_keys", "event_state_key_nid, event_state_key"},
	{"roomserver_state_snapshots", "state_snapshot_nid, state_block_nids"},
	{"roomserver_state_block", "state_block_nid, event_nids"},
}

// Dendrite is an open Dendrite roomserver database (v0.13: SQLite file or
// PostgreSQL URL). The state Dendrite recorded for an event is the snapshot of
// the state before it (roomserver_events.state_snapshot_nid) with the event
// itself at its key when it is a state event Dendrite did not reject; outliers
// (no snapshot) have none. A snapshot is its blocks merged in order, a later
// block's entry for a key winning, and within a block the entry of the highest
// event NID (Dendrite's LoadStateAtSnapshot). Not safe for concurrent use.
type Dendrite struct {
	database
	types, keys map[int64]string
	// per room (loadRoom): its state events' keys and IDs by event NID
	roomNID  int64
	events   map[int64]dendriteEvent
	snapshot *lru.Cache[int64, map[string]string]
}

type dendriteEvent struct {
	id  string
	key string // "type\x00state_key"; empty: not a state event
}

// OpenDendrite opens a Dendrite roomserver database read-only. Errors: the
// database cannot be read, is not Dendrite's (ErrNotDendrite, naming the table
// or column), or keeps its state in mtxdb (ErrStateInMtxdb).
func OpenDendrite(ctx context.Context, target string) (*Dendrite, error) {
	d := &Dendrite{}
	if err := d.open(ctx, "Dendrite", target); err != nil {
		return nil, err
	}
	err := d.probe(ctx, ErrNotDendrite, dendriteColumns)
	if err == nil {
		err = d.loadNames(ctx)
	}
	if err == nil {
		err = d.checkSQLState(ctx)
	}
	if err != nil {
		d.Close()
		return nil, err
	}
	d.snapshot, _ = lru.New[int64, map[string]string](groupCacheSize)
	return d, nil
}

// loadNames reads the event type and state key tables.
func (d *Dendrite) loadNames(ctx context.Context) error {
	d.types, d.keys = map[int64]string{}, map[int64]string{}
	for _, t := range []struct {
		query string
		into  map[int64]string
	}{
		{"SELECT event_type_nid, event_type FROM roomserver_event_types", d.types},
		{"SELECT event_state_key_nid, event_state_key FROM roomserver_event_state_keys", d.keys},
	} {
		rows, err := d.tx.QueryContext(ctx, t.query)
		if err != nil {
			return fmt.Errorf("serverdb: %s: %w", d.where, err)
		}
		for rows.Next() {
			var nid int64
			var name string
			if err := rows.Scan(&nid, &name); err != nil {
				rows.Close()
				return fmt.Errorf("serverdb: %s: %w", d.where, err)
			}
			t.into[nid] = name
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("serverdb: %s: %w", d.where, err)
		}
	}
	return nil
}

// checkSQLState refuses a database whose events name snapshots its SQL lacks.
func (d *Dendrite) checkSQLState(ctx context.Context) error {
	var missing int64
	err := d.tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM roomserver_events e
		WHERE e.state_snapshot_nid <> 0 AND NOT EXISTS
		(SELECT 1 FROM roomserver_state_snapshots s WHERE s.state_snapshot_nid = e.state_snapshot_nid)`).Scan(&missing)
	if err != nil {
		return fmt.Errorf("serverdb: %s: %w", d.where, err)
	}
	if missing > 0 {
		return fmt.Errorf("%w (%s: %d events name snapshots its roomserver_state_snapshots lacks)", ErrStateInMtxdb, d.where, missing)
	}
	return nil
}

// Rooms lists the database's rooms with their versions and event counts.
func (d *Dendrite) Rooms(ctx context.Context) ([]Room, error) {
	rows, err := d.tx.QueryContext(ctx, `SELECT r.room_id, r.room_version, COUNT(e.event_nid)
		FROM roomserver_rooms r LEFT JOIN roomserver_events e ON e.room_nid = r.room_nid
		GROUP BY r.room_id, r.room_version ORDER BY r.room_id`)
	if err != nil {
		return nil, fmt.Errorf("serverdb: %s: rooms: %w", d.where, err)
	}
	defer rows.Close()
	var out []Room
	for rows.Next() {
		var r Room
		if err := rows.Scan(&r.ID, &r.Version, &r.Events); err != nil {
			return nil, fmt.Errorf("serverdb: %s: rooms: %w", d.where, err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// PDUs calls fn with the room's PDUs (roomserver_event_json) by event NID, the
// order Dendrite stored them in.
func (d *Dendrite) PDUs(ctx context.Context, roomID string, fn func(eventID string, pdu []byte) error) error {
	rows, err := d.tx.QueryContext(ctx, d.q(`SELECT e.event_id, j.event_json FROM roomserver_events e
		JOIN roomserver_rooms r ON r.room_nid = e.room_nid
		JOIN roomserver_event_json j ON j.event_nid = e.event_nid
		WHERE r.room_id = ? ORDER BY e.event_nid`), roomID)
	if err != nil {
		return fmt.Errorf("serverdb: %s: events of room %s: %w", d.where, roomID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var js []byte
		if err := rows.Scan(&id, &js); err != nil {
			return fmt.Errorf("serverdb: %s: events of room %s: %w", d.where, roomID, err)
		}
		if err := fn(id, js); err != nil {
			return err
		}
	}
	return rows.Err()
}

// loadRoom reads the room's events (NID -> ID and key) once per room.
func (d *Dendrite) loadRoom(ctx context.Context, roomID string) (int64, error) {
	var nid int64
	if err := d.tx.QueryRowContext(ctx, d.q("SELECT room_nid FROM roomserver_rooms WHERE room_id = ?"), roomID).Scan(&nid); err != nil {
		return 0, fmt.Errorf("serverdb: %s: room %s: %w", d.where, roomID, err)
	}
	if nid == d.roomNID && d.events != nil {
		return nid, nil
	}
	rows, err := d.tx.QueryContext(ctx, d.q("SELECT event_nid, event_id, event_type_nid, event_state_key_nid FROM roomserver_events WHERE room_nid = ?"), nid)
	if err != nil {
		return 0, fmt.Errorf("serverdb: %s: events of room %s: %w", d.where, roomID, err)
	}
	defer rows.Close()
	d.events = map[int64]dendriteEvent{}
	d.snapshot.Purge()
	for rows.Next() {
		var ev, t, k int64
		var id string
		if err := rows.Scan(&ev, &id, &t, &k); err != nil {
			return 0, fmt.Errorf("serverdb: %s: events of room %s: %w", d.where, roomID, err)
		}
		e := dendriteEvent{id: id}
		if k != 0 {
			typ, ok1 := d.types[t]
			sk, ok2 := d.keys[k]
			if !ok1 || !ok2 {
				return 0, fmt.Errorf("serverdb: %s: event %s: event type NID %d or state key NID %d unknown", d.where, id, t, k)
			}
			e.key = typ + "\x00" + sk
		}
		d.events[ev] = e
	}
	d.roomNID = nid
	return nid, rows.Err()
}

// fullGroupEvery: every this many snapshot groups RecordedGroups gives one whole
// rather than as differences, so that no chain of differences grows long.
const fullGroupEvery = 256

// RecordedGroups gives, by event NID, each event with a state snapshot and the
// group of the state after it (Source): the snapshot of the state before it
// (group ID: the snapshot NID; given as its differences from the snapshot
// given before it, or whole every fullGroupEvery-th), or, for a state event
// Dendrite did not reject that changes its key, a group of its own (ID: minus
// its event NID) setting the event over that snapshot.
func (d *Dendrite) RecordedGroups(ctx context.Context, roomID string, group func(recorded.Group) error, event func(eventID string, group int64) error) error {
	nid, err := d.loadRoom(ctx, roomID)
	if err != nil {
		return err
	}
	rows, err := d.tx.QueryContext(ctx, d.q(`SELECT event_nid, state_snapshot_nid, is_rejected FROM roomserver_events
		WHERE room_nid = ? AND state_snapshot_nid <> 0 ORDER BY event_nid`), nid)
	if err != nil {
		return fmt.Errorf("serverdb: %s: events of room %s: %w", d.where, roomID, err)
	}
	type row struct {
		ev, snap int64
		rejected bool
	}
	var evs []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.ev, &r.snap, &r.rejected); err != nil {
			rows.Close()
			return fmt.Errorf("serverdb: %s: events of room %s: %w", d.where, roomID, err)
		}
		evs = append(evs, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	given := map[int64]bool{}
	var last map[string]string
	var lastID int64
	for _, r := range evs {
		e := d.events[r.ev]
		before, err := d.snapshotState(ctx, r.snap)
		if err != nil {
			return fmt.Errorf("serverdb: %s: room %s, event %s: %w", d.where, roomID, e.id, err)
		}
		if !given[r.snap] {
			g := recorded.Group{ID: r.snap, Set: before}
			if last != nil && len(given)%fullGroupEvery != 0 {
				g = diffGroup(r.snap, lastID, last, before)
			}
			if err := group(g); err != nil {
				return err
			}
			given[r.snap], last, lastID = true, before, r.snap
		}
		g := r.snap
		if e.key != "" && !r.rejected && before[e.key] != e.id {
			g = -r.ev
			if err := group(recorded.Group{ID: g, Prev: r.snap, Set: map[string]string{e.key: e.id}}); err != nil {
				return err
			}
		}
		if err := event(e.id, g); err != nil {
			return err
		}
	}
	return nil
}

// diffGroup is the group id holding state as its differences from prev's.
func diffGroup(id, prevID int64, prev, state map[string]string) recorded.Group {
	g := recorded.Group{ID: id, Prev: prevID, Set: map[string]string{}}
	for k, v := range state {
		if prev[k] != v {
			g.Set[k] = v
		}
	}
	for k := range prev {
		if _, ok := state[k]; !ok {
			g.Removed = append(g.Removed, k)
		}
	}
	slices.Sort(g.Removed)
	return g
}

// snapshotState expands a state snapshot of the current room.
func (d *Dendrite) snapshotState(ctx context.Context, snap int64) (map[string]string, error) {
	if st, ok := d.snapshot.Get(snap); ok {
		return st, nil
	}
	var blocksText string
	if err := d.tx.QueryRowContext(ctx, d.q("SELECT state_block_nids FROM roomserver_state_snapshots WHERE state_snapshot_nid = ?"), snap).Scan(&blocksText); err != nil {
		return nil, fmt.Errorf("state snapshot %d: %w", snap, err)
	}
	blocks, err := parseNIDs(blocksText)
	if err != nil {
		return nil, fmt.Errorf("state snapshot %d: state_block_nids %q: %w", snap, blocksText, err)
	}
	st := map[string]string{}
	for _, b := range blocks {
		var evText string
		if err := d.tx.QueryRowContext(ctx, d.q("SELECT event_nids FROM roomserver_state_block WHERE state_block_nid = ?"), b).Scan(&evText); err != nil {
			return nil, fmt.Errorf("state snapshot %d: block %d: %w", snap, b, err)
		}
		evs, err := parseNIDs(evText)
		if err != nil {
			return nil, fmt.Errorf("state snapshot %d: block %d: event_nids %q: %w", snap, b, evText, err)
		}
		slices.Sort(evs)
		for _, ev := range evs {
			e, ok := d.events[ev]
			if !ok || e.key == "" {
				return nil, fmt.Errorf("state snapshot %d: block %d names event NID %d, not a state event of the room", snap, b, ev)
			}
			st[e.key] = e.id
		}
	}
	d.snapshot.Add(snap, st)
	return st, nil
}

// parseNIDs reads a list of NIDs as Dendrite stores it: JSON ("[1,2]") on
// SQLite, an array ("{1,2}") on PostgreSQL.
func parseNIDs(s string) ([]int64, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "[") {
		var out []int64
		err := json.Unmarshal([]byte(s), &out)
		return out, err
	}
	if !strings.HasPrefix(s, "{") || !strings.HasSuffix(s, "}") {
		return nil, fmt.Errorf("not a list of NIDs")
	}
	var out []int64
	for _, f := range strings.Split(s[1:len(s)-1], ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// CurrentState is the state of the room's current snapshot
// (roomserver_rooms.state_snapshot_nid; empty when there is none).
func (d *Dendrite) CurrentState(ctx context.Context, roomID string) (map[string]string, error) {
	if _, err := d.loadRoom(ctx, roomID); err != nil {
		return nil, err
	}
	var snap int64
	if err := d.tx.QueryRowContext(ctx, d.q("SELECT state_snapshot_nid FROM roomserver_rooms WHERE room_id = ?"), roomID).Scan(&snap); err != nil {
		return nil, fmt.Errorf("serverdb: %s: room %s: %w", d.where, roomID, err)
	}
	if snap == 0 {
		return map[string]string{}, nil
	}
	st, err := d.snapshotState(ctx, snap)
	if err != nil {
		return nil, fmt.Errorf("serverdb: %s: room %s: current state: %w", d.where, roomID, err)
	}
	return st, nil
}

// ForwardExtremities is the room's latest_event_nids as event IDs, sorted.
func (d *Dendrite) ForwardExtremities(ctx context.Context, roomID string) ([]string, error) {
	if _, err := d.loadRoom(ctx, roomID); err != nil {
		return nil, err
	}
	var text string
	if err := d.tx.QueryRowContext(ctx, d.q("SELECT latest_event_nids FROM roomserver_rooms WHERE room_id = ?"), roomID).Scan(&text); err != nil {
		return nil, fmt.Errorf("serverdb: %s: room %s: %w", d.where, roomID, err)
	}
	nids, err := parseNIDs(text)
	if err != nil {
		return nil, fmt.Errorf("serverdb: %s: room %s: latest_event_nids %q: %w", d.where, roomID, text, err)
	}
	var out []string
	for _, n := range nids {
		e, ok := d.events[n]
		if !ok {
			return nil, fmt.Errorf("serverdb: %s: room %s: latest event NID %d unknown", d.where, roomID, n)
		}
		out = append(out, e.id)
	}
	slices.Sort(out)
	return out, nil
}
