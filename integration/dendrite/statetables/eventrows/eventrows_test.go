package eventrows

import (
	"context"
	"database/sql"
	"path/filepath"
	"slices"
	"testing"

	_ "github.com/lib/pq"
	"github.com/matrix-org/dendrite/roomserver/storage/postgres"
	"github.com/matrix-org/dendrite/roomserver/storage/sqlite3"
	"github.com/matrix-org/dendrite/roomserver/storage/tables"
	"github.com/matrix-org/dendrite/roomserver/types"
	_ "github.com/mattn/go-sqlite3"
	"github.com/mtxdb/mtxdb/pgstore/pgtest"
)

// dialect is one of Dendrite's roomserver storage back ends: its own table code
// creates the schema and inserts the rows Read reads.
type dialect struct {
	name   string
	sqlite bool
	open   func(t *testing.T) *sql.DB
	create []func(*sql.DB) error
	events func(*sql.DB) (tables.Events, error)
	json   func(*sql.DB) (tables.EventJSON, error)
	types  func(*sql.DB) (tables.EventTypes, error)
	keys   func(*sql.DB) (tables.EventStateKeys, error)
}

var dialects = []dialect{
	{name: "sqlite", sqlite: true, open: func(t *testing.T) *sql.DB {
		db, err := sql.Open("sqlite3", "file:"+filepath.Join(t.TempDir(), "roomserver.db"))
		if err != nil {
			t.Fatal(err)
		}
		return db
	}, create: []func(*sql.DB) error{sqlite3.CreateEventsTable, sqlite3.CreateEventTypesTable, sqlite3.CreateEventStateKeysTable, sqlite3.CreateEventJSONTable},
		events: sqlite3.PrepareEventsTable, json: sqlite3.PrepareEventJSONTable, types: sqlite3.PrepareEventTypesTable, keys: sqlite3.PrepareEventStateKeysTable},
	{name: "postgres", open: func(t *testing.T) *sql.DB {
		db, err := sql.Open("postgres", pgtest.NewDatabase(t))
		if err != nil {
			t.Fatal(err)
		}
		return db
	}, create: []func(*sql.DB) error{postgres.CreateEventsTable, postgres.CreateEventTypesTable, postgres.CreateEventStateKeysTable, postgres.CreateEventJSONTable},
		events: postgres.PrepareEventsTable, json: postgres.PrepareEventJSONTable, types: postgres.PrepareEventTypesTable, keys: postgres.PrepareEventStateKeysTable},
}

// TestReadDendriteRows: events inserted by Dendrite's own table code in two rooms
// are read back per room above an event NID, oldest first, with type, state
// key and auth event NIDs as inserted; a message has state key NID 0.
func TestReadDendriteRows(t *testing.T) {
	ctx := context.Background()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			db := d.open(t)
			defer db.Close()
			for _, c := range d.create {
				if err := c(db); err != nil {
					t.Fatal(err)
				}
			}
			events, err := d.events(db)
			if err != nil {
				t.Fatal(err)
			}
			typeTable, err := d.types(db)
			if err != nil {
				t.Fatal(err)
			}
			jsonTable, err := d.json(db)
			if err != nil {
				t.Fatal(err)
			}
			keyTable, err := d.keys(db)
			if err != nil {
				t.Fatal(err)
			}
			custom, err := typeTable.InsertEventTypeNID(ctx, nil, "org.example.custom")
			if err != nil {
				t.Fatal(err)
			}
			alice, err := keyTable.InsertEventStateKeyNID(ctx, nil, "@alice:example.org")
			if err != nil {
				t.Fatal(err)
			}
			type ev struct {
				room     types.RoomNID
				typ      types.EventTypeNID
				key      types.EventStateKeyNID
				id       string
				authIdxs []int
			}
			evs := []ev{
				{1, types.MRoomCreateNID, types.EmptyStateKeyNID, "$create", nil},
				{1, types.MRoomMemberNID, alice, "$join", []int{0}},
				{2, types.MRoomCreateNID, types.EmptyStateKeyNID, "$other", nil},
				{1, types.MRoomPowerLevelsNID, types.EmptyStateKeyNID, "$pl", []int{0, 1}},
				{1, custom, 0, "$message", []int{0, 1, 3}},
			}
			// The JSON of two events: the message names an auth event the
			// server does not hold ($unheld, not in its auth NIDs); the join is
			// in the [event ID, hashes] form of room versions 1 and 2.
			eventJSON := map[string]string{
				"$message": `{"type":"org.example.custom","auth_events":["$create","$join","$pl","$unheld"]}`,
				"$join":    `{"type":"m.room.member","auth_events":[["$create",{"sha256":"x"}]]}`,
			}
			nids := make([]types.EventNID, len(evs))
			for i, e := range evs {
				var auth []types.EventNID
				for _, j := range e.authIdxs {
					auth = append(auth, nids[j])
				}
				if nids[i], _, err = events.InsertEvent(ctx, nil, e.room, e.typ, e.key, e.id, auth, int64(i), false); err != nil {
					t.Fatal(err)
				}
				if js, ok := eventJSON[e.id]; ok {
					if err := jsonTable.InsertEventJSON(ctx, nil, nids[i], []byte(js)); err != nil {
						t.Fatal(err)
					}
				}
			}
			rows, err := Read(ctx, db, d.sqlite, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, r := range rows {
				ids = append(ids, r.EventID)
			}
			if want := []string{"$create", "$join", "$pl", "$message"}; !slices.Equal(ids, want) {
				t.Fatalf("room 1: %v, want %v", ids, want)
			}
			if r := rows[1]; r.EventType != "m.room.member" || r.StateKey != "@alice:example.org" || r.StateKeyNID != alice ||
				!slices.Equal(r.AuthNIDs, []types.EventNID{nids[0]}) {
				t.Errorf("join row: %+v", r)
			}
			if r := rows[3]; r.EventType != "org.example.custom" || r.TypeNID != custom || r.StateKeyNID != 0 || r.StateKey != "" ||
				!slices.Equal(r.AuthNIDs, []types.EventNID{nids[0], nids[1], nids[3]}) {
				t.Errorf("message row: %+v", r)
			}
			if r := rows[0]; len(r.AuthNIDs) != 0 || r.StateKeyNID != types.EmptyStateKeyNID || r.AuthIDs != nil {
				t.Errorf("create row (no JSON stored): %+v", r)
			}
			if got := rows[3].AuthIDs; !slices.Equal(got, []string{"$create", "$join", "$pl", "$unheld"}) {
				t.Errorf("message's auth events from its JSON: %v", got)
			}
			if got := rows[1].AuthIDs; !slices.Equal(got, []string{"$create"}) {
				t.Errorf("join's auth events from [ID, hashes] pairs: %v", got)
			}
			later, err := Read(ctx, db, d.sqlite, 1, nids[1])
			if err != nil {
				t.Fatal(err)
			}
			if len(later) != 2 || later[0].EventID != "$pl" {
				t.Errorf("room 1 above the join: %+v", later)
			}
		})
	}
}
