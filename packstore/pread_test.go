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
