package packstore

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestDenseEncodingSameBytes checks Record.Dense's claim: for data made of
// hashes (a HAMT node's bitmaps and 16-byte child IDs), encoding without the
// entropy stage writes the same frame as the default encoder, and Dense data of
// any kind reads back unchanged.
func TestDenseEncodingSameBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 0))
	s := openStore(t, DefaultOptions(t.TempDir()))
	coll := idN(1, 0)
	for i := range 200 {
		// A node-like payload: a 4-byte bitmap, then up to 32 16-byte IDs, with
		// some repeated (shared children).
		n := 1 + rng.IntN(32)
		data := make([]byte, 4, 4+16*n)
		fill(rng, data)
		for j := range n {
			id := make([]byte, 16)
			fill(rng, id)
			if j > 0 && rng.IntN(4) == 0 {
				copy(id, data[len(data)-16:])
			}
			data = append(data, id...)
		}
		plain, _, err := s.encodeRecord(nil, nil, coll, idN(2, i), data, zstdEntropy, true)
		if err != nil {
			t.Fatal(err)
		}
		dense, _, err := s.encodeRecord(nil, nil, coll, idN(2, i), data, zstdNoEntropy, true)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(plain, dense) {
			t.Fatalf("record %d (%d bytes): dense frame differs from the default one (%d against %d bytes)", i, len(data), len(dense), len(plain))
		}
	}
	text := bytes.Repeat([]byte(`{"type":"m.room.member","content":{"membership":"join"}}`), 20)
	if err := s.PutMany(coll, []Record{{ID: idN(3, 0), Data: text, Dense: true}}); err != nil {
		t.Fatal(err)
	}
	mustGet(t, s, coll, idN(3, 0), text)
}

func fill(rng *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}
