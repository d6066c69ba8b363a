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
)

// TestCLIRepackLeavesRoomWithMissingRecord: a PDU frame whose record ID is
// damaged is not found through the index, so the engine refuses a plan that
// lists it. repack leaves that room as it is, names the record and its event
// in a problem line, repacks the other room, says why the store grew and
// exits 2.
func TestCLIRepackLeavesRoomWithMissingRecord(t *testing.T) {
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
	// The PDU's frame is written at import, before any frame whose payload
	// could hold its record ID: the first occurrence is its frame head.
	shard := filepath.Join(store, "shard-00000.mtdb")
	b, err := os.ReadFile(shard)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(b, rec[:])
	if at < 0 {
		t.Fatalf("record %s not in %s", rec, shard)
	}
	b[at+len(rec)-1] ^= 0x01
	if err := os.WriteFile(shard, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := run(t, "repack", "--store", store)
	want := "problem room=" + damaged + ": not repacked: record " + rec.String() + " (the PDU of event " + event + ")"
	if code != 2 || !strings.Contains(out, want) || !strings.Contains(out, " rooms=1 ") || !strings.Contains(out, "the store grew by") {
		t.Fatalf("repack: exit %d, want 2 with %q, the other room repacked and the growth explained\n%s", code, want, out)
	}
}
