package resolver

import (
	"encoding/binary"
	"math/bits"

	"github.com/mtxdb/mtxdb/packstore"
)

// recordTable maps event record IDs (roomrecord.EventRecordID, the values of
// state snapshots) to graph indexes: an open-addressing table (linear
// probing) of index+1 per slot, 0 empty, sized to a power of two at least
// twice the records, homed by the ID's first eight bytes (the IDs are
// truncated SHA-256 digests); a probe compares the whole ID against
// recs[slot-1]. Both arrays are pointer-free: 4 bytes per slot and the 16-byte
// IDs, 24 MiB for a 1M-event room, where a map[packstore.ID]int32 takes 42 MiB.
type recordTable struct {
	slots []int32
	recs  []packstore.ID
	mask  uint64
}

// newRecordTable indexes recs (index i for recs[i]; a repeated ID keeps its
// first index). The table keeps recs.
func newRecordTable(recs []packstore.ID) recordTable {
	size := uint64(1) << bits.Len64(uint64(2*len(recs)|1))
	t := recordTable{slots: make([]int32, size), recs: recs, mask: size - 1}
	for i := range recs {
		s := binary.LittleEndian.Uint64(recs[i][:8]) & t.mask
		for ; t.slots[s] != 0; s = (s + 1) & t.mask {
			if recs[t.slots[s]-1] == recs[i] {
				break
			}
		}
		if t.slots[s] == 0 {
			t.slots[s] = int32(i) + 1
		}
	}
	return t
}

// find returns the index of rec, false when the table does not hold it.
func (t recordTable) find(rec packstore.ID) (int32, bool) {
	if len(t.slots) == 0 {
		return 0, false
	}
	for s := binary.LittleEndian.Uint64(rec[:8]) & t.mask; t.slots[s] != 0; s = (s + 1) & t.mask {
		if i := t.slots[s] - 1; t.recs[i] == rec {
			return i, true
		}
	}
	return 0, false
}
