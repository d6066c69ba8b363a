package hamtstore

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

// goldenByName returns the golden node called name.
func goldenByName(t testing.TB, name string) []byte {
	for _, g := range readGolden(t) {
		if g.name == name {
			return g.data
		}
	}
	t.Fatalf("no golden node %q", name)
	return nil
}

// TestDecodeCorrupt damages good nodes one way per row and expects ErrCorrupt
// with a message naming what failed.
func TestDecodeCorrupt(t *testing.T) {
	two := goldenByName(t, "two/0")     // root, two entries, no children
	forty := goldenByName(t, "forty/0") // root with entries and children
	inner := goldenByName(t, "forty/1") // depth 1, two entries
	mod := func(base []byte, f func(b []byte) []byte) []byte {
		return f(append([]byte(nil), base...))
	}
	rows := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "shorter than the 4-byte prefix"},
		{"prefix only", two[:prefixLen], "shorter than the 12-byte bitmap header"},
		{"bad magic", mod(two, func(b []byte) []byte { b[offMagic] = 0; return b }), "bad magic"},
		{"bad version", mod(two, func(b []byte) []byte { b[offVersion] = 2; return b }), "unknown version 2"},
		{"bad kind", mod(two, func(b []byte) []byte { b[offKind] = 9; return b }), "unknown node kind 9"},
		{"bitmap too deep", mod(two, func(b []byte) []byte { b[offDepth] = collisionDepth; return b }), "bitmap node at depth 51"},
		{"truncated", two[:len(two)-1], "overruns"},
		{"trailing byte", append(append([]byte(nil), two...), 0), "trailing bytes"},
		{"overlapping bitmaps", mod(forty, func(b []byte) []byte {
			dm := binary.LittleEndian.Uint32(b[offDatamap:])
			binary.LittleEndian.PutUint32(b[offNodemap:], binary.LittleEndian.Uint32(b[offNodemap:])|dm&-dm)
			return b
		}), "overlap"},
		{"extra datamap bit", mod(inner, func(b []byte) []byte {
			dm := binary.LittleEndian.Uint32(b[offDatamap:])
			for s := uint32(1); s != 0; s <<= 1 {
				if dm&s == 0 {
					dm |= s
					break
				}
			}
			binary.LittleEndian.PutUint32(b[offDatamap:], dm)
			return b
		}), "need at least"},
		{"huge counts", mod(two, func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[offDatamap:], 0x0000ffff)
			binary.LittleEndian.PutUint32(b[offNodemap:], 0xffff0000)
			return b
		}), "need at least"},
		{"empty node", mod(two, func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[offDatamap:], 0)
			return b[:bitmapHeaderLen]
		}), "empty node"},
		{"single entry below root", mod(inner, func(b []byte) []byte {
			dm := binary.LittleEndian.Uint32(b[offDatamap:])
			binary.LittleEndian.PutUint32(b[offDatamap:], dm&-dm)
			k := int(b[bitmapHeaderLen])
			return b[:bitmapHeaderLen+1+k+valueLen]
		}), "single-entry node at depth 1"},
		{"wrong depth for keys", mod(inner, func(b []byte) []byte { b[offDepth] = 2; return b }), "key hash fragment"},
		{"key in wrong slot", mod(two, func(b []byte) []byte {
			dm := binary.LittleEndian.Uint32(b[offDatamap:])
			binary.LittleEndian.PutUint32(b[offDatamap:], dm<<1|dm>>31)
			return b
		}), "stored in slot"},
		{"non-minimal varint", mod(two, func(b []byte) []byte {
			// Key length 14 as two bytes 0x8e 0x00.
			out := append([]byte(nil), b[:bitmapHeaderLen]...)
			out = append(out, b[bitmapHeaderLen]|0x80, 0)
			return append(out, b[bitmapHeaderLen+1:]...)
		}), "non-minimal"},
		{"key too long", mod(two, func(b []byte) []byte {
			out := binary.AppendUvarint(append([]byte(nil), b[:bitmapHeaderLen]...), MaxKeyLen+1)
			return append(out, make([]byte, MaxKeyLen+40)...)
		}), "exceeds"},
		{"varint overflow", mod(two, func(b []byte) []byte {
			out := append([]byte(nil), b[:bitmapHeaderLen]...)
			for range 11 {
				out = append(out, 0xff)
			}
			return append(out, make([]byte, 40)...)
		}), "bad key length varint"},
		{"zero child id", mod(forty, func(b []byte) []byte {
			copy(b[len(b)-idLen:], make([]byte, idLen))
			return b
		}), "empty ID"},
		{"collision at depth 50", mod(two, func(b []byte) []byte {
			b[offKind] = kindCollision
			b[offDepth] = 50
			return b
		}), "collision node at depth 50"},
		{"collision count 1", []byte{formatMagic, formatVersion, kindCollision, collisionDepth, 1, 0, 0, 0, 1, 'a', 15: 0, 26: 0}, "collision node with 1 entries"},
		{"collision count huge", []byte{formatMagic, formatVersion, kindCollision, collisionDepth, 0xff, 0xff, 0xff, 0xff, 1, 'a'}, "needs more than"},
		{"collision keys differ in hash", mod(goldenByName(t, "collision"), func(b []byte) []byte {
			b[len(b)-valueLen-1] ^= 0x55 // change the second key
			return b
		}), "key hash differs"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, err := decodeNode(NodeIDOf(row.data), row.data)
			errIs(t, err, ErrCorrupt)
			isTrue(t, strings.Contains(err.Error(), row.want), "error %q does not mention %q", err, row.want)
			id := NodeIDOf(row.data)
			isTrue(t, strings.Contains(err.Error(), id.String()), "error %q does not name the node", err)
		})
	}
}

// TestStoreCorrupt damages a stored map and expects reads and Check to fail
// with ErrCorrupt (or a wrapped not-found error), never to return wrong data.
func TestStoreCorrupt(t *testing.T) {
	setup := func() (*MemNodeStore, NodeID, *node) {
		store := NewMemNodeStore()
		root := buildMap(t, store, 200)
		r := NewReader(store)
		n, err := r.root(root)
		noErr(t, err)
		isTrue(t, len(n.children) >= 2)
		return store, root, n
	}
	everything := func(store NodeStore, root NodeID) error {
		r := NewReader(store)
		if _, err := r.Len(root); err != nil {
			return err
		}
		return r.Check(root)
	}

	t.Run("flipped byte", func(t *testing.T) {
		store, root, n := setup()
		data, _ := store.Raw(n.children[1].id)
		bad := append([]byte(nil), data...)
		bad[len(bad)-1] ^= 1
		store.Replace(n.children[1].id, bad)
		err := everything(store, root)
		errIs(t, err, ErrCorrupt)
		isTrue(t, strings.Contains(err.Error(), "content hashes to"), "%v", err)
	})
	t.Run("missing child", func(t *testing.T) {
		store, root, n := setup()
		store.mu.Lock()
		delete(store.nodes, n.children[0].id)
		store.mu.Unlock()
		err := everything(store, root)
		errIs(t, err, ErrNotFound)
		err = NewReader(store).Check(root)
		errIs(t, err, ErrNotFound)
	})
	t.Run("children swapped", func(t *testing.T) {
		// A root whose child IDs are swapped decodes fine, but the keys
		// below sit under the wrong slots: Check finds it.
		store, _, n := setup()
		id := storeSwapped(t, store, n)
		err := NewReader(store).Check(id)
		errIs(t, err, ErrCorrupt)
		isTrue(t, strings.Contains(err.Error(), "but the node is under slot"), "%v", err)
	})
	t.Run("child at wrong depth", func(t *testing.T) {
		// Point the root at another root (depth 0) as if it were a child.
		store, _, n := setup()
		other := buildMap(t, store, 3)
		bad := n.clone()
		bad.children[0] = childRef{id: other}
		data := bad.encode()
		id := NodeIDOf(data)
		noErr(t, store.PutNodes([]EncodedNode{{ID: id, Data: data}}))
		err := everything(store, id)
		errIs(t, err, ErrCorrupt)
		isTrue(t, strings.Contains(err.Error(), "reached at depth 1"), "%v", err)
		err = NewReader(store).Check(id)
		errIs(t, err, ErrCorrupt)
	})
	t.Run("store error passes through", func(t *testing.T) {
		boom := errors.New("disk on fire")
		_, err := Set(failStore{boom}, nil, EmptyRoot, []byte("k"), Value{})
		errIs(t, err, boom)
	})
}

type failStore struct{ err error }

func (f failStore) GetNode(NodeID) ([]byte, error)     { return nil, f.err }
func (f failStore) PutNodes(nodes []EncodedNode) error { return f.err }

// TestCheckShared: CheckShared over two roots that differ by one key reads only
// the second root's new path and visits only its entries; a corrupt node shared
// by both fails both; a known-good child moved to another slot is still caught
// (the memo is keyed by position, not by ID alone).
func TestCheckShared(t *testing.T) {
	store := NewMemNodeStore()
	a := buildMap(t, store, 2000)
	b, err := Set(store, nil, a, []byte("one more key"), Value{7})
	noErr(t, err)

	r := NewReader(store)
	visits := 0
	count := func([]byte, Value) error { visits++; return nil }
	noErr(t, r.CheckShared(a, count))
	equal(t, 2000, visits, "entries visited in the first root")
	readA := r.NodesRead()
	visits = 0
	noErr(t, r.CheckShared(b, count))
	readB := r.NodesRead() - readA
	isTrue(t, readB <= 4, "second root read %d nodes (first: %d)", readB, readA)
	isTrue(t, visits >= 1 && visits < 100, "second root visited %d entries", visits)

	boom := errors.New("bad entry")
	err = NewReader(store).CheckShared(b, func(k []byte, _ Value) error {
		if string(k) == "key 1234" {
			return boom
		}
		return nil
	})
	errIs(t, err, boom)

	// Corrupt a child of a's root (shared with b: the new key went elsewhere or
	// not; either way one of a's children is shared).
	n, err := NewReader(store).root(a)
	noErr(t, err)
	nb, err := NewReader(store).root(b)
	noErr(t, err)
	shared := -1
	for i, c := range n.children {
		if i < len(nb.children) && nb.children[i].id == c.id {
			shared = i
		}
	}
	isTrue(t, shared >= 0, "no child shared between the two roots")
	data, _ := store.Raw(n.children[shared].id)
	bad := append([]byte(nil), data...)
	bad[len(bad)-1] ^= 1
	store.Replace(n.children[shared].id, bad)
	r = NewReader(store)
	errIs(t, r.CheckShared(a, nil), ErrCorrupt)
	errIs(t, r.CheckShared(b, nil), ErrCorrupt)
	store.Replace(n.children[shared].id, data)

	// Swap two children of a's root: each moved child was checked (at its own
	// slot) through a, and must fail at the other.
	r = NewReader(store)
	noErr(t, r.CheckShared(a, nil))
	err = r.CheckShared(storeSwapped(t, store, n), nil)
	errIs(t, err, ErrCorrupt)
	isTrue(t, strings.Contains(err.Error(), "but the node is under slot"), "%v", err)
}

// storeSwapped stores a copy of n with its first two children swapped and returns
// its ID.
func storeSwapped(t testing.TB, store NodeStore, n *node) NodeID {
	bad := n.clone()
	bad.children[0], bad.children[1] = bad.children[1], bad.children[0]
	bad.children[0].n, bad.children[1].n = nil, nil
	data := bad.encode()
	id := NodeIDOf(data)
	noErr(t, store.PutNodes([]EncodedNode{{ID: id, Data: data}}))
	return id
}
