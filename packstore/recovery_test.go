package packstore

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// syncedStore writes records over a few Syncs, then more that are never
// synced, and returns a snapshot taken while the store is open (what a
// kill -9 leaves: checkpoint + delta + shards), the synced model, the
// unsynced records, and the last synced frame's location.
func syncedStore(t *testing.T) (opts Options, snap string, synced model, lastSynced loc, lastID ID) {
	t.Helper()
	r := rand.New(rand.NewPCG(31, 32))
	opts = Options{Dir: t.TempDir(), MaxShardBytes: 64 << 10}
	s := openStore(t, opts)
	synced = model{}
	c := idN(1, 0)
	for i := range 30 {
		d := payload(r, 100+r.IntN(300), false)
		if err := s.Put(c, idN(2, i), d); err != nil {
			t.Fatal(err)
		}
		synced.put(c, idN(2, i), d)
		if i%10 == 9 {
			if err := s.Sync(); err != nil {
				t.Fatal(err)
			}
		}
	}
	lastID = idN(2, 29)
	lastSynced = s.endLocked()
	l, _, _, err := s.lookupLocked(s.collectionLoad(c), lastID)
	if err != nil {
		t.Fatal(err)
	}
	lastSynced = l
	for i := 30; i < 35; i++ { // never synced
		if err := s.Put(c, idN(2, i), payload(r, 200, false)); err != nil {
			t.Fatal(err)
		}
	}
	snap = snapshotDir(t, opts.Dir)
	s.Close()
	return opts, snap, synced, lastSynced, lastID
}

// TestSyncedTailNotTruncated: damage in the last synced frame of the last
// shard (its length field, so that it no longer parses, or its payload) is
// corruption, not a torn tail: Open succeeds from the checkpoint and delta,
// reports the damage, truncates nothing of the synced bytes, reading the
// record returns ErrCorrupt naming file and offset, and every other synced
// record reads back. The delta replay does not stop at the damaged frame,
// so the scan does not take it for a torn tail and cut off an acknowledged
// record with no error.
func TestSyncedTailNotTruncated(t *testing.T) {
	opts, snap, m, at, lastID := syncedStore(t)
	name := shardFileName(at.shard)
	orig, _ := os.ReadFile(filepath.Join(snap, name))
	fv, err := decodeFrame(orig[at.off:])
	if err != nil {
		t.Fatal(err)
	}
	end := int(at.off) + fv.Size // the end of the synced bytes
	for _, field := range []struct {
		what string
		off  int
		tail bool // keep the unsynced frames after the damaged one
	}{
		{"len", 0, false}, {"record id", frameIDOff + 3, false}, {"payload", framePayloadOff + 5, false},
		{"len", 0, true}, {"record id", frameIDOff + 3, true}, {"payload", framePayloadOff + 5, true},
	} {
		s, err := openCopy(t, opts, snap, name, func(b []byte) []byte {
			b[int(at.off)+field.off] ^= 0x40
			if !field.tail {
				b = b[:end]
			}
			return b
		})
		if err != nil {
			t.Fatalf("%s: Open: %v", field.what, err)
		}
		rep := s.OpenReport()
		if fi, _ := os.Stat(filepath.Join(s.opts.Dir, name)); fi.Size() <= int64(at.off) {
			t.Fatalf("%s: synced bytes truncated: file has %d bytes, synced frame at %d (report %+v)", field.what, fi.Size(), at.off, rep)
		}
		if rep.TruncatedBytes > 0 && rep.TruncatedAt <= int64(at.off) {
			t.Fatalf("%s: truncated at %d, inside the synced bytes (frame at %d)", field.what, rep.TruncatedAt, at.off)
		}
		_, err = s.Get(idN(1, 0), lastID)
		wantAt := fmt.Sprintf("%s) offset %d", name, at.off)
		if !IsCorruption(err) || !strings.Contains(err.Error(), wantAt) {
			t.Fatalf("%s: Get of the damaged record: %v, want ErrCorrupt naming %q", field.what, err, wantAt)
		}
		if field.what != "payload" && (len(rep.Damaged) == 0 || !IsCorruption(rep.Damaged[0])) {
			t.Fatalf("%s: OpenReport.Damaged = %v, want the damaged frame", field.what, rep.Damaged)
		}
		for id, want := range m[idN(1, 0)] {
			if id != lastID {
				mustGet(t, s, idN(1, 0), id, want)
			}
		}
		if err := s.Check(); !IsCorruption(err) {
			t.Fatalf("%s: Check = %v, want ErrCorrupt", field.what, err)
		}
		s.Close()
	}
}

// TestShortShardIsCorruption: a shard file shorter than what the index
// files say was synced fails Open with ErrCorrupt naming the file and both
// lengths, rather than falling back to a full scan that would truncate the
// "torn tail" and lose acknowledged records with no error.
func TestShortShardIsCorruption(t *testing.T) {
	opts, snap, _, at, _ := syncedStore(t)
	name := shardFileName(at.shard)
	for _, cut := range []int64{int64(at.off) + 7, int64(at.off), int64(at.off) - 100} {
		_, err := openCopy(t, opts, snap, name, func(b []byte) []byte { return b[:cut] })
		if !IsCorruption(err) || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), fmt.Sprintf("the file has %d", cut)) {
			t.Fatalf("shard cut to %d bytes: Open = %v, want ErrCorrupt naming %s and its length", cut, err, name)
		}
		if !strings.Contains(err.Error(), "were synced") {
			t.Fatalf("error does not give the synced length: %v", err)
		}
	}
	// The same with only the checkpoint (no delta): its shard list is
	// what was synced.
	dir := t.TempDir()
	copyDir(t, snap, dir)
	o := opts
	o.Dir = dir
	s := openStore(t, o)
	s.Close() // checkpoint covering everything, empty delta
	b, _ := os.ReadFile(filepath.Join(dir, name))
	os.WriteFile(filepath.Join(dir, name), b[:len(b)-1], 0o644)
	if _, err := Open(o); !IsCorruption(err) {
		t.Fatalf("shard one byte short of the checkpoint: Open = %v, want ErrCorrupt", err)
	}
}

// TestUnsyncedTailTruncatedAndReported: a cut through the never-synced
// frames is a torn tail: Open truncates it past the synced bytes and says
// where and how much.
func TestUnsyncedTailTruncatedAndReported(t *testing.T) {
	opts, snap, m, at, _ := syncedStore(t)
	name := shardFileName(at.shard)
	b, _ := os.ReadFile(filepath.Join(snap, name))
	cut := framesEnd(t, b) - 150 // inside the last unsynced frame
	s, err := openCopy(t, opts, snap, name, func(b []byte) []byte { return b[:cut] })
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rep := s.OpenReport()
	if rep.TruncatedBytes == 0 || rep.TruncatedFile != name || rep.TruncatedAt <= int64(at.off) || rep.TruncatedAt+rep.TruncatedBytes != cut {
		t.Fatalf("report %+v, want a truncation of %s past offset %d ending at %d", rep, name, at.off, cut)
	}
	mustCheck(t, s)
	for id, want := range m[idN(1, 0)] {
		mustGet(t, s, idN(1, 0), id, want)
	}
	if errors.Is(rep.CheckpointErr, ErrCorrupt) || len(rep.Damaged) > 0 {
		t.Fatalf("report %+v", rep)
	}
}

// TestGetManyDamagedRecord: one damaged record in a
// GetMany batch fails only that record. The other records come back
// byte-exact and the error is a *RecordErrors whose entry for the damaged
// record is an ErrCorrupt error naming shard file and offset.
func TestGetManyDamagedRecord(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Dir: dir} // no cache: every read is physical
	s := openStore(t, opts)
	coll := ID{1}
	var ids []ID
	for i := range 10 {
		ids = append(ids, idN(2, i))
		if err := s.Put(coll, ids[i], bytes.Repeat([]byte{byte(i)}, 300)); err != nil {
			t.Fatal(err)
		}
	}
	const bad = 6
	l, _, _, err := s.lookupLocked(s.collectionLoad(coll), ids[bad])
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(shardPath(dir, l.shard), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xee}, int64(l.off)+framePayloadOff+10); err != nil {
		t.Fatal(err)
	}
	f.Close()
	s = openStore(t, opts)
	defer s.Close()
	got, err := s.GetMany(coll, append(ids, idN(2, 99))) // and one absent
	var re *RecordErrors
	if !errors.As(err, &re) || !IsCorruption(err) || len(re.Errs) != len(ids)+1 {
		t.Fatalf("GetMany with record %d damaged: %d results, %v; want a *RecordErrors", bad, len(got), err)
	}
	for i := range ids {
		switch {
		case i == bad:
			if got[i] != nil || !IsCorruption(re.Errs[i]) || !strings.Contains(re.Errs[i].Error(), shardFileName(l.shard)) ||
				!strings.Contains(re.Errs[i].Error(), fmt.Sprintf("offset %d", l.off)) {
				t.Fatalf("damaged record: %d bytes, %v", len(got[i]), re.Errs[i])
			}
		case re.Errs[i] != nil || !bytes.Equal(got[i], bytes.Repeat([]byte{byte(i)}, 300)):
			t.Fatalf("record %d: %d bytes, %v", i, len(got[i]), re.Errs[i])
		}
	}
	if got[len(ids)] != nil || re.Errs[len(ids)] != nil {
		t.Fatalf("absent record: %d bytes, %v", len(got[len(ids)]), re.Errs[len(ids)])
	}
}
