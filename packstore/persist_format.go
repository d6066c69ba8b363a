package packstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/bits"
	"sync/atomic"
	"unsafe"
)

// Index checkpoint and delta file formats (see doc.go, "Index checkpoint"
// and "Index delta"). The constants below are part of the on-disk format.
const (
	checkpointFile = "index.ckpt"
	deltaFile      = "index.delta"

	// checkpointVersion: 0x01 first version; 0x02 (shard format 0x06) reads
	// the position of a reset meta entry as sequence u32 | offset u32 in
	// the bytes 0x01 wrote as pack u16 | zero u16 | offset u32 (identical
	// for shards before 0x06, whose sequence is their pack ID); 0x03 stores
	// each table as an occupancy bitmap and its used slots instead of every
	// slot. All three read; encoding writes 0x03.
	checkpointVersion   = 0x03
	checkpointVersionV2 = 0x02
	checkpointVersionV1 = 0x01
	// deltaVersion: 0x01 first version; 0x02 reads a reset entry's P as
	// sequence u32 | offset u32, as the checkpoint. Both read.
	deltaVersion   = 0x02
	deltaVersionV1 = 0x01

	ckptHeaderLen    = 48 // fixed header, CRC at ckptHeaderCRCOff
	ckptHeaderCRCOff = ckptHeaderLen - crcLen
	ckptCoveredOff   = 16 // covered position C in the header
	ckptCountsOff    = 24 // shard, meta and collection counts in the header
	ckptShardLen     = 8  // pack u16 | zero u16 | size u32
	ckptMetaLen      = 28 // kind u8 | zero u8 | shard u16 | coll 16 | pack u16 | zero u16 | off u32
	ckptCollHeadLen  = 32 // coll 16 | bits u8 | zero 3 | count u32 | liveBytes u64
	ckptMaxBits      = 30 // largest table accepted: 2^30 slots

	deltaHeaderLen    = 24 // magic | version | zero 3 | generation u64 | zero u32 | CRC
	deltaHeaderCRCOff = deltaHeaderLen - crcLen
	deltaEntryLen     = 48 // kind u8 | zero u8 | pack u16 | off u32 | size u32 | coll 16 | id-or-P 16 | CRC
	deltaEntryCRCOff  = deltaEntryLen - crcLen

	metaData  = 1 // shard holds data frames of coll, first at off
	metaReset = 2 // shard holds a reset marker for coll with position P (seq, off)

	entryData  = 1 // a data frame
	entryReset = 2 // a reset marker; the id field holds its position P
	entryShard = 3 // a new shard (version 0x02): pack ID, offset 4096, size 0, id field: sequence u32 | zero 12
)

var (
	checkpointMagic = [4]byte{'M', 'T', 'C', 'K'}
	deltaMagic      = [4]byte{'M', 'T', 'D', 'L'}
)

// frameMeta is what the index needs to know about one frame: the decoded
// frame during a scan, or one delta entry.
type frameMeta struct {
	at    loc
	size  int
	reset bool
	coll  ID
	id    ID  // data frame
	pos   pos // reset marker's P
	// newShard marks a delta entry that records the creation of shard
	// at.shard with sequence number seq (entryShard), not a frame.
	newShard bool
	seq      uint32
}

// ckptShard is one shard known to a checkpoint with the bytes it covers.
type ckptShard struct {
	id   uint16
	size uint32
}

// ckptMeta is one entry of a shard's retirement metadata.
type ckptMeta struct {
	kind  byte
	shard uint16
	coll  ID
	at    loc // metaData: (shard, first offset)
	pos   pos // metaReset: P
}

// ckptColl is one collection's index generation. slots is the table's
// slot array itself: decoding allocates it once and Open publishes it as
// the collection's table; encoding reads it under the writer lock.
type ckptColl struct {
	coll      ID
	bits      uint
	count     int
	liveBytes int64
	slots     []atomic.Uint64
}

// checkpoint is a decoded index checkpoint.
type checkpoint struct {
	version byte // checkpointVersion when 0; decoding keeps the file's
	gen     uint64
	covered loc // every frame before this position is reflected
	shards  []ckptShard
	meta    []ckptMeta
	colls   []ckptColl
	// live counts the used slots per pack ID (decoding only).
	live *[MaxShards]int
}

func putLoc(b []byte, l loc) {
	binary.LittleEndian.PutUint16(b, l.shard)
	binary.LittleEndian.PutUint16(b[2:], 0)
	binary.LittleEndian.PutUint32(b[4:], l.off)
}

// getLoc decodes the 8-byte position putLoc writes.
func getLoc(b []byte) (loc, error) {
	l := loc{shard: binary.LittleEndian.Uint16(b), off: binary.LittleEndian.Uint32(b[4:])}
	if binary.LittleEndian.Uint16(b[2:]) != 0 || l.shard >= MaxShards || l.off > MaxShardBytesLimit {
		return l, fmt.Errorf("invalid position %x", b[:8])
	}
	return l, nil
}

// encodeCheckpoint returns the bytes of a checkpoint file.
func encodeCheckpoint(c *checkpoint) []byte {
	version := byte(checkpointVersion)
	if c.version != 0 {
		version = c.version
	}
	n := ckptHeaderLen + len(c.shards)*ckptShardLen + len(c.meta)*ckptMetaLen + crcLen
	for _, cc := range c.colls {
		if version >= checkpointVersion {
			n += ckptCollHeadLen + len(cc.slots)/8 + 8*cc.count
		} else {
			n += ckptCollHeadLen + 8*len(cc.slots)
		}
	}
	b := make([]byte, ckptHeaderLen, n)
	copy(b, checkpointMagic[:])
	b[4] = version
	binary.LittleEndian.PutUint64(b[8:], c.gen)
	putLoc(b[16:], c.covered)
	binary.LittleEndian.PutUint32(b[24:], uint32(len(c.shards)))
	binary.LittleEndian.PutUint32(b[28:], uint32(len(c.meta)))
	binary.LittleEndian.PutUint32(b[32:], uint32(len(c.colls)))
	binary.LittleEndian.PutUint32(b[ckptHeaderCRCOff:], checksum(b[:ckptHeaderCRCOff]))
	for _, sh := range c.shards {
		b = binary.LittleEndian.AppendUint16(b, sh.id)
		b = binary.LittleEndian.AppendUint16(b, 0)
		b = binary.LittleEndian.AppendUint32(b, sh.size)
	}
	for _, m := range c.meta {
		b = append(b, m.kind, 0)
		b = binary.LittleEndian.AppendUint16(b, m.shard)
		b = append(b, m.coll[:]...)
		var p [8]byte
		if m.kind == metaReset {
			putPos(p[:], m.pos)
		} else {
			putLoc(p[:], m.at)
		}
		b = append(b, p[:]...)
	}
	for _, cc := range c.colls {
		b = append(b, cc.coll[:]...)
		b = append(b, byte(cc.bits), 0, 0, 0)
		b = binary.LittleEndian.AppendUint32(b, uint32(cc.count))
		b = binary.LittleEndian.AppendUint64(b, uint64(cc.liveBytes))
		if version >= checkpointVersion {
			b = appendCompactSlots(b, cc.slots)
			continue
		}
		for i := range cc.slots {
			b = binary.LittleEndian.AppendUint64(b, cc.slots[i].Load())
		}
	}
	return binary.LittleEndian.AppendUint32(b, checksum(b[ckptHeaderLen:]))
}

// appendCompactSlots appends a table in the 0x03 layout: the occupancy
// bitmap (bit i%8 of byte i/8 set when slot i is used; len(slots)/8 bytes,
// len(slots) >= 8) and then the used slots in slot order, u64 each.
func appendCompactSlots(b []byte, slots []atomic.Uint64) []byte {
	at := len(b)
	b = append(b, make([]byte, len(slots)/8)...)
	for i := range slots {
		if v := slots[i].Load(); v != 0 {
			b[at+i/8] |= 1 << (i % 8)
			b = binary.LittleEndian.AppendUint64(b, v)
		}
	}
	return b
}

// ckptError is an error decoding a checkpoint and the file offset of what
// failed: a field, an entry, a slot, or the first byte a failed CRC covers.
type ckptError struct {
	off int64
	err error
}

// Error is the reason, without the offset (indexCorruptf adds it).
func (e *ckptError) Error() string { return e.err.Error() }

// Unwrap returns the reason.
func (e *ckptError) Unwrap() error { return e.err }

// ckptErrorf is a ckptError at file offset off.
func ckptErrorf(off int, format string, args ...any) error {
	return &ckptError{off: int64(off), err: fmt.Errorf(format, args...)}
}

// ckptErrorOffset returns the file offset a checkpoint decoding error
// carries, 0 when it carries none.
func ckptErrorOffset(err error) int64 {
	var e *ckptError
	if errors.As(err, &e) {
		return e.off
	}
	return 0
}

// decodeCheckpoint validates and decodes a checkpoint file. It checks every
// count against the file size before allocating, both CRCs, and the
// structural invariants of each table (slot count = count, load <= 75%,
// slot shards known to the shard table and offsets inside their covered
// bytes). The body CRC is computed over each part as it is decoded (see
// ckptBody) and compared at the end; nothing decoded is used before that.
// Errors are bare reasons carrying the file offset of what failed
// (ckptErrorOffset); callers wrap them with ErrCorrupt, the file name and
// that offset.
func decodeCheckpoint(b []byte) (*checkpoint, error) {
	return decodeCheckpointAsRead(b, nil, nil)
}

// decodeCheckpointAsRead is decodeCheckpoint of a file that is still being
// read into b: avail(n) returns once b[:n] holds the file's first n bytes,
// and bodyCRC, called once all of b is read, returns the CRC-32C of the
// body that the reader computed as it read (nil: all of b is there, and
// decoding computes the CRC itself). Decoding thus overlaps the reading,
// and the checksumming is the reader's.
func decodeCheckpointAsRead(b []byte, avail func(n int), bodyCRC func() uint32) (*checkpoint, error) {
	if avail != nil && len(b) >= ckptHeaderLen {
		avail(ckptHeaderLen)
	}
	c, counts, err := decodeCkptHeader(b)
	if err != nil {
		return nil, err
	}
	r := &ckptBody{b: b[ckptHeaderLen : len(b)-crcLen], off: ckptHeaderLen, avail: avail, sum: bodyCRC == nil}
	nShards, nMeta, nColls := counts[0], counts[1], counts[2]
	if fixed := nShards*ckptShardLen + nMeta*ckptMetaLen + nColls*ckptCollHeadLen; nShards > MaxShards || fixed > uint64(len(r.b)) {
		return nil, ckptErrorf(ckptCountsOff, "checkpoint counts (%d shards, %d meta, %d collections) exceed its %d body bytes", nShards, nMeta, nColls, len(r.b))
	}
	t := &ckptShards{}
	if err := c.decodeShards(r.take(nShards*ckptShardLen), r.off-int(nShards*ckptShardLen), t); err != nil {
		return nil, err
	}
	if err := c.decodeMeta(r.take(nMeta*ckptMetaLen), r.off-int(nMeta*ckptMetaLen), t); err != nil {
		return nil, err
	}
	c.colls = make([]ckptColl, 0, min(nColls, 1<<16))
	for i := range nColls {
		at := r.off
		cc, err := decodeCkptColl(r, c.version, t)
		if err != nil {
			if ckptErrorOffset(err) == 0 {
				err = &ckptError{off: int64(at), err: err}
			}
			return nil, fmt.Errorf("checkpoint collection %d (at offset %d): %w", i, at, err)
		}
		c.colls = append(c.colls, cc)
	}
	if len(r.b) != 0 {
		return nil, ckptErrorf(r.off, "checkpoint has %d trailing bytes", len(r.b))
	}
	if avail != nil {
		avail(len(b))
	}
	got := r.crc
	if bodyCRC != nil {
		got = bodyCRC()
	}
	if want := binary.LittleEndian.Uint32(b[len(b)-crcLen:]); want != got {
		return nil, ckptErrorf(ckptHeaderLen, "checkpoint body crc mismatch over bytes %d-%d: stored %08x (at offset %d), computed %08x",
			ckptHeaderLen, len(b)-crcLen-1, want, len(b)-crcLen, got)
	}
	c.live = &t.live
	return c, nil
}

// ckptShards is what decoding knows per pack ID: the covered size of each
// listed shard (0: not listed; a listed size is >= HeaderSize) and the
// used slots that point into it.
type ckptShards struct {
	size [MaxShards]uint32
	live [MaxShards]int
	// second counts the used slots of the second half of a table that
	// decodeCompactSlots decodes in two halves (zero in between).
	second [MaxShards]int
}

// use checks that a used slot points inside a listed shard's covered bytes
// (valid) and counts it.
func (t *ckptShards) use(v uint64) bool {
	if !t.valid(v) {
		return false
	}
	t.live[slotLoc(v).shard]++
	return true
}

// valid reports whether a used slot points inside a listed shard's covered
// bytes.
func (t *ckptShards) valid(v uint64) bool {
	l := slotLoc(v) // l.shard < MaxShards: 12 bits
	size := t.size[l.shard]
	return size != 0 && l.off >= HeaderSize && int64(l.off)+FrameOverhead <= int64(size)
}

// decodeCkptHeader checks the fixed header (magic, version, CRC, reserved
// bytes) and returns the checkpoint with its generation and covered
// position, and the shard, meta and collection counts.
func decodeCkptHeader(b []byte) (*checkpoint, [3]uint64, error) {
	var counts [3]uint64
	if len(b) < ckptHeaderLen+crcLen {
		return nil, counts, ckptErrorf(0, "short checkpoint: %d bytes", len(b))
	}
	if [4]byte(b[:4]) != checkpointMagic {
		return nil, counts, ckptErrorf(0, "bad checkpoint magic %q", b[:4])
	}
	if b[4] != checkpointVersion && b[4] != checkpointVersionV2 && b[4] != checkpointVersionV1 {
		return nil, counts, ckptErrorf(4, "unsupported checkpoint version 0x%02x", b[4])
	}
	if want, got := binary.LittleEndian.Uint32(b[ckptHeaderCRCOff:]), checksum(b[:ckptHeaderCRCOff]); want != got {
		return nil, counts, ckptErrorf(0, "checkpoint header crc mismatch over bytes 0-%d: stored %08x (at offset %d), computed %08x",
			ckptHeaderCRCOff-1, want, ckptHeaderCRCOff, got)
	}
	for _, r := range [][2]int{{5, 8}, {36, 44}} {
		for i := r[0]; i < r[1]; i++ {
			if b[i] != 0 {
				return nil, counts, ckptErrorf(i, "nonzero reserved checkpoint header byte")
			}
		}
	}
	c := &checkpoint{version: b[4], gen: binary.LittleEndian.Uint64(b[8:])}
	var err error
	if c.covered, err = getLoc(b[ckptCoveredOff:]); err != nil {
		return nil, counts, &ckptError{off: ckptCoveredOff, err: err}
	}
	for i := range counts {
		counts[i] = uint64(binary.LittleEndian.Uint32(b[ckptCountsOff+4*i:]))
	}
	return c, counts, nil
}

// ckptBody is the unread part of a checkpoint body, its offset in the file,
// and (with sum) the CRC-32C of the part consumed so far; avail, when set,
// waits for the file's bytes to be read (decodeCheckpointAsRead).
type ckptBody struct {
	b     []byte
	off   int
	sum   bool
	crc   uint32
	avail func(n int)
}

// take consumes the next n bytes (n <= len(r.b), checked by the caller),
// into the CRC with sum, and returns them, once they are read.
func (r *ckptBody) take(n uint64) []byte {
	r.off += int(n)
	if r.avail != nil {
		r.avail(r.off)
	}
	p := r.b[:n]
	r.b = r.b[n:]
	if r.sum {
		r.crc = crc32.Update(r.crc, castagnoli, p)
	}
	return p
}

// ckptTakeChunk is the most a table decoder consumes at once (1 MiB), so
// that it decodes the first bytes of a large table while the rest is read.
const ckptTakeChunk = 1 << 20

// decodeShards decodes the shard list (ascending pack IDs), which starts at
// file offset at, into c.shards and sizes.
func (c *checkpoint) decodeShards(b []byte, at int, t *ckptShards) error {
	c.shards = make([]ckptShard, len(b)/ckptShardLen)
	for i := range c.shards {
		e := b[i*ckptShardLen:]
		sh := ckptShard{id: binary.LittleEndian.Uint16(e), size: binary.LittleEndian.Uint32(e[4:])}
		if binary.LittleEndian.Uint16(e[2:]) != 0 || sh.id >= MaxShards || sh.size < HeaderSize || sh.size > MaxShardBytesLimit || (i > 0 && sh.id <= c.shards[i-1].id) {
			return ckptErrorf(at+i*ckptShardLen, "checkpoint shard entry %d invalid", i)
		}
		c.shards[i] = sh
		t.size[sh.id] = sh.size
	}
	return nil
}

// decodeMeta decodes the retirement metadata entries, which start at file
// offset at, into c.meta; each must name a listed shard.
func (c *checkpoint) decodeMeta(b []byte, at int, t *ckptShards) error {
	c.meta = make([]ckptMeta, len(b)/ckptMetaLen)
	for i := range c.meta {
		e := b[i*ckptMetaLen:]
		m := ckptMeta{kind: e[0], shard: binary.LittleEndian.Uint16(e[2:]), coll: ID(e[4:20])}
		var err error
		if m.kind == metaReset {
			if m.pos = getPos(e[20:]); m.pos.off < HeaderSize || m.pos.off > MaxShardBytesLimit {
				return ckptErrorf(at+i*ckptMetaLen+20, "checkpoint meta entry %d: invalid position %x", i, e[20:28])
			}
		} else if m.at, err = getLoc(e[20:]); err != nil {
			return ckptErrorf(at+i*ckptMetaLen+20, "checkpoint meta entry %d: %v", i, err)
		}
		if m.shard >= MaxShards || t.size[m.shard] == 0 || e[1] != 0 || (m.kind != metaData && m.kind != metaReset) || (m.kind == metaData && m.at.shard != m.shard) {
			return ckptErrorf(at+i*ckptMetaLen, "checkpoint meta entry %d invalid", i)
		}
		c.meta[i] = m
	}
	return nil
}

// decodeCkptColl decodes one collection: its fixed head and its table in
// the layout of the checkpoint's version (every slot before 0x03, the
// occupancy bitmap and the used slots from 0x03).
func decodeCkptColl(r *ckptBody, version byte, t *ckptShards) (ckptColl, error) {
	if len(r.b) < ckptCollHeadLen {
		return ckptColl{}, ckptErrorf(r.off, "truncated")
	}
	at := r.off // the head's offset
	h := r.take(ckptCollHeadLen)
	cc := ckptColl{coll: ID(h[:16]), bits: uint(h[16]),
		count: int(binary.LittleEndian.Uint32(h[20:])), liveBytes: int64(binary.LittleEndian.Uint64(h[24:]))}
	if cc.bits < minTableBits || cc.bits > ckptMaxBits || h[17]|h[18]|h[19] != 0 {
		return cc, ckptErrorf(at+16, "table bits %d invalid", cc.bits)
	}
	n := uint64(1) << cc.bits
	if cc.count == 0 || cc.count*4 > int(n)*3 || cc.liveBytes < int64(cc.count)*FrameOverhead {
		return cc, ckptErrorf(at+20, "count %d, live bytes %d for %d slots", cc.count, cc.liveBytes, n)
	}
	need := n * 8
	if version >= checkpointVersion {
		need = n/8 + uint64(cc.count)*8
	}
	if need > uint64(len(r.b)) {
		return cc, ckptErrorf(at+16, "%d slots (%d bytes) exceed the remaining %d bytes", n, need, len(r.b))
	}
	// The table is not published yet: it is filled with plain stores
	// (an atomic store is a locked exchange on amd64, a full barrier per
	// slot) and handed out as the []atomic.Uint64 the readers load.
	slots := make([]uint64, n)
	var err error
	if version >= checkpointVersion {
		err = decodeCompactSlots(r, slots, cc.count, t)
	} else {
		err = decodeFullSlots(r, slots, cc.count, t)
	}
	cc.slots = slotsView(slots)
	return cc, err
}

// slotsView returns the slots s as the []atomic.Uint64 of a lossyTable,
// sharing their memory. atomic.Uint64 is a uint64 with 64-bit alignment
// (checked below), and the first word of an allocated slice is 64-bit
// aligned on every platform (sync/atomic's rule), so each element is a
// valid atomic.Uint64. The caller must not store into s once the table is
// published.
func slotsView(s []uint64) []atomic.Uint64 {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*atomic.Uint64)(unsafe.Pointer(unsafe.SliceData(s))), len(s))
}

// slotsView relies on atomic.Uint64 having exactly the size of a uint64.
var _ [unsafe.Sizeof(atomic.Uint64{}) - 8]struct{}
var _ [8 - unsafe.Sizeof(atomic.Uint64{})]struct{}

// decodeFullSlots decodes a table stored slot by slot (versions 0x01 and
// 0x02) into slots (all zero).
func decodeFullSlots(r *ckptBody, slots []uint64, count int, t *ckptShards) error {
	var b []byte // the taken bytes from slot j on
	used, at := 0, r.off
	for j := range slots {
		if len(b) == 0 {
			b = r.take(uint64(min(len(slots)-j, ckptTakeChunk/8)) * 8)
		}
		v := binary.LittleEndian.Uint64(b)
		b = b[8:]
		if v == 0 {
			continue
		}
		if !t.use(v) {
			return ckptErrorf(r.off-len(b)-8, "slot %d points at %d/%d outside the covered shards", j, slotLoc(v).shard, slotLoc(v).off)
		}
		slots[j] = v
		used++
	}
	if used != count {
		return ckptErrorf(at, "%d used slots, count %d", used, count)
	}
	return nil
}

// decodeCompactSlots decodes a table stored as an occupancy bitmap and the
// used slots (version 0x03; appendCompactSlots) into slots (all zero): the
// bitmap must mark exactly count slots, and every used slot must be
// nonzero and point inside a listed shard. A table of ckptSplitSlots slots
// or more is decoded in two halves at once: another goroutine decodes the
// second half (its used slots start after the first half's, counted in the
// bitmap) once its bytes are read, with its own per-shard counts; an error
// in the first half is returned before one in the second, as a sequential
// decode would.
func decodeCompactSlots(r *ckptBody, slots []uint64, count int, t *ckptShards) error {
	bitmap := r.take(uint64(len(slots) / 8))
	at := r.off - len(bitmap)
	if used := onesCount(bitmap); used != count {
		return ckptErrorf(at, "occupancy bitmap marks %d slots, count %d", used, count)
	}
	vals := ckptSlots{b: r.b[:count*8], off: r.off} // r.take consumes them as decoded
	if len(slots) < ckptSplitSlots {
		return vals.fill(bitmap, slots, 0, t, &t.live, r)
	}
	mid := len(bitmap) / 2 &^ 7 // a bitmap word boundary
	k := 8 * onesCount(bitmap[:mid])
	first, second := ckptSlots{b: vals.b[:k], off: vals.off}, ckptSlots{b: vals.b[k:], off: vals.off + k}
	var err2 error
	done := make(chan struct{})
	go func() {
		defer close(done)
		if r.avail != nil {
			r.avail(second.off + len(second.b))
		}
		err2 = guardFault(func() error { return second.fill(bitmap[mid:], slots[8*mid:], 8*mid, t, &t.second, nil) })
	}()
	err := func() error {
		// Wait for the second half even when the first faults (a mapped
		// file): it must not read the bytes after they are unmapped.
		defer func() { <-done }()
		if err := first.fill(bitmap[:mid], slots[:8*mid], 0, t, &t.live, r); err != nil {
			return err
		}
		r.take(uint64(len(second.b)))
		return nil
	}()
	for i, n := range t.second {
		t.live[i] += n
	}
	clear(t.second[:])
	if err != nil {
		return err
	}
	return err2
}

// ckptSplitSlots is the smallest table decodeCompactSlots decodes in two
// halves at once (2^16 slots, 512 KiB): below it a goroutine costs more
// than it saves.
const ckptSplitSlots = 1 << 16

// ckptSlots is a run of a 0x03 table's used slots (8 bytes each) and the
// file offset of its first byte.
type ckptSlots struct {
	b   []byte
	off int
}

// fill stores the used slots v.b into dst, the slots (from slot index base
// of the table) that bitmap describes, checking each against t and
// counting it in live. With r set, it consumes v.b from r (r.take) as it
// goes, in ckptTakeChunk pieces, so that decoding follows the reading. It
// walks the bitmap 64 slots (one little-endian word) at a time and the set
// bits of each word with TrailingZeros64: the loop branches once per used
// slot and once per 64 slots, not once per bitmap byte.
func (v ckptSlots) fill(bitmap []byte, dst []uint64, base int, t *ckptShards, live *[MaxShards]int, r *ckptBody) error {
	taken, k := 0, 0 // bytes of v.b taken from r; used slots stored
	for len(bitmap) > 0 {
		nb := min(8, len(bitmap))
		w := uint64(0)
		if nb == 8 {
			w = binary.LittleEndian.Uint64(bitmap)
		} else {
			for i, x := range bitmap[:nb] {
				w |= uint64(x) << (8 * i)
			}
		}
		bitmap = bitmap[nb:]
		if need := 8 * (k + bits.OnesCount64(w)); r != nil && need > taken {
			n := min(len(v.b)-taken, max(ckptTakeChunk, need-taken))
			r.take(uint64(n))
			taken += n
		}
		for ; w != 0; w &= w - 1 {
			j := bits.TrailingZeros64(w)
			s := binary.LittleEndian.Uint64(v.b[8*k:])
			if s == 0 || !t.valid(s) {
				return ckptErrorf(v.off+8*k, "slot %d holds %#x: not a location inside the covered shards", base+j, s)
			}
			live[slotLoc(s).shard]++
			dst[j] = s
			k++
		}
		dst = dst[8*nb:]
		base += 8 * nb
	}
	return nil
}

// onesCount returns the number of set bits in b.
func onesCount(b []byte) int {
	n := 0
	for ; len(b) >= 8; b = b[8:] {
		n += bits.OnesCount64(binary.LittleEndian.Uint64(b))
	}
	for _, x := range b {
		n += bits.OnesCount8(x)
	}
	return n
}

// encodeDeltaHeader returns the header of a delta file for a generation.
func encodeDeltaHeader(gen uint64) []byte {
	b := make([]byte, deltaHeaderLen)
	copy(b, deltaMagic[:])
	b[4] = deltaVersion
	binary.LittleEndian.PutUint64(b[8:], gen)
	binary.LittleEndian.PutUint32(b[deltaHeaderCRCOff:], checksum(b[:deltaHeaderCRCOff]))
	return b
}

// decodeDeltaHeader validates a delta header and returns its generation.
func decodeDeltaHeader(b []byte) (uint64, error) {
	if len(b) < deltaHeaderLen {
		return 0, fmt.Errorf("short delta header: %d bytes", len(b))
	}
	if [4]byte(b[:4]) != deltaMagic {
		return 0, fmt.Errorf("bad delta magic %q", b[:4])
	}
	if b[4] != deltaVersion && b[4] != deltaVersionV1 {
		return 0, fmt.Errorf("unsupported delta version 0x%02x", b[4])
	}
	if want, got := binary.LittleEndian.Uint32(b[deltaHeaderCRCOff:]), checksum(b[:deltaHeaderCRCOff]); want != got {
		return 0, fmt.Errorf("delta header crc mismatch: stored %08x, computed %08x", want, got)
	}
	if b[5]|b[6]|b[7] != 0 || binary.LittleEndian.Uint32(b[16:]) != 0 {
		return 0, errors.New("nonzero reserved delta header bytes")
	}
	return binary.LittleEndian.Uint64(b[8:]), nil
}

// appendDeltaEntry appends the fixed-width delta entry of one frame.
func appendDeltaEntry(dst []byte, m frameMeta) []byte {
	var e [deltaEntryLen]byte
	e[0] = entryData
	if m.newShard {
		e[0] = entryShard
		binary.LittleEndian.PutUint32(e[28:], m.seq)
	} else if m.reset {
		e[0] = entryReset
		putPos(e[28:], m.pos)
	} else {
		copy(e[28:], m.id[:])
	}
	binary.LittleEndian.PutUint16(e[2:], m.at.shard)
	binary.LittleEndian.PutUint32(e[4:], m.at.off)
	binary.LittleEndian.PutUint32(e[8:], uint32(m.size))
	copy(e[12:], m.coll[:])
	binary.LittleEndian.PutUint32(e[deltaEntryCRCOff:], checksum(e[:deltaEntryCRCOff]))
	return append(dst, e[:]...)
}

// decodeDeltaEntry validates one delta entry (len(b) >= deltaEntryLen).
func decodeDeltaEntry(b []byte) (frameMeta, error) {
	var m frameMeta
	if len(b) < deltaEntryLen {
		return m, errFrameTruncated
	}
	if want, got := binary.LittleEndian.Uint32(b[deltaEntryCRCOff:]), checksum(b[:deltaEntryCRCOff]); want != got {
		return m, fmt.Errorf("delta entry crc mismatch: stored %08x, computed %08x", want, got)
	}
	m.at = loc{shard: binary.LittleEndian.Uint16(b[2:]), off: binary.LittleEndian.Uint32(b[4:])}
	m.size = int(binary.LittleEndian.Uint32(b[8:]))
	m.coll = ID(b[12:28])
	switch b[0] {
	case entryData:
		m.id = ID(b[28:44])
	case entryShard:
		m.newShard, m.seq = true, binary.LittleEndian.Uint32(b[28:])
		if b[1] != 0 || m.at.shard >= MaxShards || m.at.off != HeaderSize || m.size != 0 || m.coll != (ID{}) || [12]byte(b[32:44]) != [12]byte{} {
			return m, fmt.Errorf("delta shard entry %x invalid", b[:44])
		}
		return m, nil
	case entryReset:
		m.reset = true
		m.pos = getPos(b[28:])
		if m.pos.off < HeaderSize || m.pos.off > MaxShardBytesLimit || [8]byte(b[36:44]) != [8]byte{} {
			return m, fmt.Errorf("delta reset entry: invalid position %x", b[28:44])
		}
	default:
		return m, fmt.Errorf("delta entry kind %d", b[0])
	}
	if b[1] != 0 || m.at.shard >= MaxShards || m.at.off < HeaderSize || m.size < FrameOverhead || int64(m.at.off)+int64(m.size) > MaxShardBytesLimit {
		return m, fmt.Errorf("delta entry at %d/%d size %d invalid", m.at.shard, m.at.off, m.size)
	}
	return m, nil
}
