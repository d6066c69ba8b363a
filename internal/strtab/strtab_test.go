package strtab

import (
	"flag"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/internal/testseed"
)

var seedFlag = flag.Uint64("strtab.seed", 0, "seed of the random tests (0: time-based)")

// TestArenaCopies: every copy equals its source, whatever the chunk it landed
// in, and stays equal while later copies fill that chunk and the next ones.
func TestArenaCopies(t *testing.T) {
	seed := testseed.Seed(t, "strtab.seed", *seedFlag, "")
	rng := rand.New(rand.NewPCG(seed, 0))
	var a Arena
	var want, got []string
	for i := range 20000 {
		n := rng.IntN(80)
		switch i % 997 {
		case 0:
			n = chunkSize/4 + 1 + rng.IntN(100) // its own allocation
		case 1:
			n = chunkSize / 4 // the largest that goes into a chunk
		}
		src := []byte(strings.Repeat(string(rune('a'+i%26)), n))
		if n > 0 {
			src[0] = byte(i)
		}
		s := string(src)
		want = append(want, s)
		got = append(got, a.Copy(s))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("seed %d: copy %d is %q, want %q", seed, i, got[i], want[i])
		}
	}
}

// TestIndexModel checks an Index against a map[string]int32 over random adds
// and finds, once with maphash.String and once with a hash of 3 bits, so that
// most values clash with an earlier one.
func TestIndexModel(t *testing.T) {
	seed := testseed.Seed(t, "strtab.seed", *seedFlag, "")
	for _, h := range []struct {
		name string
		fn   func(maphash.Seed, string) uint64
	}{
		{"maphash", maphash.String},
		{"3 bits", func(s maphash.Seed, v string) uint64 { return maphash.String(s, v) & 7 }},
	} {
		t.Run(h.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			x, model := NewIndex[string](0, h.fn), map[string]int32{}
			var a Arena
			for step := range 5000 {
				v := fmt.Sprintf("@u%d:s%d", rng.IntN(800), rng.IntN(3))
				if rng.IntN(2) == 0 {
					n, ok := x.Find(v)
					m, mok := model[v]
					if ok != mok || n != m {
						t.Fatalf("seed %d step %d: Find(%q) = %d, %v; want %d, %v", seed, step, v, n, ok, m, mok)
					}
					continue
				}
				n, added := x.Add(a.Copy(v))
				m, had := model[v]
				if !had {
					m = int32(len(model))
					model[v] = m
				}
				if n != m || added == had {
					t.Fatalf("seed %d step %d: Add(%q) = %d, %v; want %d, %v", seed, step, v, n, added, m, !had)
				}
			}
			if x.Len() != len(model) {
				t.Fatalf("seed %d: Len %d, want %d", seed, x.Len(), len(model))
			}
			for v, m := range model {
				if x.At(m) != v {
					t.Fatalf("seed %d: At(%d) = %q, want %q", seed, m, x.At(m), v)
				}
			}
		})
	}
}

// TestArenaShares: a thousand short copies take one chunk, not an allocation
// each.
func TestArenaShares(t *testing.T) {
	var a Arena
	a.Copy("x") // the first chunk
	allocs := testing.AllocsPerRun(1, func() {
		for i := range 1000 {
			a.Copy("@user" + string(rune('a'+i%26)) + ":example.org")
		}
	})
	// 1000 copies of 19 bytes fill 19,000 of a chunk's 65,536 bytes; the
	// concatenations above do not allocate (their results do not escape).
	if allocs > 1 {
		t.Fatalf("1000 copies made %v allocations, want at most 1", allocs)
	}
}

// TestIndexOf: an Index over a slice numbers its values by position, the first
// of equal values, with hashes that clash and without.
func TestIndexOf(t *testing.T) {
	vals := []string{"a", "b", "c", "b", "d", "e", "a", "f", "g", "h"}
	first := map[string]int32{}
	for i, v := range vals {
		if _, ok := first[v]; !ok {
			first[v] = int32(i)
		}
	}
	for name, hash := range map[string]func(maphash.Seed, string) uint64{
		"maphash": maphash.String,
		"1 bit":   func(s maphash.Seed, v string) uint64 { return maphash.String(s, v) & 1 },
	} {
		x := IndexOf(vals, hash)
		for v, want := range first {
			if n, ok := x.Find(v); !ok || n != want {
				t.Errorf("%s: Find(%q) = %d, %v; want %d", name, v, n, ok, want)
			}
		}
		if n, ok := x.Find("z"); ok {
			t.Errorf("%s: Find(%q) = %d, true; want false", name, "z", n)
		}
		if n, added := x.Add("z"); !added || n != int32(len(vals)) {
			t.Errorf("%s: Add(z) = %d, %v; want %d, true", name, n, added, len(vals))
		}
	}
}
