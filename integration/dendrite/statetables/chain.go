package statetables

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/matrix-org/dendrite/roomserver/types"
	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
)

// Chained snapshots (doc.go "Records", snapshot version 2): a snapshot made of
// its predecessor's state and delta blocks is stored as the changes that turn a
// base snapshot's state into its own, without HAMT nodes. Its nodes are made on
// demand (materialise) and kept in a bounded per-Store cache.

const (
	// ChainLimit (K) is the position at which a chain of version 2 snapshots ends
	// with a checkpoint. A snapshot at position n (1 .. K-1 after its checkpoint)
	// stores its changes against the snapshot at position chainBase(n): n less
	// ChainRadix^k, k the place of n's lowest nonzero base-16 digit. So a read
	// materialises at most 15*3+3 = 48 records (position K-1 = 0x3fff) and K-1
	// changed entries, and a record holds on average about 3.5 entries for a
	// line of one-entry changes. A checkpoint writes the HAMT nodes the chain
	// changed (about the whole state once the chain is long), so a larger K
	// costs fewer bytes per change and a slower cold read. Measured at 10,000
	// members (BenchmarkChainLimit, BenchmarkColdRead): K = 4096, 16384 give 233,
	// 192 B/change with radix 16 (252, 212 with radix 2), and a cold read of the
	// state at position K-1 takes ~0.1 s at K = 16384.
	ChainLimit = 1 << 14

	// ChainRadix is the digit base of chainBase (1 << chainRadixBits).
	ChainRadix     = 1 << chainRadixBits
	chainRadixBits = 4

	// MergeChainLimit is the most entries in which a state not made from one
	// snapshot (Dendrite's state after several prev events, or a whole state
	// given as one block) may differ from the room's last snapshot and be
	// chained to it rather than written as a checkpoint.
	MergeChainLimit = 1024

	// MaxChainLimit bounds ChainLimit and the position a version 2 record may
	// carry: records of any K up to it decode.
	MaxChainLimit = 1 << 16

	snapshotVersionChained = 2
	// chainedHeaderLen: kind, version, root; uvarints follow.
	chainedHeaderLen = 2 + 16
	// minChangeLen is the smallest encoded change: three one-byte uvarints.
	minChangeLen = 3

	// layerCacheBytes bounds the materialised nodes a Store keeps: a layer
	// counts its own nodes, not those of the layers below it (counted under
	// their own NIDs).
	layerCacheBytes = 64 << 20
	// nodeCacheBytes bounds the nodes read from the rooms' collections that a
	// PostgreSQL Store keeps (packstore has its own cache).
	nodeCacheBytes = 64 << 20
)

// ErrCorrupt is returned (wrapped, naming the snapshot) when a snapshot record
// fails to decode or, chained, names a base that is missing or at the wrong
// position, or does not reproduce its own root.
var ErrCorrupt = errors.New("statetables: corrupt snapshot record")

// snapRef is what a snapshot record says, but its changes.
type snapRef struct {
	room types.RoomNID
	root hamtstore.NodeID
	seq  uint32 // 0: a migrated NID (its record is a legacy one)
	pos  uint32 // 0: a checkpoint (version 1), whose nodes are in the collection
	base uint32 // pos > 0: the seq of the snapshot its changes apply to
}

// snapRecord is a decoded snapshot record.
type snapRecord struct {
	root    hamtstore.NodeID
	pos     uint32
	base    uint32
	changes []hamtstore.Change
}

// encodeChained encodes the version 2 record of snapshot seq (doc.go "Records").
func encodeChained(root hamtstore.NodeID, seq, base, pos uint32, changes []hamtstore.Change) ([]byte, error) {
	b := make([]byte, 0, chainedHeaderLen+3*binary.MaxVarintLen32+len(changes)*12)
	b = append(b, 'S', snapshotVersionChained)
	b = append(b, root[:]...)
	b = binary.AppendUvarint(b, uint64(seq-base))
	b = binary.AppendUvarint(b, uint64(pos))
	b = binary.AppendUvarint(b, uint64(len(changes)))
	for _, c := range changes {
		t, err := parseStateKey(c.Key)
		if err != nil {
			return nil, err
		}
		b = binary.AppendUvarint(b, uint64(t.EventTypeNID))
		b = binary.AppendUvarint(b, uint64(t.EventStateKeyNID))
		if c.Delete {
			b = binary.AppendUvarint(b, 0)
			continue
		}
		ev, err := valueEvent(c.Value)
		if err != nil {
			return nil, err
		}
		b = binary.AppendUvarint(b, uint64(ev)+1)
	}
	return b, nil
}

// decodeSnapshotRecord decodes a snapshot record of either version; seq is the
// record's own seq (0: a migrated NID's record, which is never chained).
func decodeSnapshotRecord(b []byte, seq uint32) (snapRecord, error) {
	var r snapRecord
	if len(b) >= 2 && b[0] == 'S' && b[1] == recordVersion {
		root, err := decodeSnapshot(b)
		r.root = root
		return r, err
	}
	if len(b) < chainedHeaderLen+3 || b[0] != 'S' || b[1] != snapshotVersionChained {
		return r, fmt.Errorf("%w (%d bytes, kind %q, version %d)", ErrCorrupt, len(b), firstByte(b), byteAt(b, 1))
	}
	if seq == 0 {
		return r, fmt.Errorf("%w: a migrated NID's record is chained", ErrCorrupt)
	}
	copy(r.root[:], b[2:chainedHeaderLen])
	rest := b[chainedHeaderLen:]
	// next reads one canonical uvarint of rest.
	next := func(what string) (uint64, error) {
		v, n := binary.Uvarint(rest)
		if n <= 0 || n != uvarintLen(v) {
			return 0, fmt.Errorf("%w: %s at offset %d: truncated or overlong uvarint", ErrCorrupt, what, len(b)-len(rest))
		}
		rest = rest[n:]
		return v, nil
	}
	dist, err := next("base distance")
	if err != nil {
		return r, err
	}
	pos, err := next("chain position")
	if err != nil {
		return r, err
	}
	switch {
	case dist == 0 || dist >= uint64(seq):
		return r, fmt.Errorf("%w: base seq %d not in [1, %d)", ErrCorrupt, int64(seq)-int64(min(dist, uint64(seq)+1)), seq)
	case pos == 0 || pos >= MaxChainLimit:
		return r, fmt.Errorf("%w: chain position %d outside [1, %d]", ErrCorrupt, pos, MaxChainLimit-1)
	}
	r.base, r.pos = seq-uint32(dist), uint32(pos)
	count, err := next("change count")
	if err != nil {
		return r, err
	}
	if count > uint64(len(rest)/minChangeLen) {
		return r, fmt.Errorf("%w: %d changes in %d bytes", ErrCorrupt, count, len(rest))
	}
	r.changes = make([]hamtstore.Change, count)
	for i := range r.changes {
		var f [3]uint64
		for j := range f {
			if f[j], err = next(fmt.Sprintf("change %d", i)); err != nil {
				return r, err
			}
		}
		if f[0] > 1<<63-1 || f[1] > 1<<63-1 || f[2] > 1<<63 {
			return r, fmt.Errorf("%w: change %d: NID out of range", ErrCorrupt, i)
		}
		c := &r.changes[i]
		c.Key = stateKey(types.StateKeyTuple{EventTypeNID: types.EventTypeNID(f[0]), EventStateKeyNID: types.EventStateKeyNID(f[1])})
		if f[2] == 0 {
			c.Delete = true
		} else {
			c.Value = eventValue(types.EventNID(f[2] - 1))
		}
	}
	if len(rest) != 0 {
		return r, fmt.Errorf("%w: %d bytes after %d changes", ErrCorrupt, len(rest), count)
	}
	return r, nil
}

// uvarintLen is the length of v's canonical (shortest) uvarint.
func uvarintLen(v uint64) int {
	return len(binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen64), v))
}

func byteAt(b []byte, i int) byte {
	if len(b) <= i {
		return 0
	}
	return b[i]
}

// chainBase is the position of the base of a chained snapshot at position pos
// (>= 1): pos less ChainRadix^k, k the place of its lowest nonzero digit in base
// ChainRadix.
func chainBase(pos uint32) uint32 {
	k := bits.TrailingZeros32(pos) / chainRadixBits * chainRadixBits
	return pos - 1<<k
}

// --- materialised nodes -----------------------------------------------------------

// layer holds the HAMT nodes of a chained snapshot that the room's collection
// does not: those Apply made from its base's state and its changes, over its
// base's layer (nil: the base is a checkpoint). Immutable once built; a node ID
// names its bytes, so layers may be shared freely.
type layer struct {
	below *layer
	nodes map[hamtstore.NodeID][]byte
	bytes int
}

func (l *layer) get(id hamtstore.NodeID) ([]byte, bool) {
	for ; l != nil; l = l.below {
		if b, ok := l.nodes[id]; ok {
			return b, true
		}
	}
	return nil, false
}

// sizedCache is an LRU bounded by the bytes of its values (size), not their
// number. Safe for concurrent use.
type sizedCache[K comparable, V any] struct {
	mu    sync.Mutex // guards bytes and the order of adds and evictions
	lru   *lru.Cache[K, V]
	size  func(V) int
	bytes int
	limit int
}

func (c *sizedCache[K, V]) init(limit int, size func(V) int) {
	c.limit, c.size = limit, size
	c.lru, _ = lru.NewWithEvict[K, V](1<<22, func(_ K, v V) {
		c.bytes -= size(v) // called with c.mu held: every change goes through add or purge
	})
}

func (c *sizedCache[K, V]) get(k K) (V, bool) { return c.lru.Get(k) }

func (c *sizedCache[K, V]) add(k K, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lru.Contains(k) {
		return
	}
	c.bytes += c.size(v)
	c.lru.Add(k, v)
	for c.bytes > c.limit && c.lru.Len() > 1 {
		c.lru.RemoveOldest()
	}
}

func (c *sizedCache[K, V]) purge() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lru.Purge()
}

// roomNodes is the node store through which one call reads a room's snapshots:
// the materialised layers it added (use), then the room's collection through the
// call's records view. It is read-only (writes go to an overlay over it) and not
// safe for concurrent use.
type roomNodes struct {
	coll   nodeStore
	layers []*layer
}

func (s *Store) roomNodes(rec records, roomNID types.RoomNID) *roomNodes {
	return &roomNodes{coll: nodeStore{eng: rec, coll: RoomCollection(roomNID), cache: s.nodes}}
}

func (n *roomNodes) GetNode(id hamtstore.NodeID) ([]byte, error) {
	if b, ok := n.materialised(id); ok {
		return b, nil
	}
	return n.coll.GetNode(id)
}

func (n *roomNodes) PutNodes([]hamtstore.EncodedNode) error {
	return errors.New("statetables: a room's snapshot nodes are read-only here")
}

// materialised returns a node of a layer (one the collection may not hold).
func (n *roomNodes) materialised(id hamtstore.NodeID) ([]byte, bool) {
	for _, l := range n.layers {
		if b, ok := l.get(id); ok {
			return b, true
		}
	}
	return nil, false
}

// use makes the nodes of snapshot ref readable through n: nothing to do for a
// checkpoint; a chained snapshot's chain is materialised.
func (s *Store) use(ctx context.Context, txn *sql.Tx, n *roomNodes, ref snapRef) error {
	if ref.pos == 0 {
		return nil
	}
	l, err := s.materialise(ctx, txn, ref)
	if err != nil {
		return err
	}
	for _, have := range n.layers {
		if have == l {
			return nil
		}
	}
	n.layers = append(n.layers, l)
	return nil
}

// materialise returns the layer of a chained snapshot: its base's (recursively,
// at most log2(ChainLimit) records deep), then its changes applied over it,
// checked against the root its record names. Layers enter the cache even when
// read through a transaction: a layer is found only by the NID of a snapshot
// record the caller's view holds, NIDs are never reused, and the bytes of a
// node are fixed by its ID.
func (s *Store) materialise(ctx context.Context, txn *sql.Tx, ref snapRef) (*layer, error) {
	nid := SnapshotNID(ref.room, ref.seq)
	if l, ok := s.layers.get(nid); ok {
		return l, nil
	}
	rec := s.at(ctx, txn)
	coll := RoomCollection(ref.room)
	b, err := rec.Get(coll, snapshotRecordID(ref.seq))
	if err != nil {
		return nil, fmt.Errorf("statetables: snapshot NID %d: %w", nid, err)
	}
	sr, err := decodeSnapshotRecord(b, ref.seq)
	if err == nil && (sr.root != ref.root || sr.pos != ref.pos || sr.base != ref.base) {
		err = fmt.Errorf("%w: changed while read", ErrCorrupt)
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot NID %d: %w", nid, err)
	}
	baseNID := SnapshotNID(ref.room, sr.base)
	base, ok, err := s.ref(ctx, txn, baseNID)
	if err != nil {
		return nil, fmt.Errorf("snapshot NID %d: base: %w", nid, err)
	}
	if !ok {
		return nil, fmt.Errorf("%w: snapshot NID %d: base snapshot NID %d missing", ErrCorrupt, nid, baseNID)
	}
	if base.pos != chainBase(sr.pos) {
		return nil, fmt.Errorf("%w: snapshot NID %d at chain position %d: base snapshot NID %d is at position %d, want %d", ErrCorrupt, nid, sr.pos, baseNID, base.pos, chainBase(sr.pos))
	}
	ns := &roomNodes{coll: nodeStore{eng: rec, coll: coll, cache: s.nodes}}
	var below *layer
	if base.pos > 0 {
		if below, err = s.materialise(ctx, txn, base); err != nil {
			return nil, err
		}
		ns.layers = []*layer{below}
	}
	l, root, err := applyLayer(ns, below, base.root, sr.changes)
	if err != nil {
		return nil, fmt.Errorf("statetables: snapshot NID %d: apply its %d changes to snapshot NID %d: %w", nid, len(sr.changes), baseNID, err)
	}
	if root != sr.root {
		return nil, fmt.Errorf("%w: snapshot NID %d: its %d changes to snapshot NID %d give root %x, its record names %x", ErrCorrupt, nid, len(sr.changes), baseNID, root[:], sr.root[:])
	}
	s.layers.add(nid, l)
	return l, nil
}

// applyLayer applies changes to the state root (read through ns) and returns the
// new nodes as a layer over below, and the new root.
func applyLayer(ns hamtstore.NodeStore, below *layer, root hamtstore.NodeID, changes []hamtstore.Change) (*layer, hamtstore.NodeID, error) {
	ov := &overlay{base: ns, nodes: map[hamtstore.NodeID][]byte{}}
	root, err := hamtstore.Apply(ov, hamtstore.NewReader(ov), root, changes)
	if err != nil {
		return nil, root, err
	}
	l := &layer{below: below, nodes: ov.nodes}
	for _, b := range ov.nodes {
		l.bytes += len(b) + len(hamtstore.NodeID{})
	}
	return l, root, nil
}

// ref returns what a snapshot NID's record says (but its changes); ok is false
// when there is none (0, a delta NID, an unknown NID). It reads through
// s.at(ctx, txn).
func (s *Store) ref(ctx context.Context, txn *sql.Tx, nid types.StateSnapshotNID) (snapRef, bool, error) {
	if ref, ok := s.roots.Get(nid); ok {
		return ref, true, nil
	}
	roomNID, seq := splitNID(int64(nid))
	if nid <= 0 || roomNID == deltaRoom || (roomNID != 0 && seq == 0) {
		return snapRef{}, false, nil
	}
	rec := s.at(ctx, txn)
	recID := snapshotRecordID(seq)
	if roomNID == 0 {
		b, err := rec.Get(LegacyCollection, legacyRecordID(nid))
		if errors.Is(err, packstore.ErrNotFound) {
			return snapRef{}, false, nil
		}
		if err != nil {
			return snapRef{}, false, fmt.Errorf("statetables: snapshot NID %d: %w", nid, err)
		}
		r, err := decodeU64('M', b)
		if err != nil || r == 0 || r > MaxRoomNID {
			return snapRef{}, false, fmt.Errorf("statetables: snapshot NID %d: corrupt migrated NID record (room %d, %v)", nid, r, err)
		}
		roomNID, recID, seq = types.RoomNID(r), legacyRecordID(nid), 0
	}
	b, err := rec.Get(RoomCollection(roomNID), recID)
	if errors.Is(err, packstore.ErrNotFound) {
		return snapRef{}, false, nil
	}
	if err != nil {
		return snapRef{}, false, fmt.Errorf("statetables: snapshot NID %d: %w", nid, err)
	}
	sr, err := decodeSnapshotRecord(b, seq)
	if err != nil {
		return snapRef{}, false, fmt.Errorf("snapshot NID %d: %w", nid, err)
	}
	ref := snapRef{room: roomNID, root: sr.root, seq: seq, pos: sr.pos, base: sr.base}
	if s.cacheable(txn) {
		s.roots.Add(nid, ref)
	}
	return ref, true, nil
}

// errTooFar stops mergeBase's diff.
var errTooFar = errors.New("more than MergeChainLimit entries differ")

// mergeBase returns the snapshot a state (root, read through rd) that InsertState
// could not chain to its first block may be chained to instead: the room's last
// snapshot written by this Store (r.last), when the caller's view finds its
// record, its chain position is below the limit and the two states differ in at
// most MergeChainLimit entries. Its nodes are made readable through ns. The
// caller holds r.mu. Any failure only means "no": the state is then written as
// a checkpoint.
func (s *Store) mergeBase(ctx context.Context, txn *sql.Tx, r *room, ns *roomNodes, rd *hamtstore.Reader, root hamtstore.NodeID) (snapRef, bool) {
	last := r.last
	if last.seq == 0 || last.pos+1 >= s.chainLimit {
		return snapRef{}, false
	}
	found, ok, err := s.ref(ctx, txn, SnapshotNID(last.room, last.seq))
	if err != nil || !ok || found != last || s.use(ctx, txn, ns, last) != nil {
		return snapRef{}, false
	}
	n := 0
	err = rd.Diff(last.root, root, func([]byte, *hamtstore.Value, *hamtstore.Value) error {
		if n++; n > MergeChainLimit {
			return errTooFar
		}
		return nil
	})
	return last, err == nil
}
