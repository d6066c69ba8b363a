// Package eventrows reads a room's events from a Dendrite v0.13.8 roomserver
// database as rows without event JSON: event NID and ID, type and state key with
// their NIDs, auth events as NIDs. It is what a per-room auth graph is built from
// (integration/dendrite/roomrules RoomGraph), and imports only Dendrite's types,
// so that Dendrite's roomserver/state can name its rows.
package eventrows

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/matrix-org/dendrite/roomserver/types"
)

// EventRow is one event of a room as roomserver_events holds it, with its type and
// state key spelt out: what an auth graph needs, no event JSON.
type EventRow struct {
	EventNID    types.EventNID
	EventID     string
	EventType   string
	TypeNID     types.EventTypeNID
	StateKeyNID types.EventStateKeyNID // 0 for an event that is not a state event
	StateKey    string
	AuthNIDs    []types.EventNID
	// AuthIDs are the auth_events of the event JSON (roomserver_event_json),
	// nil when the JSON is missing: Dendrite leaves out of auth_event_nids the auth
	// events it did not hold when it stored the event.
	AuthIDs []string
}

// eventRowsSQL selects a room's events above an event NID, oldest first, from
// Dendrite v0.13.8's roomserver tables (roomserver/storage/{sqlite3,postgres}:
// events, event_types, event_state_keys). auth_event_nids is a JSON array in
// SQLite and a BIGINT[] in PostgreSQL, read as JSON text there; the event JSON's
// auth_events is read as JSON text too.
const eventRowsSQL = `SELECT e.event_nid, e.event_id, t.event_type, e.event_type_nid, e.event_state_key_nid,
  COALESCE(k.event_state_key, ''), %s, %s
FROM roomserver_events e
JOIN roomserver_event_types t ON t.event_type_nid = e.event_type_nid
LEFT JOIN roomserver_event_state_keys k ON k.event_state_key_nid = e.event_state_key_nid
LEFT JOIN roomserver_event_json j ON j.event_nid = e.event_nid
WHERE e.room_nid = $1 AND e.event_nid > $2 ORDER BY e.event_nid`

// Read returns the events of a room above an event NID from a roomserver
// database (of SQLite when sqlite, else PostgreSQL), oldest first, read outside
// any transaction (rows an open transaction holds are not seen). Errors: the
// database's, a malformed auth_event_nids (naming the event).
func Read(ctx context.Context, db *sql.DB, sqlite bool, roomNID types.RoomNID, after types.EventNID) ([]EventRow, error) {
	auth, jsonAuth := "e.auth_event_nids", "json_extract(j.event_json, '$.auth_events')"
	if !sqlite {
		auth, jsonAuth = "array_to_json(e.auth_event_nids)::text", "(j.event_json::json -> 'auth_events')::text"
	}
	rows, err := db.QueryContext(ctx, fmt.Sprintf(eventRowsSQL, auth, jsonAuth), int64(roomNID), int64(after))
	if err != nil {
		return nil, fmt.Errorf("eventrows: event rows of room NID %d: %w", roomNID, err)
	}
	defer rows.Close()
	var out []EventRow
	for rows.Next() {
		var r EventRow
		var authJSON, eventAuth sql.NullString
		if err := rows.Scan(&r.EventNID, &r.EventID, &r.EventType, &r.TypeNID, &r.StateKeyNID, &r.StateKey, &authJSON, &eventAuth); err != nil {
			return nil, fmt.Errorf("eventrows: event rows of room NID %d: %w", roomNID, err)
		}
		if authJSON.Valid && authJSON.String != "" {
			if err := json.Unmarshal([]byte(authJSON.String), &r.AuthNIDs); err != nil {
				return nil, fmt.Errorf("eventrows: event %s (NID %d): auth_event_nids %q: %w", r.EventID, r.EventNID, authJSON.String, err)
			}
		}
		if eventAuth.Valid && eventAuth.String != "" {
			var err error
			if r.AuthIDs, err = authIDs([]byte(eventAuth.String)); err != nil {
				return nil, fmt.Errorf("eventrows: event %s (NID %d): auth_events of its JSON: %w", r.EventID, r.EventNID, err)
			}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("eventrows: event rows of room NID %d: %w", roomNID, err)
	}
	return out, nil
}

// authIDs reads an event JSON's auth_events: event IDs (room versions 3 and
// later), or [event ID, hashes] pairs (room versions 1 and 2). An empty list is
// not nil.
func authIDs(raw []byte) ([]string, error) {
	ids := []string{}
	if err := json.Unmarshal(raw, &ids); err == nil {
		return ids, nil
	}
	var pairs [][]json.RawMessage
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, fmt.Errorf("neither event IDs nor [event ID, hashes] pairs: %w", err)
	}
	ids = ids[:0]
	for _, p := range pairs {
		var id string
		if len(p) == 0 || json.Unmarshal(p[0], &id) != nil {
			return nil, fmt.Errorf("an entry without an event ID")
		}
		ids = append(ids, id)
	}
	return ids, nil
}
