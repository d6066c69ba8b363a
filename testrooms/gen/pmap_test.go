package gen

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// TestPmapModel checks the persistent map against a Go map, and that old versions
// are unchanged after updates.
func TestPmapModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	model := map[string]int32{}
	var m pmap
	type snap struct {
		m     pmap
		model map[string]int32
	}
	var snaps []snap
	for i := range 20000 {
		k := fmt.Sprintf("m.room.member\x00@user%d:server%d.test", rng.IntN(3000), rng.IntN(5))
		v := int32(i)
		m = m.set(k, v)
		model[k] = v
		if i%2000 == 0 {
			cp := map[string]int32{}
			for k, v := range model {
				cp[k] = v
			}
			snaps = append(snaps, snap{m, cp})
		}
	}
	check := func(m pmap, model map[string]int32) {
		t.Helper()
		if m.size != len(model) {
			t.Fatalf("size %d, model %d", m.size, len(model))
		}
		n := 0
		m.each(func(k string, v int32) {
			n++
			if model[k] != v {
				t.Fatalf("key %q: %d, model %d", k, v, model[k])
			}
		})
		if n != len(model) {
			t.Fatalf("each saw %d, model %d", n, len(model))
		}
		for k, v := range model {
			if got, ok := m.get(k); !ok || got != v {
				t.Fatalf("get %q: %d %v, model %d", k, got, ok, v)
			}
		}
	}
	check(m, model)
	for _, s := range snaps {
		check(s.m, s.model)
	}
	// diff against the model's difference
	a, b := snaps[1], snaps[len(snaps)-1]
	var got []string
	diff(a.m, b.m, func(k string) { got = append(got, k) })
	var want []string
	for k, v := range a.model {
		if w, ok := b.model[k]; !ok || w != v {
			want = append(want, k)
		}
	}
	for k := range b.model {
		if _, ok := a.model[k]; !ok {
			want = append(want, k)
		}
	}
	sort.Strings(got)
	sort.Strings(want)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("diff: %d keys, want %d", len(got), len(want))
	}
}

func TestPmapDelete(t *testing.T) {
	var m pmap
	for i := range 1000 {
		m = m.set(fmt.Sprint(i), int32(i))
	}
	old := m
	for i := 0; i < 1000; i += 2 {
		m = m.del(fmt.Sprint(i))
	}
	m = m.del("absent")
	if m.size != 500 || old.size != 1000 {
		t.Fatalf("sizes %d %d", m.size, old.size)
	}
	for i := range 1000 {
		_, ok := m.get(fmt.Sprint(i))
		if ok != (i%2 == 1) {
			t.Fatalf("key %d present=%v", i, ok)
		}
		if _, ok := old.get(fmt.Sprint(i)); !ok {
			t.Fatalf("old version lost key %d", i)
		}
	}
	n := 0
	diff(old, m, func(string) { n++ })
	if n != 500 {
		t.Fatalf("diff %d keys, want 500", n)
	}
}

// TestSameKeyAncestor checks the jump-pointer ancestor test against walking
// prevSame links, on random lineage forests (printed seed).
func TestSameKeyAncestor(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	r := &room{}
	for i := range 5000 {
		e := &event{prevSame: -1}
		if i > 0 && rng.IntN(20) > 0 {
			// Mostly extend a recent event (long lineages), sometimes branch off
			// an old one.
			p := int32(i - 1 - rng.IntN(min(i, 3)))
			if rng.IntN(10) == 0 {
				p = int32(rng.IntN(i))
			}
			e.prevSame, e.sdepth = p, r.events[p].sdepth+1
		}
		r.setJump(e, int32(i))
		r.events = append(r.events, e)
	}
	v := authView{room: r}
	naive := func(z, u int32) bool {
		for ; u >= 0; u = r.events[u].prevSame {
			if u == z {
				return true
			}
		}
		return false
	}
	hits := 0
	for range 200000 {
		u := int32(rng.IntN(len(r.events)))
		z := int32(rng.IntN(int(u) + 1))
		if rng.IntN(2) == 0 { // an ancestor of u, or u
			z = u
			for n := rng.IntN(int(r.events[u].sdepth) + 1); n > 0; n-- {
				z = r.events[z].prevSame
			}
		}
		want := naive(z, u)
		if got := v.sameKeyAncestor(z, u); got != want {
			t.Fatalf("seed %d: sameKeyAncestor(%d, %d) = %v, want %v", seed, z, u, got, want)
		}
		if want {
			hits++
		}
	}
	if hits < 50000 {
		t.Fatalf("only %d of the pairs were ancestors", hits)
	}
}
