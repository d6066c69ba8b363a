package hamtstore

import (
	"bytes"
	"testing"
)

// FuzzDecodeNode feeds arbitrary bytes to the decoder, seeded with the golden
// nodes. It must never panic; a node it accepts must re-encode to exactly the
// same bytes (the encoding is canonical), and reading it as a root (with
// children missing) must not panic either.
func FuzzDecodeNode(f *testing.F) {
	for _, g := range readGolden(f) {
		f.Add(g.data)
	}
	f.Add([]byte{})
	f.Add([]byte{formatMagic, formatVersion, kindCollision, collisionDepth, 2, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		id := NodeIDOf(data)
		n, err := decodeNode(id, data)
		if err != nil {
			return
		}
		if enc := n.encode(); !bytes.Equal(enc, data) {
			t.Fatalf("decoded node re-encodes differently:\n in  %x\n out %x", data, enc)
		}
		if n.depth != 0 {
			return
		}
		store := NewMemNodeStore()
		_ = store.PutNodes([]EncodedNode{{ID: id, Data: data}})
		r := NewReader(store)
		_, _ = r.Len(id)
		_ = r.Iterate(id, func([]byte, Value) error { return nil })
		_, _, _ = r.Get(id, []byte("a"))
		errCheck := r.Check(id)
		visits := 0
		errShared := NewReader(store).CheckShared(id, func([]byte, Value) error { visits++; return nil })
		if (errCheck == nil) != (errShared == nil) {
			t.Fatalf("Check: %v, CheckShared: %v", errCheck, errShared)
		}
		if errShared == nil {
			if n, err := NewReader(store).Len(id); err != nil || n != visits {
				t.Fatalf("CheckShared visited %d entries, Len %d (%v)", visits, n, err)
			}
		}
		_ = r.Diff(id, EmptyRoot, func([]byte, *Value, *Value) error { return nil })
		_, _ = Set(store, r, id, []byte("a"), Value{1})
		_, _ = Delete(store, r, id, []byte("a"))
	})
}
