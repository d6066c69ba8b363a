package hamtstore

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"testing"

	"github.com/mtxdb/mtxdb/internal/testseed"
)

var (
	flagSeed  = flag.Uint64("hamt.seed", 0, "seed for the random model tests (0: from HAMT_SEED or the clock)")
	flagSteps = flag.Int("hamt.steps", 0, "steps per random model test (0: from HAMT_STEPS or the default)")
)

// testSeed returns the seed to use and logs it so a failure can be replayed with
// -hamt.seed=N (or HAMT_SEED=N).
func testSeed(t testing.TB) uint64 {
	t.Helper()
	return testseed.Seed(t, "hamt.seed", *flagSeed, "HAMT_SEED")
}

func testSteps(def int) int {
	if *flagSteps > 0 {
		return *flagSteps
	}
	if s, err := strconv.Atoi(os.Getenv("HAMT_STEPS")); err == nil && s > 0 {
		return s
	}
	return def
}

// weakHash keeps only the first byte of SHA-256, so keys collide in hash after
// 8 bits: long single-child chains and collision nodes at depth 51.
func weakHash(key []byte) [32]byte {
	full := sha256.Sum256(key)
	var h [32]byte
	h[0] = full[0] & 0xF0 // 4 bits: at most 16 distinct hashes
	return h
}

// withHash swaps the key hash for the duration of a test. Tests using it must
// not run in parallel.
func withHash(t *testing.T, h func([]byte) [32]byte) {
	old := keyHash
	keyHash = h
	t.Cleanup(func() { keyHash = old })
}

type model map[string]Value

// readAll returns the contents of root and checks that Iterate agrees with Len
// and that keys come once each.
func readAll(t *testing.T, r *Reader, root NodeID) model {
	t.Helper()
	got := model{}
	err := r.Iterate(root, func(key []byte, v Value) error {
		if _, dup := got[string(key)]; dup {
			return fmt.Errorf("key %q iterated twice", key)
		}
		got[string(key)] = v
		return nil
	})
	noErr(t, err)
	n, err := r.Len(root)
	noErr(t, err)
	equal(t, len(got), n)
	return got
}

func requireContents(t *testing.T, r *Reader, root NodeID, want model, probes [][]byte) {
	t.Helper()
	got := readAll(t, r, root)
	equal(t, want, got, "root %x", root[:])
	for _, k := range probes {
		v, ok, err := r.Get(root, k)
		noErr(t, err)
		wv, wok := want[string(k)]
		equal(t, wok, ok, "Get(%q) presence", k)
		equal(t, wv, v, "Get(%q) value", k)
	}
}

type diffRec struct {
	old, new *Value
}

func modelDiff(a, b model) map[string]diffRec {
	out := map[string]diffRec{}
	for k, va := range a {
		vb, ok := b[k]
		switch {
		case !ok:
			va := va
			out[k] = diffRec{old: &va}
		case va != vb:
			va, vb := va, vb
			out[k] = diffRec{old: &va, new: &vb}
		}
	}
	for k, vb := range b {
		if _, ok := a[k]; !ok {
			vb := vb
			out[k] = diffRec{new: &vb}
		}
	}
	return out
}

// copyOf returns a pointer to a copy of *v, nil for nil.
func copyOf(v *Value) *Value {
	if v == nil {
		return nil
	}
	c := *v
	return &c
}

func requireDiff(t *testing.T, r *Reader, a, b NodeID, ma, mb model) {
	t.Helper()
	got := map[string]diffRec{}
	var prev []byte
	err := r.Diff(a, b, func(key []byte, old, new *Value) error {
		if _, dup := got[string(key)]; dup {
			return fmt.Errorf("key %q reported twice", key)
		}
		if prev != nil && hashLess(key, prev) {
			return fmt.Errorf("key %q reported out of hash order", key)
		}
		prev = key
		got[string(key)] = diffRec{old: copyOf(old), new: copyOf(new)} // valid until fn returns
		return nil
	})
	noErr(t, err)
	equal(t, modelDiff(ma, mb), got)
}

// hashLess orders keys as Iterate and Diff do.
func hashLess(a, b []byte) bool {
	ha, hb := keyHash(a), keyHash(b)
	if c := bytes.Compare(ha[:], hb[:]); c != 0 {
		return c < 0
	}
	return bytes.Compare(a, b) < 0
}

func bruteDiffN(ms []model) map[string][]*Value {
	out := map[string][]*Value{}
	all := map[string]bool{}
	for _, m := range ms {
		for k := range m {
			all[k] = true
		}
	}
	for k := range all {
		vals := make([]*Value, len(ms))
		conflict := false
		for i, m := range ms {
			if v, ok := m[k]; ok {
				vals[i] = &v
			}
		}
		for _, v := range vals {
			if v == nil || vals[0] == nil || *v != *vals[0] {
				conflict = true
			}
		}
		if conflict {
			out[k] = vals
		}
	}
	return out
}

func requireDiffN(t *testing.T, r *Reader, roots []NodeID, ms []model) {
	t.Helper()
	got := map[string][]*Value{}
	err := r.DiffN(roots, func(key []byte, vals []*Value) error {
		if _, dup := got[string(key)]; dup {
			return fmt.Errorf("key %q reported twice", key)
		}
		c := make([]*Value, len(vals)) // vals is valid until fn returns
		for i, v := range vals {
			c[i] = copyOf(v)
		}
		got[string(key)] = c
		return nil
	})
	noErr(t, err)
	equal(t, bruteDiffN(ms), got)
}

type snapshot struct {
	root NodeID
	m    model
	list []kv // m in Iterate order
}

type kv struct {
	key string
	val Value
}

// inIterateOrder lists m in the order Iterate must produce: by key hash, then
// bytewise.
func inIterateOrder(m model) []kv {
	type hk struct {
		h [32]byte
		kv
	}
	tmp := make([]hk, 0, len(m))
	for k, v := range m {
		tmp = append(tmp, hk{keyHash([]byte(k)), kv{k, v}})
	}
	sort.Slice(tmp, func(i, j int) bool {
		if c := bytes.Compare(tmp[i].h[:], tmp[j].h[:]); c != 0 {
			return c < 0
		}
		return tmp[i].key < tmp[j].key
	})
	out := make([]kv, len(tmp))
	for i := range tmp {
		out[i] = tmp[i].kv
	}
	return out
}

// requireList checks that Iterate(root) yields exactly list, in order.
func requireList(t *testing.T, r *Reader, root NodeID, list []kv) {
	t.Helper()
	i := 0
	err := r.Iterate(root, func(key []byte, v Value) error {
		if i >= len(list) || string(key) != list[i].key || v != list[i].val {
			return fmt.Errorf("entry %d: got %q=%x", i, key, v[:])
		}
		i++
		return nil
	})
	noErr(t, err, "root %x", root[:])
	equal(t, len(list), i, "root %x: entry count", root[:])
}

// randomKey draws from a small key space (so sets hit existing keys and deletes
// find them), sometimes long, sometimes empty.
func randomKey(rng *rand.Rand, space int) []byte {
	switch rng.IntN(20) {
	case 0:
		return bytes.Repeat([]byte{byte(rng.IntN(4))}, 200+rng.IntN(200))
	case 1:
		return []byte{}
	}
	return fmt.Appendf(nil, "m.room.member\x00@user%d:example.org", rng.IntN(space))
}

func randomValue(rng *rand.Rand) Value {
	var v Value
	v[0] = byte(rng.IntN(3)) // often equal values, so sets that change nothing happen
	v[15] = byte(rng.IntN(256))
	return v
}

// runModel drives random batches against a Go map model.
func runModel(t *testing.T, steps, space int) {
	rng := rand.New(rand.NewPCG(testSeed(t), 0))
	store := NewMemNodeStore()
	r := NewReader(store)
	cur := model{}
	root := EmptyRoot
	history := []snapshot{{root, model{}, nil}}
	for step := 0; step < steps; step++ {
		var changes []Change
		batch := 1 + rng.IntN(8)
		if rng.IntN(10) == 0 {
			batch = 30 + rng.IntN(60)
		}
		next := maps.Clone(cur)
		for range batch {
			k := randomKey(rng, space)
			if rng.IntN(3) == 0 {
				changes = append(changes, Change{Key: k, Delete: true})
				delete(next, string(k))
			} else {
				v := randomValue(rng)
				changes = append(changes, Change{Key: k, Value: v})
				next[string(k)] = v
			}
		}
		calls := store.PutCalls()
		newRoot, err := Apply(store, r, root, changes)
		noErr(t, err, "step %d", step)
		isTrue(t, store.PutCalls()-calls <= 1, "one PutNodes per Apply")
		if len(next) == 0 {
			equal(t, EmptyRoot, newRoot)
		}

		probes := make([][]byte, 0, 8)
		for range 8 {
			probes = append(probes, randomKey(rng, space))
		}
		requireContents(t, r, newRoot, next, probes)
		noErr(t, r.Check(newRoot), "step %d", step)
		requireDiff(t, r, root, newRoot, cur, next)

		list := inIterateOrder(next)
		requireList(t, r, newRoot, list)
		history = append(history, snapshot{newRoot, next, list})
		// Every old root still reads its old contents (through the cache that
		// Apply used, so in-memory nodes were not modified) ...
		for _, s := range history {
			requireList(t, r, s.root, s.list)
		}
		// ... and, from time to time, from the store alone.
		if step%50 == 0 || step == steps-1 {
			fresh := NewReader(store)
			for _, s := range history {
				requireList(t, fresh, s.root, s.list)
			}
		}
		old := history[rng.IntN(len(history))]
		requireDiff(t, r, old.root, newRoot, old.m, next)
		requireDiff(t, NewReader(store), newRoot, old.root, next, old.m)

		var roots []NodeID
		var ms []model
		for range 1 + rng.IntN(4) {
			s := history[rng.IntN(len(history))]
			roots, ms = append(roots, s.root), append(ms, s.m)
		}
		requireDiffN(t, r, roots, ms)
		requireDiffN(t, NewReader(store), roots, ms)

		root, cur = newRoot, next
	}
	t.Logf("%d steps, final map %d keys, %d nodes stored", steps, len(cur), store.Len())
}

func TestModelRandom(t *testing.T) {
	runModel(t, testSteps(200), 400)
}

func TestModelRandomCollisions(t *testing.T) {
	withHash(t, weakHash)
	runModel(t, testSteps(80), 60)
}

func TestIterateStopsOnError(t *testing.T) {
	store := NewMemNodeStore()
	root := buildMap(t, store, 100)
	stop := errors.New("stop")
	calls := 0
	err := NewReader(store).Iterate(root, func([]byte, Value) error {
		calls++
		if calls == 7 {
			return stop
		}
		return nil
	})
	errIs(t, err, stop)
	equal(t, 7, calls)

	calls = 0
	other, err := Set(store, nil, root, []byte("x"), Value{1})
	noErr(t, err)
	other, err = Delete(store, nil, other, []byte("key 3"))
	noErr(t, err)
	err = NewReader(store).Diff(root, other, func([]byte, *Value, *Value) error { calls++; return stop })
	errIs(t, err, stop)
	equal(t, 1, calls)
}

func TestEmpty(t *testing.T) {
	store := NewMemNodeStore()
	r := NewReader(store)
	v, ok, err := r.Get(EmptyRoot, []byte("a"))
	noErr(t, err)
	isTrue(t, !ok)
	equal(t, Value{}, v)
	n, err := r.Len(EmptyRoot)
	noErr(t, err)
	equal(t, 0, n)
	noErr(t, r.Check(EmptyRoot))
	noErr(t, r.Walk(EmptyRoot, func(NodeID) (bool, error) { t.Fatal("visited"); return false, nil }))
	root, err := Delete(store, r, EmptyRoot, []byte("a"))
	noErr(t, err)
	equal(t, EmptyRoot, root)
	root, err = Apply(store, r, EmptyRoot, nil)
	noErr(t, err)
	equal(t, EmptyRoot, root)
	equal(t, int64(0), store.PutCalls())
	equal(t, 0, store.Len())

	root, err = Set(store, r, EmptyRoot, []byte("a"), Value{1})
	noErr(t, err)
	root, err = Delete(store, r, root, []byte("a"))
	noErr(t, err)
	equal(t, EmptyRoot, root)

	_, err = Set(store, r, EmptyRoot, make([]byte, MaxKeyLen+1), Value{})
	errIs(t, err, ErrKeyTooLong)
	_, _, err = r.Get(NodeID{1}, []byte("a"))
	errIs(t, err, ErrNotFound)
}

// buildMap stores keys "key 0".."key n-1" with distinct values in one batch.
func buildMap(t testing.TB, store NodeStore, n int) NodeID {
	changes := make([]Change, n)
	for i := range changes {
		changes[i] = Change{Key: fmt.Appendf(nil, "key %d", i)}
		changes[i].Value[0], changes[i].Value[1] = byte(i), byte(i>>8)
	}
	root, err := Apply(store, nil, EmptyRoot, changes)
	noErr(t, err)
	return root
}

func sortedKeys(m model) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
