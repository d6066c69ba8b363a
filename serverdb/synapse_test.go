package serverdb_test

import (
	"context"
	"database/sql"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/pgstore/pgtest"
	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/serverdb"
	"github.com/mtxdb/mtxdb/testrooms"
	"github.com/mtxdb/mtxdb/testrooms/synapsedb"
)

var ctx = context.Background()

// realRooms are real rooms of testrooms/real with state groups of several
// kinds: the largest, one of room version 1, and small ones.
var realRooms = []string{"room001", "room003", "room068", "room163"}

// eachDatabase builds a Synapse database of the rooms on SQLite and, when
// MTXDB_TEST_POSTGRES names a server (pgtest), on PostgreSQL, and runs f with
// its target.
func eachDatabase(t *testing.T, rooms []string, f func(t *testing.T, target string)) {
	var dirs []string
	for _, r := range rooms {
		dirs = append(dirs, filepath.Join(testrooms.Dir(), "real", r))
	}
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "homeserver.db")
		if _, err := synapsedb.Build(path, dirs); err != nil {
			t.Fatal(err)
		}
		f(t, path)
	})
	t.Run("postgres", func(t *testing.T) {
		url := pgtest.NewDatabase(t)
		if _, err := synapsedb.Build(url, dirs); err != nil {
			t.Fatal(err)
		}
		f(t, url)
	})
}

// TestSynapseReadsWhatWasRecorded: every room's PDUs come back in stream order,
// and the state after every event, expanded from the groups' differences, is
// exactly the room directory's expected_state.jsonl; current state and forward
// extremities too.
func TestSynapseReadsWhatWasRecorded(t *testing.T) {
	eachDatabase(t, realRooms, func(t *testing.T, target string) {
		s, err := serverdb.OpenSynapse(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		rooms, err := s.Rooms(ctx)
		if err != nil || len(rooms) != len(realRooms) {
			t.Fatalf("%d rooms, %v", len(rooms), err)
		}
		for _, name := range realRooms {
			dir := filepath.Join(testrooms.Dir(), "real", name)
			exp, err := recorded.Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			var i int
			err = s.RecordedState(ctx, exp.RoomID, func(eventID string, _ int64, st map[string]string) error {
				if i >= len(exp.After) || exp.After[i].EventID != eventID || !maps.Equal(exp.After[i].State, st) {
					t.Fatalf("%s: state %d (after %s) is not the recorded one", name, i, eventID)
				}
				i++
				return nil
			})
			if err != nil || i != len(exp.After) {
				t.Fatalf("%s: %d states of %d, %v", name, i, len(exp.After), err)
			}
			cur, err := s.CurrentState(ctx, exp.RoomID)
			if err != nil || !maps.Equal(cur, exp.Current) && len(exp.Current) > 0 {
				t.Errorf("%s: current state differs (%v)", name, err)
			}
			fwd, err := s.ForwardExtremities(ctx, exp.RoomID)
			if err != nil || !slices.Equal(fwd, slices.Sorted(slices.Values(exp.ForwardExtremities))) {
				t.Errorf("%s: forward extremities %v, want %v (%v)", name, fwd, exp.ForwardExtremities, err)
			}
			lines, _ := os.ReadFile(filepath.Join(dir, "events.jsonl"))
			n := 0
			err = s.PDUs(ctx, exp.RoomID, func(eventID string, pdu []byte) error {
				if n++; !strings.Contains(string(lines), eventID) || len(pdu) == 0 {
					t.Errorf("%s: PDU %s not of the room", name, eventID)
				}
				return nil
			})
			if err != nil || n != strings.Count(strings.TrimSpace(string(lines)), "\n")+1 {
				t.Errorf("%s: %d PDUs, %v", name, n, err)
			}
		}
	})
}

// TestSynapseRefusesForeign: what is not a Synapse database of a version read
// is refused with ErrNotSynapse naming what is wrong; a missing file or one
// that is not SQLite is an error naming it; the file is never changed.
func TestSynapseRefusesForeign(t *testing.T) {
	dir := t.TempDir()
	build := func(name string, stmts ...string) string {
		path := filepath.Join(dir, name)
		db, err := sql.Open("sqlite", "file:"+path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		for _, s := range stmts {
			if _, err := db.Exec(s); err != nil {
				t.Fatal(err)
			}
		}
		return path
	}
	good := filepath.Join(dir, "good.db")
	if _, err := synapsedb.Build(good, []string{filepath.Join(testrooms.Dir(), "real", "room163")}); err != nil {
		t.Fatal(err)
	}
	dropped := filepath.Join(dir, "dropped.db")
	copyFile(t, good, dropped)
	exec(t, dropped, "ALTER TABLE state_group_edges RENAME TO edges")
	newer := filepath.Join(dir, "newer.db")
	copyFile(t, good, newer)
	exec(t, newer, "UPDATE schema_version SET version = 999")
	garbage := filepath.Join(dir, "garbage.db")
	os.WriteFile(garbage, []byte(strings.Repeat("not a database ", 1000)), 0o644)
	for _, c := range []struct {
		target, want string
		notSynapse   bool
	}{
		{build("empty.db", "CREATE TABLE t(x)"), "schema_version", true},
		{build("dendrite.db", "CREATE TABLE roomserver_events(event_nid INTEGER)"), "schema_version", true},
		{dropped, "state_group_edges", true},
		{newer, "version 999", true},
		{garbage, "file is not a database", false},
		{filepath.Join(dir, "missing.db"), "missing.db", false},
	} {
		before, _ := os.ReadFile(c.target)
		s, err := serverdb.OpenSynapse(ctx, c.target)
		if err == nil {
			s.Close()
			t.Errorf("%s: opened", c.target)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || errors.Is(err, serverdb.ErrNotSynapse) != c.notSynapse {
			t.Errorf("%s: %v; want an error naming %q (ErrNotSynapse: %v)", c.target, err, c.want, c.notSynapse)
		}
		if after, _ := os.ReadFile(c.target); string(after) != string(before) {
			t.Errorf("%s: changed by the attempt", c.target)
		}
	}
}

func exec(t *testing.T, path, stmt string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(stmt); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
