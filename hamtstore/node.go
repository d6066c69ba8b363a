package hamtstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"math/bits"
)

// Format constants. They are part of the on-disk format (see doc.go).
const (
	formatMagic   = 0x48 // 'H'
	formatVersion = 1    // version 1: bitmap and collision nodes as in doc.go

	kindBitmap    = 1
	kindCollision = 2

	magicLen   = 1
	versionLen = 1
	kindLen    = 1
	depthLen   = 1
	bitmapLen  = 4 // one u32 bitmap, little-endian
	countLen   = 4 // u32 entry count of a collision node, little-endian
	valueLen   = 16
	idLen      = 16

	offMagic   = 0
	offVersion = offMagic + magicLen
	offKind    = offVersion + versionLen
	offDepth   = offKind + kindLen
	prefixLen  = offDepth + depthLen

	offDatamap      = prefixLen
	offNodemap      = offDatamap + bitmapLen
	bitmapHeaderLen = offNodemap + bitmapLen

	offCount           = prefixLen
	collisionHeaderLen = offCount + countLen

	// minEntryLen is the smallest encoded entry: a 1-byte key length, an empty
	// key and the value.
	minEntryLen = 1 + valueLen

	bitsPerLevel = 5
	fanout       = 1 << bitsPerLevel
	// collisionDepth is the depth of collision nodes: 51 levels of 5 bits use
	// 255 of SHA-256's 256 bits; keys whose hashes agree on all 255 go into one
	// collision node there. Bitmap nodes sit at depths 0..collisionDepth-1.
	collisionDepth = 256 / bitsPerLevel
)

// keyHash is the key hash of the format: SHA-256 of the key bytes. It is a
// variable only so that tests can substitute a weak hash to exercise collision
// nodes; production code never changes it.
var keyHash = func(key []byte) [32]byte { return sha256.Sum256(key) }

// fragment returns the 5-bit hash fragment that picks a key's slot at depth:
// bits 5*depth .. 5*depth+4 of h, most significant bit of h[0] first.
func fragment(h *[32]byte, depth int) uint {
	bit := depth * bitsPerLevel
	i := bit / 8
	w := uint(h[i]) << 8
	if i+1 < len(h) {
		w |= uint(h[i+1])
	}
	return (w >> (16 - bitsPerLevel - uint(bit%8))) & (fanout - 1)
}

// entry is one key/value pair held inline in a node.
type entry struct {
	key []byte // aliases the node's encoding when decoded; never modified
	val Value
}

// childRef is a reference to a child node: its ID, plus the decoded child once
// it has been resolved (nil while lazy). A node built by Apply and not yet
// encoded has a zero id and a non-nil n.
type childRef struct {
	id NodeID
	n  *node
}

// node is a decoded (or newly built) CHAMP node. Decoded nodes are immutable
// except that childRef.n is filled in on first use.
type node struct {
	id        NodeID
	dirty     bool // built by Apply, not yet encoded: id is not valid
	depth     int
	collision bool
	datamap   uint32 // bitmap nodes: slots holding an inline entry
	nodemap   uint32 // bitmap nodes: slots holding a child
	entries   []entry
	children  []childRef
}

// index returns the compact-array index of slot bit in bitmap m.
func index(m uint32, bit uint32) int { return bits.OnesCount32(m & (bit - 1)) }

// single reports whether n holds exactly one entry and no children: such a node
// is never stored below the root (it is inlined into its parent).
func (n *node) single() bool {
	return len(n.entries) == 1 && len(n.children) == 0
}

// encodedLen returns the length of n's encoding.
func (n *node) encodedLen() int {
	size := bitmapHeaderLen
	if n.collision {
		size = collisionHeaderLen
	}
	for _, e := range n.entries {
		size += uvarintLen(uint64(len(e.key))) + len(e.key) + valueLen
	}
	return size + idLen*len(n.children)
}

// encode returns n's encoding. All children must have IDs.
func (n *node) encode() []byte {
	buf := make([]byte, 0, n.encodedLen())
	buf = append(buf, formatMagic, formatVersion)
	if n.collision {
		buf = append(buf, kindCollision, byte(n.depth))
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(n.entries)))
	} else {
		buf = append(buf, kindBitmap, byte(n.depth))
		buf = binary.LittleEndian.AppendUint32(buf, n.datamap)
		buf = binary.LittleEndian.AppendUint32(buf, n.nodemap)
	}
	for _, e := range n.entries {
		buf = binary.AppendUvarint(buf, uint64(len(e.key)))
		buf = append(buf, e.key...)
		buf = append(buf, e.val[:]...)
	}
	for _, c := range n.children {
		buf = append(buf, c.id[:]...)
	}
	return buf
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// decodeNode decodes and validates one node's encoding. id is used in error
// messages and recorded in the node; decodeNode does not check that it is the
// hash of data (loadNode does). Everything checkable from the node alone is
// checked, before allocating: magic, version, kind, depth range, lengths against
// the bytes left, popcounts against counts, disjoint bitmaps, minimal varints,
// key lengths, no trailing bytes, each key's hash fragment at this depth equal
// to its slot, collision keys sorted, unique and agreeing on all 255 hash bits,
// and canonical shape (no empty node; below the root no node with a single
// entry and no children). The returned node's keys alias data.
func decodeNode(id NodeID, data []byte) (*node, error) {
	if len(data) < prefixLen {
		return nil, corruptf(id, "%d bytes, shorter than the %d-byte prefix", len(data), prefixLen)
	}
	if data[offMagic] != formatMagic {
		return nil, corruptf(id, "bad magic 0x%02x", data[offMagic])
	}
	if data[offVersion] != formatVersion {
		return nil, corruptf(id, "unknown version %d", data[offVersion])
	}
	n := &node{id: id, depth: int(data[offDepth])}
	var nEntries, nChildren int
	var rest []byte
	switch data[offKind] {
	case kindBitmap:
		if n.depth >= collisionDepth {
			return nil, corruptf(id, "bitmap node at depth %d (max %d)", n.depth, collisionDepth-1)
		}
		if len(data) < bitmapHeaderLen {
			return nil, corruptf(id, "%d bytes, shorter than the %d-byte bitmap header", len(data), bitmapHeaderLen)
		}
		n.datamap = binary.LittleEndian.Uint32(data[offDatamap:])
		n.nodemap = binary.LittleEndian.Uint32(data[offNodemap:])
		if n.datamap&n.nodemap != 0 {
			return nil, corruptf(id, "datamap %08x and nodemap %08x overlap", n.datamap, n.nodemap)
		}
		nEntries = bits.OnesCount32(n.datamap)
		nChildren = bits.OnesCount32(n.nodemap)
		if nEntries+nChildren == 0 {
			return nil, corruptf(id, "empty node")
		}
		if n.depth > 0 && nEntries == 1 && nChildren == 0 {
			return nil, corruptf(id, "non-canonical: single-entry node at depth %d must be inlined in its parent", n.depth)
		}
		rest = data[bitmapHeaderLen:]
	case kindCollision:
		n.collision = true
		if n.depth != collisionDepth {
			return nil, corruptf(id, "collision node at depth %d (must be %d)", n.depth, collisionDepth)
		}
		if len(data) < collisionHeaderLen {
			return nil, corruptf(id, "%d bytes, shorter than the %d-byte collision header", len(data), collisionHeaderLen)
		}
		count := uint64(binary.LittleEndian.Uint32(data[offCount:]))
		if count < 2 {
			return nil, corruptf(id, "non-canonical: collision node with %d entries", count)
		}
		// count <= 2^32 so the product cannot overflow a uint64.
		if count*minEntryLen > uint64(len(data)-collisionHeaderLen) {
			return nil, corruptf(id, "collision count %d needs more than the %d bytes left", count, len(data)-collisionHeaderLen)
		}
		nEntries = int(count)
		rest = data[collisionHeaderLen:]
	default:
		return nil, corruptf(id, "unknown node kind %d", data[offKind])
	}
	// Both counts are at most 32 for bitmap nodes and bounded by len(data) for
	// collision nodes, so this cannot overflow.
	if need := nEntries*minEntryLen + nChildren*idLen; need > len(rest) {
		return nil, corruptf(id, "%d entries and %d children need at least %d bytes, %d left", nEntries, nChildren, need, len(rest))
	}
	n.entries = make([]entry, nEntries)
	slots := n.datamap
	var firstHash [32]byte
	for i := range n.entries {
		klen, vn := binary.Uvarint(rest)
		if vn <= 0 {
			return nil, corruptf(id, "entry %d: bad key length varint", i)
		}
		if vn != uvarintLen(klen) {
			return nil, corruptf(id, "entry %d: non-minimal key length varint", i)
		}
		if klen > MaxKeyLen {
			return nil, corruptf(id, "entry %d: key length %d exceeds %d", i, klen, MaxKeyLen)
		}
		rest = rest[vn:]
		if klen+valueLen > uint64(len(rest)) {
			return nil, corruptf(id, "entry %d: key length %d overruns the %d bytes left", i, klen, len(rest))
		}
		e := &n.entries[i]
		e.key = rest[:klen:klen]
		copy(e.val[:], rest[klen:klen+valueLen])
		rest = rest[klen+valueLen:]
		h := keyHash(e.key)
		if n.collision {
			if i == 0 {
				firstHash = h
				continue
			}
			if !samePrefix(&firstHash, &h, collisionDepth) {
				return nil, corruptf(id, "collision entry %d: key hash differs from entry 0 within %d levels", i, collisionDepth)
			}
			if bytes.Compare(n.entries[i-1].key, e.key) >= 0 {
				return nil, corruptf(id, "collision entry %d: keys not strictly increasing", i)
			}
			continue
		}
		slot := uint(bits.TrailingZeros32(slots))
		slots &= slots - 1
		if f := fragment(&h, n.depth); f != slot {
			return nil, corruptf(id, "entry %d: key hash fragment %d at depth %d, but stored in slot %d", i, f, n.depth, slot)
		}
	}
	if len(rest) != nChildren*idLen {
		return nil, corruptf(id, "%d trailing bytes after %d children", len(rest)-nChildren*idLen, nChildren)
	}
	if nChildren > 0 {
		n.children = make([]childRef, nChildren)
		for i := range n.children {
			copy(n.children[i].id[:], rest[i*idLen:])
			if n.children[i].id == EmptyRoot {
				return nil, corruptf(id, "child %d has the empty ID", i)
			}
		}
	}
	return n, nil
}

// samePrefix reports whether a and b agree on their first levels fragments.
func samePrefix(a, b *[32]byte, levels int) bool {
	for d := 0; d < levels; d++ {
		if fragment(a, d) != fragment(b, d) {
			return false
		}
	}
	return true
}
