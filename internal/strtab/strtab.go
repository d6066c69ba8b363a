// Package strtab keeps a large room's many small strings in a few allocations,
// for the garbage collector's sake: an Arena copies strings into shared 64 KiB
// chunks, and an Index numbers distinct values through a map of 64-bit hashes,
// which holds no pointers. A map[string]int32 of a million strings costs each
// collection a million objects to mark and every slot of the map to scan; an
// Index over Arena copies costs it one object per chunk and its slice of
// values.
package strtab

import (
	"hash/maphash"
	"strings"
)

// chunkSize is the size of an Arena chunk, in bytes.
const chunkSize = 64 << 10

// Arena copies strings into shared chunks. The zero Arena is ready to use; an
// Arena must not be copied after its first Copy (it holds a strings.Builder).
type Arena struct {
	cur strings.Builder
}

// Copy returns a copy of s held in the arena's current chunk, starting a new
// chunk when s does not fit. An empty s is returned as it is; a string longer
// than a quarter chunk gets an allocation of its own.
func (a *Arena) Copy(s string) string {
	switch {
	case s == "":
		return ""
	case len(s) > chunkSize/4:
		return strings.Clone(s)
	}
	if a.cur.Cap()-a.cur.Len() < len(s) {
		a.cur = strings.Builder{}
		a.cur.Grow(chunkSize)
	}
	start := a.cur.Len()
	a.cur.WriteString(s)
	// The Builder only ever appends, and never past the capacity grown above:
	// the bytes of an earlier string are not written again.
	return a.cur.String()[start:]
}

// Index numbers distinct values from 0 in the order they are added, and finds
// a value's number in constant expected time. Values are found by a 64-bit hash
// in a pointer-free map; values whose hash an earlier value has are kept in a
// second, ordinary map. The zero Index is not usable: make one with NewIndex.
type Index[K comparable] struct {
	seed   maphash.Seed
	hash   func(maphash.Seed, K) uint64
	byHash map[uint64]int32
	clash  map[K]int32
	values []K
}

// NewIndex returns an empty Index with room for about n values, hashing them
// with hash under a seed of its own (maphash.String for strings; for other
// values, a function that does not make them escape to the heap, as
// maphash.Comparable does).
func NewIndex[K comparable](n int, hash func(maphash.Seed, K) uint64) *Index[K] {
	return &Index[K]{seed: maphash.MakeSeed(), hash: hash, byHash: make(map[uint64]int32, n), values: make([]K, 0, n)}
}

// IndexOf returns an Index over values, numbering each by its position and
// keeping the slice itself (a later Add appends to it). Values should be
// distinct: of two equal values, Find returns the first's position.
func IndexOf[K comparable](values []K, hash func(maphash.Seed, K) uint64) *Index[K] {
	x := &Index[K]{seed: maphash.MakeSeed(), hash: hash, byHash: make(map[uint64]int32, len(values)), values: values}
	for n, v := range values {
		x.place(v, int32(n))
	}
	return x
}

// Find returns v's number, false when v was not added.
func (x *Index[K]) Find(v K) (int32, bool) {
	n, ok := x.byHash[x.hash(x.seed, v)]
	if !ok {
		return 0, false
	}
	if x.values[n] == v {
		return n, true
	}
	n, ok = x.clash[v]
	return n, ok
}

// Add returns v's number, giving v the next one when it was not added before
// (added true). The Index keeps v itself: a caller that wants v's strings in
// an Arena copies them there first.
func (x *Index[K]) Add(v K) (n int32, added bool) {
	n = int32(len(x.values))
	if old, had := x.place(v, n); had {
		return old, false
	}
	x.values = append(x.values, v)
	return n, true
}

// place records v as number n unless an equal value has a number already
// (returned, had true). values[n] must be v by the time Find runs.
func (x *Index[K]) place(v K, n int32) (old int32, had bool) {
	h := x.hash(x.seed, v)
	first, ok := x.byHash[h]
	switch {
	case !ok:
		x.byHash[h] = n
		return n, false
	case x.values[first] == v:
		return first, true
	}
	if old, had = x.clash[v]; had {
		return old, true
	}
	if x.clash == nil {
		x.clash = map[K]int32{}
	}
	x.clash[v] = n
	return n, false
}

// At returns the value numbered n (0 <= n < Len()).
func (x *Index[K]) At(n int32) K { return x.values[n] }

// Len returns the number of values added.
func (x *Index[K]) Len() int { return len(x.values) }
