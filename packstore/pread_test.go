package packstore

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// TestPreadKinds: reads of a kind in Options.PreadKinds give the bytes the
// mapped reads give, for frames shorter and longer than the first pread and
// the store's last frame; they do not count towards ReleaseEvery, and a
// damaged frame read with pread is ErrCorrupt.
func TestPreadKinds(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Dir: dir, Compress: true, PreadKinds: []ReadKind{1}}
	s := openStore(t, opts)
	coll := idN(1, 0)
	rng := rand.New(rand.NewPCG(1, 2))
	var recs []Record
	for i, n := range []int{0, 10, preadGuess - FrameOverhead - 1, preadGuess - FrameOverhead, preadGuess - FrameOverhead + 1, 3 * preadGuess, 200 << 10} {
		for _, compressible := range []bool{false, true} {
			recs = append(recs, Record{ID: idN(2, 2*i+len(recs)%2), Data: payload(rng, n, compressible)})
		}
	}
	if err := s.PutMany(coll, recs); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, opts) // every frame inside the mapping
	defer func() { _ = s.Close() }()
	for _, r := range recs {
		before := s.mappedReads.Load()
		mustGetKind(t, s, coll, r.ID, 1, r.Data)
		if got := s.mappedReads.Load(); got != before {
			t.Fatalf("record of %d bytes: a pread read counted %d mapped reads", len(r.Data), got-before)
		}
		mustGetKind(t, s, coll, r.ID, 2, r.Data)
		if got := s.mappedReads.Load(); got != before+1 {
			t.Fatalf("record of %d bytes: a mapped read counted %d mapped reads, want 1", len(r.Data), got-before)
		}
	}

	// Damage the payload of the incompressible 10-byte record: a pread read
	// of it is ErrCorrupt.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	shards, _ := filepath.Glob(filepath.Join(dir, "shard-*.mtdb"))
	if len(shards) != 1 {
		t.Fatalf("shards %v, want one", shards)
	}
	b, err := os.ReadFile(shards[0])
	if err != nil {
		t.Fatal(err)
	}
	target := recs[2]
	at := bytes.Index(b, target.Data)
	if at < 0 || bytes.Count(b, target.Data) != 1 {
		t.Fatalf("record %s: payload found %d times in the shard", target.ID, bytes.Count(b, target.Data))
	}
	b[at] ^= 0xff
	if err := os.WriteFile(shards[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, opts)
	if _, err := s.GetKind(coll, target.ID, 1); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("GetKind of a damaged frame with pread: %v, want ErrCorrupt", err)
	}
}

// TestRewriteOverDamagedHead: a record whose frame's record ID was damaged on
// disk is ErrCorrupt to read; written again (the writer cannot match the
// damaged frame to it and gives it a slot of its own), it reads back as
// written, not as the damaged frame's error.
func TestRewriteOverDamagedHead(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Dir: dir}
	s := openStore(t, opts)
	coll, id := idN(1, 0), idN(2, 7)
	if err := s.Put(coll, id, []byte("first version")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	shards, _ := filepath.Glob(filepath.Join(dir, "shard-*.mtdb"))
	b, err := os.ReadFile(shards[0])
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(b, id[:])
	if at < 0 {
		t.Fatalf("record ID not found in the shard")
	}
	b[at+len(id)-1] ^= 0x01 // the ID's last byte: its index tag is unchanged
	if err := os.WriteFile(shards[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, opts)
	defer func() { _ = s.Close() }()
	if _, err := s.Get(coll, id); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Get of the damaged record: %v, want ErrCorrupt", err)
	}
	if err := s.Put(coll, id, []byte("second version")); err != nil {
		t.Fatal(err)
	}
	mustGet(t, s, coll, id, []byte("second version"))
}
