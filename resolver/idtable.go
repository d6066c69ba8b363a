package resolver

import (
	"hash/maphash"
	"math/bits"
)

// idTable maps event IDs to graph indexes without holding a pointer: an
// open-addressing table (linear probing) of index+1 per slot, 0 empty, sized to a
// power of two at least twice the IDs; a probe compares against ids[slot-1]. A
// map[string]int32 over a 1M-event room kept a million string keys for the
// garbage collector to scan at every cycle (17% of a 1M replay's CPU was GC
// marking); this table is one pointer-free []int32 of 8 MB.
type idTable struct {
	seed  maphash.Seed
	slots []int32
	mask  uint64
}

// newIDTable indexes ids (index i for ids[i]; a repeated ID keeps its first
// index).
func newIDTable(ids []string) idTable {
	size := uint64(1) << bits.Len64(uint64(2*len(ids)|1))
	t := idTable{seed: maphash.MakeSeed(), slots: make([]int32, size), mask: size - 1}
	for i, id := range ids {
		s := maphash.String(t.seed, id) & t.mask
		for ; t.slots[s] != 0; s = (s + 1) & t.mask {
			if ids[t.slots[s]-1] == id {
				break
			}
		}
		if t.slots[s] == 0 {
			t.slots[s] = int32(i) + 1
		}
	}
	return t
}

// find returns the index of id among ids (the slice the table was built from).
func (t idTable) find(ids []string, id string) (int32, bool) {
	if len(t.slots) == 0 {
		return 0, false
	}
	for s := maphash.String(t.seed, id) & t.mask; t.slots[s] != 0; s = (s + 1) & t.mask {
		if i := t.slots[s] - 1; ids[i] == id {
			return i, true
		}
	}
	return 0, false
}
