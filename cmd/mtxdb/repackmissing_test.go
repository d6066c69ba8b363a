package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomrecord"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/testrooms"
)

// TestCLIRepackLeavesRoomWithMissingRecord: a PDU frame whose record ID is
// damaged is not found through the index, so the engine refuses a plan that
// lists it. repack leaves that room as it is, names the record and its event
// in a problem line, repacks the other room, says why the store grew and
// exits 2.
func TestCLIRepackLeavesRoomWithMissingRecord(t *testing.T) {
	// Flip the last byte of the record ID in the frame head.
	store, damaged, event, rec := damagedPDUStore(t, func(at int) int { return at + 15 })
	out, code := run(t, "repack", "--store", store)
	want := "problem room=" + damaged + ": not repacked: record " + rec.String() + " (the PDU of event " + event + ")"
	if code != 2 || !strings.Contains(out, want) || !strings.Contains(out, " rooms=1 ") || !strings.Contains(out, "the store grew by") {
		t.Fatalf("repack: exit %d, want 2 with %q, the other room repacked and the growth explained\n%s", code, want, out)
	}
}

// TestCLIRepackLeavesRoomWithDamagedFrame: a PDU frame whose payload fails
// its CRC is met while repack copies the room; the engine removes its copies,
// and repack leaves that room as it is with a problem line, repacks the other
// and exits 2. The command the line names (verify --room) shows the damage.
func TestCLIRepackLeavesRoomWithDamagedFrame(t *testing.T) {
	store, damaged, _, _ := damagedPDUStore(t, func(at int) int { return at + 40 })
	out, code := run(t, "repack", "--store", store)
	if code != 2 || !strings.Contains(out, "problem room="+damaged+": not repacked: a record it copies is damaged") || !strings.Contains(out, " rooms=1 ") {
		t.Fatalf("repack: exit %d, want 2 naming %s and the other room repacked\n%s", code, damaged, out)
	}
	// The command the problem line names shows the damage.
	hint := "(mtxdb verify --room " + damaged + " shows the damage)"
	if !strings.Contains(out, hint) {
		t.Fatalf("repack: no %q in\n%s", hint, out)
	}
	if out, code := run(t, "verify", "--store", store, "--room", damaged); code != 2 || !strings.Contains(out, "crc mismatch") {
		t.Fatalf("verify --room %s: exit %d, want 2 naming the damage\n%s", damaged, code, out)
	}
}

// TestCLIRepackPlanMissingRecord: a shard cut in half under lost index files
// (the index is rebuilt by a scan) leaves a room whose metadata records are
// gone; planning it fails with "record not found", and repack names the room
// on a problem line and exits 2 instead of ending with exit 1.
func TestCLIRepackPlanMissingRecord(t *testing.T) {
	store := filepath.Join(t.TempDir(), "s")
	for _, args := range [][]string{{"import", "--store", store, room("room001"), room("room003")}, {"replay", "--store", store}, {"repack", "--store", store}} {
		if out, code := run(t, args...); code != 0 {
			t.Fatalf("%s: exit %d\n%s", args[0], code, out)
		}
	}
	shards, _ := filepath.Glob(filepath.Join(store, "shard-*.mtdb"))
	if len(shards) != 1 {
		t.Fatalf("shards after repack: %v", shards)
	}
	fi, err := os.Stat(shards[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(shards[0], fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"index.ckpt", "index.delta"} {
		if err := os.Remove(filepath.Join(store, f)); err != nil {
			t.Fatal(err)
		}
	}
	out, code := run(t, "repack", "--store", store)
	if code != 2 || !strings.Contains(out, "problem room=") || !strings.Contains(out, "not repacked: ") || !strings.Contains(out, "record not found") {
		t.Fatalf("repack: exit %d, want 2 with a problem line naming the room\n%s", code, out)
	}
}

// TestCLIStatsReadsGoesOnPastDamagedRoom: stats --reads names a room whose walk
// meets a damaged frame as a problem, walks the other room and exits 2.
func TestCLIStatsReadsGoesOnPastDamagedRoom(t *testing.T) {
	// Flip a byte of the PDU's payload: its frame's CRC no longer matches.
	store, damaged, _, _ := damagedPDUStore(t, func(at int) int { return at + 40 })
	out, code := run(t, "stats", "--store", store, "--reads")
	if code != 2 || !strings.Contains(out, "problem room="+damaged+": this walk and the room's later ones not measured") ||
		strings.Count(out, "\nroom ") != 1 || !strings.Contains(out, "rooms_failed=1") {
		t.Fatalf("stats --reads: exit %d, want 2, the damaged room named, the other walked\n%s", code, out)
	}
}

// damagedPDUStore imports and replays two real rooms and flips one byte of the
// shard at flip(offset of the frame head's record ID) of the third event of
// the first room. It returns the store, that room, the event and its record ID.
func damagedPDUStore(t *testing.T, flip func(at int) int) (string, string, string, packstore.ID) {
	t.Helper()
	store := filepath.Join(t.TempDir(), "s")
	for _, args := range [][]string{{"import", "--store", store, room("room001"), room("room003")}, {"replay", "--store", store}} {
		if out, code := run(t, args...); code != 0 {
			t.Fatalf("%s: exit %d\n%s", args[0], code, out)
		}
	}
	eng, err := packstore.Open(packstore.DefaultOptions(store))
	if err != nil {
		t.Fatal(err)
	}
	rooms, err := roomstate.New(eng).Rooms(context.Background())
	if err != nil || len(rooms) != 2 {
		t.Fatalf("rooms: %d, %v", len(rooms), err)
	}
	ids, err := rooms[0].EventIDs()
	if err != nil || len(ids) < 3 {
		t.Fatalf("event IDs: %d, %v", len(ids), err)
	}
	damaged, event, rec := rooms[0].ID(), ids[2], roomrecord.EventRecordID(ids[2])
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	// The record's frame is written at import, before any frame whose payload
	// could hold its ID: the first occurrence is its frame head.
	shard := filepath.Join(store, "shard-00000.mtdb")
	b, err := os.ReadFile(shard)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(b, rec[:])
	if at < 0 {
		t.Fatalf("record %s not in %s", rec, shard)
	}
	b[flip(at)] ^= 0x01
	if err := os.WriteFile(shard, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return store, damaged, event, rec
}

// TestCLIRepackNoRoomHeads: a store whose records hold no room head (its
// heads lost: a shard cut short under lost index files) gets a problem line
// from repack and exit 2, as from verify, instead of "rooms=0" and exit 0.
func TestCLIRepackNoRoomHeads(t *testing.T) {
	store := filepath.Join(t.TempDir(), "store")
	if out, code := run(t, "import", "--store", store, filepath.Join(testrooms.Dir(), "real", "room003")); code != 0 {
		t.Fatalf("import: exit %d\n%s", code, out)
	}
	for _, f := range []string{"index.ckpt", "index.delta"} {
		if err := os.Remove(filepath.Join(store, f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Truncate(filepath.Join(store, "shard-00000.mtdb"), 150000); err != nil {
		t.Fatal(err)
	}
	out, code := run(t, "repack", "--store", store)
	if code != 2 || !strings.Contains(out, "but no mtxdb room") {
		t.Fatalf("repack: exit %d, want 2 and a problem line\n%s", code, out)
	}
}
