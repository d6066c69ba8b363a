package packstore

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"slices"
	"sync/atomic"
)

// The lossy fanout index (doc.go, "Index slot (in memory)").
//
// Each collection has a power-of-two table of 64-bit slots:
//
//	bit 63 ........ 40 | 39 ..... 28 | 27 ......... 0
//	   tag (24 bits)   | shard (12)  | offset+1 (28)
//
// The all-zero slot is empty; since the offset is stored +1 a used slot is
// never zero. The home bucket of a record ID is the top `bits` bits of the
// big-endian u64 of ID[0:8]; the tag is the big-endian 24-bit value of
// ID[8:11], independent of the bucket bits. Probing is linear and an empty
// slot terminates it (there are no deletions within one table generation).
// A tag match is only a candidate: the caller reads the frame and compares
// the full record ID, continuing the probe on mismatch (a tag collision).
const (
	slotTagShift   = 40
	slotShardShift = 28
	slotOffMask    = 1<<28 - 1
	slotShardMask  = 1<<12 - 1
	slotTagMask    = 1<<24 - 1

	minTableBits = 3 // 8 slots
)

// loc is a frame location: pack ID and byte offset in that shard.
type loc struct {
	shard uint16
	off   uint32
}

// less orders locations by pack ID, then offset: a physical order for
// batching reads, not the stream order (see pos).
func (l loc) less(o loc) bool {
	return l.shard < o.shard || (l.shard == o.shard && l.off < o.off)
}

// pos is a position in the global append stream: a shard's sequence
// number (format 0x06; the pack ID before) and an offset. Unlike pack IDs,
// sequence numbers are never reused, so a pos names the same place after
// the shard holding it was retired and its pack ID reused.
type pos struct {
	seq uint32
	off uint32
}

func (p pos) less(o pos) bool {
	return p.seq < o.seq || (p.seq == o.seq && p.off < o.off)
}

func idTag(id ID) uint64 {
	return uint64(id[8])<<16 | uint64(id[9])<<8 | uint64(id[10])
}

// slotFits reports whether l can be stored in a slot: offset+1 must fit in
// 28 bits, so the largest offset is 2^28-2. Shards are at most
// MaxShardBytesLimit (2^28-1) bytes, so every frame start fits.
func slotFits(l loc) bool { return l.shard < MaxShards && uint64(l.off)+1 <= slotOffMask }

func makeSlot(id ID, l loc) uint64 {
	return idTag(id)<<slotTagShift | uint64(l.shard)<<slotShardShift | (uint64(l.off) + 1)
}

func slotTag(s uint64) uint64 { return s >> slotTagShift & slotTagMask }

func slotLoc(s uint64) loc {
	return loc{shard: uint16(s >> slotShardShift & slotShardMask), off: uint32(s&slotOffMask) - 1}
}

// lossyTable is one immutable-size generation of a collection's index.
//
// Readers load slots with atomic loads and never lock. The single writer
// (holding PackfileStorage.mu) stores slots with single atomic 64-bit stores;
// growth builds a new table and publishes it through the collection's
// atomic.Pointer.
type lossyTable struct {
	slots []atomic.Uint64
	bits  uint
	// count of used slots; written and read only by the writer.
	count int
}

func newTable(bits uint) *lossyTable {
	if bits < minTableBits {
		bits = minTableBits
	}
	return &lossyTable{slots: make([]atomic.Uint64, 1<<bits), bits: bits}
}

// tableBitsFor returns the table size (in bits) that holds n entries at or
// below 75% load.
func tableBitsFor(n int) uint {
	bits := uint(minTableBits)
	for (n+1)*4 > (1<<bits)*3 {
		bits++
	}
	return bits
}

func (t *lossyTable) mask() uint64 { return uint64(len(t.slots) - 1) }

func (t *lossyTable) bucket(id ID) uint64 {
	return binary.BigEndian.Uint64(id[:8]) >> (64 - t.bits)
}

// candidates appends to dst every location in id's probe run whose tag
// matches id's tag, in probe order.
func (t *lossyTable) candidates(id ID, dst []loc) []loc {
	tag, m := idTag(id), t.mask()
	for i, n := t.bucket(id), 0; n < len(t.slots); i, n = (i+1)&m, n+1 {
		s := t.slots[i].Load()
		if s == 0 {
			break
		}
		if slotTag(s) == tag {
			dst = append(dst, slotLoc(s))
		}
	}
	return dst
}

// idAt reads the record ID and frame size of the frame at a location.
type idAt func(l loc) (id ID, size int, err error)

// idsAt reads into ids[i] the record ID of the frame slots[i] points at;
// the slots are sorted by location (lossyTable.grown).
type idsAt func(slots []uint64, ids []ID) error

// upsert points id at l. If id is already present (verified by reading the
// frame through read) its slot is replaced and the old location and frame
// size are returned with replaced=true. The caller must ensure there is room
// (see needsGrow). collisions counts tag matches that held another ID.
func (t *lossyTable) upsert(id ID, l loc, read idAt, collisions *atomic.Uint64) (old loc, oldSize int, replaced bool, err error) {
	tag, m := idTag(id), t.mask()
	for i := t.bucket(id); ; i = (i + 1) & m {
		s := t.slots[i].Load()
		if s == 0 {
			t.slots[i].Store(makeSlot(id, l))
			t.count++
			return loc{}, 0, false, nil
		}
		if slotTag(s) != tag {
			continue
		}
		ol := slotLoc(s)
		got, size, err := read(ol)
		if err != nil {
			return loc{}, 0, false, err
		}
		if got == id {
			t.slots[i].Store(makeSlot(id, l))
			return ol, size, true, nil
		}
		collisions.Add(1)
	}
}

// insertUnique adds a slot for an ID known to be absent from t.
func (t *lossyTable) insertUnique(slot uint64, id ID) {
	m := t.mask()
	for i := t.bucket(id); ; i = (i + 1) & m {
		if t.slots[i].Load() == 0 {
			t.slots[i].Store(slot)
			t.count++
			return
		}
	}
}

// needsGrow reports whether adding one entry would pass 75% load.
func (t *lossyTable) needsGrow() bool { return (t.count+1)*4 > len(t.slots)*3 }

// grown returns a double-size copy of t. The slots do not hold the bucket
// bits, so each entry's record ID is re-read from its frame: read gets the
// used slots sorted by location (shard, then offset), so that it can read
// the heads of neighbouring frames together.
func (t *lossyTable) grown(read idsAt) (*lossyTable, error) {
	// A slot rotated left by 24 bits has its location (shard, offset+1)
	// in the high 40 bits: sorting the rotated values sorts by location.
	used := make([]uint64, 0, t.count)
	for i := range t.slots {
		if s := t.slots[i].Load(); s != 0 {
			used = append(used, bits.RotateLeft64(s, 64-slotTagShift))
		}
	}
	slices.Sort(used)
	for i, r := range used {
		used[i] = bits.RotateLeft64(r, slotTagShift-64)
	}
	ids := make([]ID, len(used))
	if err := read(used, ids); err != nil {
		return nil, err
	}
	nt := newTable(t.bits + 1)
	for i, s := range used {
		nt.insertUnique(s, ids[i])
	}
	return nt, nil
}

// each calls fn for every used slot's location.
func (t *lossyTable) each(fn func(l loc)) {
	for i := range t.slots {
		if s := t.slots[i].Load(); s != 0 {
			fn(slotLoc(s))
		}
	}
}

// collection is one collection's index state.
type collection struct {
	// table is the published index generation; readers load it lock-free.
	table atomic.Pointer[lossyTable]

	// Writer-only, guarded by PackfileStorage.mu.
	live      int   // live records
	liveBytes int64 // frame bytes of live records
}

func newCollection(bits uint) *collection {
	c := &collection{}
	c.table.Store(newTable(bits))
	return c
}

// posOf returns the stream position of a frame location (its shard exists).
func (s *PackfileStorage) posOf(l loc) pos {
	return pos{seq: s.shards[l.shard].Load().seq, off: l.off}
}

// applyMetaLocked replays one frame (from a scan or a delta entry).
func (s *PackfileStorage) applyMetaLocked(m frameMeta) error {
	sh := s.shards[m.at.shard].Load()
	if m.reset {
		sh.noteReset(m.coll, m.pos)
		return s.dropBeforeLocked(m.coll, m.pos)
	}
	sh.noteData(m.coll, m.at.off)
	c := s.collectionOrCreateLocked(m.coll)
	return s.indexPutLocked(c, m.id, m.at, m.size)
}

// dropBeforeLocked applies a reset marker: it forgets every index entry of
// coll located before p, publishing a rebuilt table for the entries at or
// after p (a repack's copy), or dropping the collection if none remain.
func (s *PackfileStorage) dropBeforeLocked(coll ID, p pos) error {
	c := s.collectionLoad(coll)
	if c == nil {
		return nil
	}
	t := c.table.Load()
	kept := 0
	t.each(func(l loc) {
		if !s.posOf(l).less(p) {
			kept++
		}
	})
	if kept == 0 {
		s.dropCollectionLocked(coll)
		return nil
	}
	nt := newTable(tableBitsFor(kept))
	var err error
	var liveBytes int64
	t.each(func(l loc) {
		if err != nil {
			return
		}
		if s.posOf(l).less(p) {
			s.shards[l.shard].Load().live--
			return
		}
		id, size, rerr := s.readIDScan(l)
		if rerr != nil {
			err = rerr
			return
		}
		nt.insertUnique(makeSlot(id, l), id)
		liveBytes += int64(size)
	})
	if err != nil {
		return err
	}
	c.live, c.liveBytes = kept, liveBytes
	c.table.Store(nt)
	return nil
}

func (s *PackfileStorage) collectionLoad(coll ID) *collection {
	v, ok := s.colls.Load(coll)
	if !ok {
		return nil
	}
	return v.(*collection)
}

func (s *PackfileStorage) collectionOrCreateLocked(coll ID) *collection {
	if c := s.collectionLoad(coll); c != nil {
		return c
	}
	c := newCollection(minTableBits)
	s.colls.Store(coll, c)
	return c
}

// dropCollectionLocked forgets a collection's index and its shard references.
func (s *PackfileStorage) dropCollectionLocked(coll ID) {
	c := s.collectionLoad(coll)
	if c == nil {
		return
	}
	c.table.Load().each(func(l loc) { s.shards[l.shard].Load().live-- })
	s.colls.Delete(coll)
}

// readID reads the record ID and frame size at l (writer side) through the
// mapping; readIDScan reads it with pread, for loops over a whole index (see
// shard.frameHead).
func (s *PackfileStorage) readID(l loc) (ID, int, error) { return s.frameHeadAt(l, false) }

func (s *PackfileStorage) readIDScan(l loc) (ID, int, error) { return s.frameHeadAt(l, true) }

// readIDsScan is readIDScan for the used slots of a table sorted by
// location (idsAt): the heads of frames up to headRunGap bytes apart in one
// shard are read with one pread (shard.frameHeads).
func (s *PackfileStorage) readIDsScan(slots []uint64, ids []ID) error {
	var offs []int64
	var buf []byte
	for i := 0; i < len(slots); {
		l := slotLoc(slots[i])
		sh := s.shards[l.shard].Load()
		if sh == nil {
			return fmt.Errorf("%w: index references missing shard %d", ErrCorrupt, l.shard)
		}
		offs = append(offs[:0], int64(l.off))
		j := i + 1
		for ; j < len(slots); j++ {
			n := slotLoc(slots[j])
			if n.shard != l.shard || int64(n.off)-offs[len(offs)-1] > headRunGap || int64(n.off)+framePayloadOff-offs[0] > headRunMax {
				break
			}
			offs = append(offs, int64(n.off))
		}
		n := int(offs[len(offs)-1] + framePayloadOff - offs[0])
		if cap(buf) < n {
			buf = make([]byte, n, max(n, 2*cap(buf)))
		}
		if err := sh.frameHeads(offs, ids[i:j], buf[:n]); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// headRunGap is the largest distance from one frame to the next whose heads
// readIDsScan reads in one pread (copying the bytes between costs less than
// another system call), and headRunMax the most bytes one such pread reads.
const (
	headRunGap = 4 << 10
	headRunMax = 256 << 10
)

func (s *PackfileStorage) frameHeadAt(l loc, pread bool) (ID, int, error) {
	sh := s.shards[l.shard].Load()
	if sh == nil {
		return ID{}, 0, fmt.Errorf("%w: index references missing shard %d", ErrCorrupt, l.shard)
	}
	return sh.frameHead(int64(l.off), pread)
}

// indexPutLocked points id at l in c's index, superseding an older version.
func (s *PackfileStorage) indexPutLocked(c *collection, id ID, l loc, size int) error {
	t := c.table.Load()
	if t.needsGrow() {
		nt, err := t.grown(s.readIDsScan)
		if err != nil {
			return err
		}
		c.table.Store(nt)
		t = nt
	}
	old, oldSize, replaced, err := t.upsert(id, l, s.readID, &s.collisions)
	if err != nil {
		return err
	}
	if replaced {
		s.shards[old.shard].Load().live--
		c.liveBytes -= int64(oldSize)
	} else {
		c.live++
	}
	s.shards[l.shard].Load().live++
	c.liveBytes += int64(size)
	return nil
}

// lookupLocked finds the current location and frame size of id (writer side).
func (s *PackfileStorage) lookupLocked(c *collection, id ID) (loc, int, bool, error) {
	for _, l := range c.table.Load().candidates(id, nil) {
		got, size, err := s.readID(l)
		if err != nil {
			return loc{}, 0, false, err
		}
		if got == id {
			return l, size, true, nil
		}
		s.collisions.Add(1)
	}
	return loc{}, 0, false, nil
}
