package hamtstore

import (
	"errors"
	"testing"
)

// refusingStore is a NodeStore that refuses writes, as a read-only store does.
type refusingStore struct{ *MemNodeStore }

var errReadOnly = errors.New("read-only")

func (refusingStore) PutNodes([]EncodedNode) error { return errReadOnly }

// TestOverlay: a map built over a read-only base through an overlay reads back
// every entry, the base's nodes included, and the base is never written.
func TestOverlay(t *testing.T) {
	base := NewMemNodeStore()
	rd := NewReader(base)
	var root NodeID
	var err error
	for i := range 200 {
		if root, err = Set(base, rd, root, []byte{byte(i), byte(i >> 8), 'k'}, Value{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	before := base.Len()
	ro := refusingStore{base}
	if _, err := Set(ro, NewReader(ro), root, []byte("new"), Value{1}); !errors.Is(err, errReadOnly) {
		t.Fatalf("write to the read-only base: %v", err)
	}
	ov := NewOverlay(ro)
	ord := NewReader(ov)
	root2 := root
	for i := range 50 {
		if root2, err = Set(ov, ord, root2, []byte{byte(i), 'n'}, Value{2, byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if base.Len() != before || ov.Len() == 0 {
		t.Fatalf("base went from %d to %d nodes; overlay holds %d", before, base.Len(), ov.Len())
	}
	check := NewReader(ov)
	for i := range 200 {
		if v, ok, err := check.Get(root2, []byte{byte(i), byte(i >> 8), 'k'}); err != nil || !ok || v != (Value{byte(i)}) {
			t.Fatalf("base entry %d: %v %v %v", i, v, ok, err)
		}
	}
	for i := range 50 {
		if v, ok, err := check.Get(root2, []byte{byte(i), 'n'}); err != nil || !ok || v != (Value{2, byte(i)}) {
			t.Fatalf("overlay entry %d: %v %v %v", i, v, ok, err)
		}
	}
}
