package hamtstore

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestOrderIndependent builds one key set many ways: shuffled single sets,
// shuffled batches, and with extra keys inserted and then deleted in a shuffled
// order. Every way must give the same root ID.
func TestOrderIndependent(t *testing.T) {
	for _, tc := range []struct {
		name string
		hash func([]byte) [32]byte
		n    int
	}{
		{"sha256", nil, 2000},
		{"weakhash", weakHash, 80},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.hash != nil {
				withHash(t, tc.hash)
			}
			rng := rand.New(rand.NewPCG(testSeed(t), 1))
			keys := make([]Change, tc.n)
			for i := range keys {
				keys[i] = Change{Key: fmt.Appendf(nil, "m.room.member\x00@u%d:hs", i)}
				keys[i].Value[0] = byte(i)
			}
			extra := make([]Change, tc.n/2)
			for i := range extra {
				extra[i] = Change{Key: fmt.Appendf(nil, "extra %d", i), Value: Value{9}}
			}
			store := NewMemNodeStore()
			want, err := Apply(store, nil, EmptyRoot, keys)
			noErr(t, err)

			for round := range 6 {
				r := NewReader(store)
				root := EmptyRoot
				all := append(append([]Change(nil), keys...), extra...)
				rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
				// Some keys first set to a wrong value, fixed later.
				for _, c := range all[:len(all)/4] {
					c.Value[15] = 0xEE
					root, err = Set(store, r, root, c.Key, c.Value)
					noErr(t, err)
				}
				for len(all) > 0 {
					k := 1 + rng.IntN(1+round*20)
					k = min(k, len(all))
					root, err = Apply(store, r, root, all[:k])
					noErr(t, err)
					all = all[k:]
				}
				dels := make([]Change, len(extra))
				for i, c := range extra {
					dels[i] = Change{Key: c.Key, Delete: true}
				}
				rng.Shuffle(len(dels), func(i, j int) { dels[i], dels[j] = dels[j], dels[i] })
				for len(dels) > 0 {
					k := min(1+rng.IntN(1+round*5), len(dels))
					root, err = Apply(store, r, root, dels[:k])
					noErr(t, err)
					dels = dels[k:]
				}
				equal(t, want, root, "round %d", round)
				noErr(t, NewReader(store).Check(root))
			}
		})
	}
}

// TestApplyBatchOverride checks that within one batch the last change to a key
// wins, and that a batch whose changes cancel out returns the old root.
func TestApplyBatchOverride(t *testing.T) {
	store := NewMemNodeStore()
	root := buildMap(t, store, 50)
	r := NewReader(store)
	same, err := Apply(store, r, root, []Change{
		{Key: []byte("new"), Value: Value{1}},
		{Key: []byte("key 3"), Value: Value{7}},
		{Key: []byte("new"), Delete: true},
		{Key: []byte("key 3"), Value: Value{3}},
	})
	noErr(t, err)
	equal(t, root, same)
	next, err := Apply(store, r, root, []Change{
		{Key: []byte("k"), Value: Value{1}},
		{Key: []byte("k"), Value: Value{2}},
		{Key: []byte("key 4"), Delete: true},
		{Key: []byte("key 4"), Value: Value{5}},
	})
	noErr(t, err)
	v, ok, err := r.Get(next, []byte("k"))
	noErr(t, err)
	isTrue(t, ok && v == Value{2}, "k = %x", v)
	v, ok, err = r.Get(next, []byte("key 4"))
	noErr(t, err)
	isTrue(t, ok && v == Value{5}, "key 4 = %x", v)
}
