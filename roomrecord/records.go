package roomrecord

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/internal/bin"
	"github.com/mtxdb/mtxdb/packstore"
)

// ErrCorruptRecord is returned (wrapped, naming the record) when a stored roomstate
// payload fails to decode.
var ErrCorruptRecord = errors.New("roomstate: corrupt record")

const recordVersion = 1

// Kind bytes that open every roomstate payload (see doc.go).
const (
	kindEvent = 'E'
	kindMeta  = 'M'
	kindState = 'S'
	kindHead  = 'H'
	kindLog   = 'L'
	kindGraph = 'G'
	// kindExtremities opens a forward-extremity chunk (version 3 heads name them).
	kindExtremities = 'F'
)

func hashID(parts ...[]byte) packstore.ID { return packstore.HashID(parts...) }

// CollectionID is the packstore collection of a room: H("mtxdb/room\x00" || room_id).
func CollectionID(roomID string) packstore.ID {
	return hashID([]byte("mtxdb/room\x00"), []byte(roomID))
}

// EventRecordID is the record ID of a PDU and the HAMT value that names it in state
// snapshots: H("mtxdb/event\x00" || event_id).
func EventRecordID(eventID string) packstore.ID {
	return hashID([]byte("mtxdb/event\x00"), []byte(eventID))
}

// MetaRecordID is the record ID of the metadata record of the event whose
// record ID is ev: H("mtxdb/meta\x00" || ev).
func MetaRecordID(ev packstore.ID) packstore.ID { return hashID([]byte("mtxdb/meta\x00"), ev[:]) }

// StateRecordID is the record ID of the state record of the event whose record
// ID is ev: H("mtxdb/state\x00" || ev).
func StateRecordID(ev packstore.ID) packstore.ID { return hashID([]byte("mtxdb/state\x00"), ev[:]) }

// HeadRecordID is the record ID of a room's head record: H("mtxdb/head").
var HeadRecordID = hashID([]byte("mtxdb/head"))

// LogChunkID is the record ID of arrival-log chunk i: H("mtxdb/log\x00" || u32le(i)).
func LogChunkID(i uint32) packstore.ID {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], i)
	return hashID([]byte("mtxdb/log\x00"), b[:])
}

// StateKey encodes (event_type, state_key) as a HAMT key:
// uvarint(len(event_type)) || event_type || state_key.
func StateKey(eventType, stateKey string) []byte {
	return AppendStateKey(make([]byte, 0, len(eventType)+len(stateKey)+2), eventType, stateKey)
}

// AppendStateKey appends StateKey(eventType, stateKey) to b.
func AppendStateKey(b []byte, eventType, stateKey string) []byte {
	b = binary.AppendUvarint(b, uint64(len(eventType)))
	b = append(b, eventType...)
	return append(b, stateKey...)
}

// SplitStateKey is the inverse of StateKey.
func SplitStateKey(k []byte) (eventType, stateKey string, err error) {
	n, w := binary.Uvarint(k)
	if w <= 0 || n > uint64(len(k)-w) {
		return "", "", fmt.Errorf("%w: state key %x: bad type length", ErrCorruptRecord, k)
	}
	return string(k[w : w+int(n)]), string(k[w+int(n):]), nil
}

// EventMeta is the metadata record of one event: its DAG edges and what replay and
// repack planning need without parsing the PDU.
type EventMeta struct {
	Seq        uint32 // arrival index within the room, from 0
	Depth      int64
	IsState    bool
	Redacted   bool // content hash failed at import; the PDU is used in redacted form
	EventID    string
	Type       string
	StateKey   string // meaningful only when IsState
	PrevEvents []string
	AuthEvents []string
}

// EncodeMeta encodes a metadata record (see the package documentation).
func EncodeMeta(m *EventMeta) []byte {
	var e bin.Encoder
	e.U8(kindMeta)
	e.U8(recordVersion)
	e.U32(m.Seq)
	e.U64(uint64(m.Depth))
	e.U8(eventFlags(m.IsState, m.Redacted))
	e.Str(m.EventID)
	e.Str(m.Type)
	e.Str(m.StateKey)
	e.Strs(m.PrevEvents)
	e.Strs(m.AuthEvents)
	return e.B
}

// eventFlags is the flags byte of a metadata record and of a graph-record entry:
// bit 0 a state event, bit 1 redacted (its content hash failed at import).
func eventFlags(isState, redacted bool) uint8 {
	var f uint8
	if isState {
		f |= 1
	}
	if redacted {
		f |= 2
	}
	return f
}

func checkKind(d *bin.Decoder, kind byte, what string) error {
	k := d.U8("kind")
	v := d.U8("version")
	if err := d.Err(); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrCorruptRecord, what, err)
	}
	if k != kind {
		return fmt.Errorf("%w: %s: kind %q, want %q", ErrCorruptRecord, what, k, kind)
	}
	if v != recordVersion {
		return fmt.Errorf("%w: %s: unknown version %d", ErrCorruptRecord, what, v)
	}
	return nil
}

// DecodeMeta decodes a metadata record; ErrCorruptRecord names what is wrong.
func DecodeMeta(b []byte) (EventMeta, error) {
	d := bin.NewDecoder(b)
	if err := checkKind(d, kindMeta, "event metadata"); err != nil {
		return EventMeta{}, err
	}
	var m EventMeta
	m.Seq = d.U32("seq")
	m.Depth = int64(d.U64("depth"))
	f := d.U8("flags")
	m.IsState, m.Redacted = f&1 != 0, f&2 != 0
	m.EventID = d.Str("event_id")
	m.Type = d.Str("type")
	m.StateKey = d.Str("state_key")
	m.PrevEvents = d.Strs("prev_events")
	m.AuthEvents = d.Strs("auth_events")
	if err := d.Finish(); err != nil {
		return EventMeta{}, fmt.Errorf("%w: event metadata: %v", ErrCorruptRecord, err)
	}
	if f&^3 != 0 {
		return EventMeta{}, fmt.Errorf("%w: event metadata %s: unknown flags %#x", ErrCorruptRecord, m.EventID, f)
	}
	return m, nil
}

// EventState is the state record of one event, written by replay: the state snapshot
// before and after it, and whether it was rejected.
type EventState struct {
	Rejected bool
	Reason   string // why it was rejected; empty otherwise
	Before   hamtstore.NodeID
	After    hamtstore.NodeID
}

// EncodeState encodes a state record.
func EncodeState(s *EventState) []byte {
	var e bin.Encoder
	e.U8(kindState)
	e.U8(recordVersion)
	var f uint8
	if s.Rejected {
		f = 1
	}
	e.U8(f)
	e.Fixed(s.Before[:])
	e.Fixed(s.After[:])
	e.Str(s.Reason)
	return e.B
}

// DecodeState decodes a state record; ErrCorruptRecord names what is wrong.
func DecodeState(b []byte) (EventState, error) {
	d := bin.NewDecoder(b)
	if err := checkKind(d, kindState, "event state"); err != nil {
		return EventState{}, err
	}
	var s EventState
	f := d.U8("flags")
	s.Rejected = f&1 != 0
	d.Fixed(s.Before[:], "before")
	d.Fixed(s.After[:], "after")
	s.Reason = d.Str("reason")
	if err := d.Finish(); err != nil {
		return EventState{}, fmt.Errorf("%w: event state: %v", ErrCorruptRecord, err)
	}
	if f&^1 != 0 {
		return EventState{}, fmt.Errorf("%w: event state: unknown flags %#x", ErrCorruptRecord, f)
	}
	return s, nil
}

// Head is the room head record: what a room is and where its history stands.
type Head struct {
	RoomID       string
	RoomVersion  string
	Events       uint32 // events imported
	LogChunks    uint32 // arrival log chunks written
	Replayed     bool   // state records exist for every imported event the keep rule requires
	CurrentState hamtstore.NodeID
	// ForwardExtremities is the whole set, sorted, in every head roomstate
	// returns. In a head DecodeHead returned from a version 3 record it is nil
	// until ReadExtremityChunks reads the chunks.
	ForwardExtremities []string
	// InlineExtremities and ExtremityChunks are how a version 3 head stores
	// ForwardExtremities: the sorted event IDs the head record holds, and the
	// chunk records that hold the others (doc.go, "Forward extremities"). Both
	// are nil for a head stored as version 1 or 2, whose record holds every
	// forward extremity. ExtremitySet.Store sets all three fields; a writer that
	// sets ForwardExtremities itself (as replay does) leaves these two as they
	// were read, and roomstate lays the new set out from them when it writes.
	InlineExtremities []string
	ExtremityChunks   []ExtremityChunk
	// StateEvery is the keep rule of an every-k repack (docs/library.md): 0 keeps
	// every event's state record; K > 0 keeps it only for the events KeepsState
	// names, so the others may have none. Set by WithKeepRule (before an every-k repack), cleared by a
	// forced replay (which writes every state record again) before it writes its first one.
	StateEvery uint32
	// StateKeptBelow is the number of events (arrival indexes 0..StateKeptBelow-1)
	// the keep rule covers: events that arrived after the rule was set keep their
	// state record until the next every-k repack. At most Events; 0 when StateEvery is.
	StateKeptBelow uint32
}

// Head record versions: 1 is the layout of doc.go; 2 appends state_every u32 and
// state_kept_below u32 (the every-k keep rule); 3 stores the forward extremities
// partly in chunk records (inline strs, then a chunk table) and always carries
// the two keep-rule fields (0 0: no rule). A head without chunks is written as
// version 1 (no keep rule) or 2, byte for byte as before version 3 existed.
const (
	headVersion1 = 1
	headVersion2 = 2
	headVersion3 = 3
)

// extremityRefLen is the size of one chunk-table entry of a version 3 head:
// record ID 16 bytes, count u32.
const extremityRefLen = 16 + 4

// EncodeHead encodes a head record: version 3 when it names extremity chunks,
// else version 1 without a keep rule and 2 with one.
func EncodeHead(h *Head) []byte {
	var e bin.Encoder
	e.U8(kindHead)
	v := uint8(headVersion1)
	switch {
	case len(h.ExtremityChunks) > 0:
		v = headVersion3
	case h.StateEvery != 0:
		v = headVersion2
	}
	e.U8(v)
	e.Str(h.RoomID)
	e.Str(h.RoomVersion)
	e.U32(h.Events)
	e.U32(h.LogChunks)
	var r uint8
	if h.Replayed {
		r = 1
	}
	e.U8(r)
	e.Fixed(h.CurrentState[:])
	if v == headVersion3 {
		e.Strs(h.InlineExtremities)
		e.U32(uint32(len(h.ExtremityChunks)))
		for _, c := range h.ExtremityChunks {
			e.Fixed(c.ID[:])
			e.U32(c.Count)
		}
	} else {
		e.Strs(h.ForwardExtremities)
	}
	if v != headVersion1 {
		e.U32(h.StateEvery)
		e.U32(h.StateKeptBelow)
	}
	return e.B
}

// DecodeHead decodes a head record of version 1, 2 or 3; ErrCorruptRecord
// names what is wrong, including a version 2 head without a keep rule and a
// version 3 head without chunks. A version 3 head comes back with its chunk IDs
// and counts, and ForwardExtremities nil: ReadExtremityChunks completes it.
func DecodeHead(b []byte) (Head, error) {
	d := bin.NewDecoder(b)
	k := d.U8("kind")
	v := d.U8("version")
	if err := d.Err(); err != nil {
		return Head{}, fmt.Errorf("%w: room head: %v", ErrCorruptRecord, err)
	}
	if k != kindHead {
		return Head{}, fmt.Errorf("%w: room head: kind %q, want %q", ErrCorruptRecord, k, kindHead)
	}
	if v != headVersion1 && v != headVersion2 && v != headVersion3 {
		return Head{}, fmt.Errorf("%w: room head: unknown version %d", ErrCorruptRecord, v)
	}
	var h Head
	h.RoomID = d.Str("room_id")
	h.RoomVersion = d.Str("room_version")
	h.Events = d.U32("events")
	h.LogChunks = d.U32("log_chunks")
	r := d.U8("replayed")
	h.Replayed = r == 1
	d.Fixed(h.CurrentState[:], "current_state")
	if v == headVersion3 {
		if inline := d.Strs("inline forward_extremities"); len(inline) > 0 {
			h.InlineExtremities = inline
		}
		var err error
		if h.ExtremityChunks, err = decodeExtremityRefs(d, len(b)); err != nil {
			return Head{}, err
		}
	} else {
		h.ForwardExtremities = d.Strs("forward_extremities")
	}
	if v != headVersion1 {
		h.StateEvery = d.U32("state_every")
		h.StateKeptBelow = d.U32("state_kept_below")
	}
	if err := d.Finish(); err != nil {
		return Head{}, fmt.Errorf("%w: room head: %v", ErrCorruptRecord, err)
	}
	if r > 1 {
		return Head{}, fmt.Errorf("%w: room head %s: replayed flag %d", ErrCorruptRecord, h.RoomID, r)
	}
	if err := h.checkFields(v); err != nil {
		return Head{}, fmt.Errorf("%w: room head %s: %v", ErrCorruptRecord, h.RoomID, err)
	}
	return h, nil
}

// decodeExtremityRefs reads the chunk table of a version 3 head (count u32, then
// count x (ID 16B | count u32)); the count is checked against the record's size
// n before anything is allocated.
func decodeExtremityRefs(d *bin.Decoder, n int) ([]ExtremityChunk, error) {
	c := d.U32("extremity chunk count")
	if d.Err() != nil {
		return nil, nil // Finish reports it
	}
	if uint64(c) > uint64(n)/extremityRefLen {
		return nil, fmt.Errorf("%w: room head: %d extremity chunks cannot fit in %d bytes", ErrCorruptRecord, c, n)
	}
	refs := make([]ExtremityChunk, c)
	for i := range refs {
		d.Fixed(refs[i].ID[:], "extremity chunk ID")
		refs[i].Count = d.U32("extremity chunk count")
	}
	return refs, nil
}

// checkFields checks what a head of version v must hold beyond its bytes: a keep
// rule in version 2 and none past its events; in version 3 chunks, none empty,
// inline entries sorted and distinct, and no more extremities than events.
func (h *Head) checkFields(v uint8) error {
	switch {
	case v == headVersion2 && h.StateEvery == 0:
		// Version 2 with no rule is not canonical (version 1 says that).
		return fmt.Errorf("version 2 without a keep rule (every %d below %d)", h.StateEvery, h.StateKeptBelow)
	case h.StateEvery == 0 && h.StateKeptBelow != 0, h.StateKeptBelow > h.Events:
		return fmt.Errorf("keep rule every %d below %d of %d events", h.StateEvery, h.StateKeptBelow, h.Events)
	case v != headVersion3:
		return nil
	case len(h.ExtremityChunks) == 0:
		return fmt.Errorf("version 3 without extremity chunks")
	}
	if err := checkSortedDistinct(h.InlineExtremities); err != nil {
		return fmt.Errorf("inline forward extremities: %v", err)
	}
	total := uint64(len(h.InlineExtremities))
	for _, c := range h.ExtremityChunks {
		if c.Count == 0 {
			return fmt.Errorf("forward-extremity chunk %s of no event IDs", c.ID)
		}
		total += uint64(c.Count)
	}
	if total > uint64(h.Events) {
		return fmt.Errorf("%d forward extremities, %d events", total, h.Events)
	}
	return nil
}

// KeepsState reports whether the head's keep rule requires the state record (and
// the snapshots it names) of a replayed event that is not an outlier: always without
// a rule (StateEvery 0); with one, for events that arrived after it was set (arrival
// index >= StateKeptBelow), state events, the forward extremities the head names,
// and every StateEvery-th event by arrival index (Seq % StateEvery == 0). An every-k
// repack also keeps rejected events' state records, so an event without one that the
// rule does not require was accepted, and its state after equals its state before.
func (h Head) KeepsState(m EventMeta) bool {
	if h.StateEvery == 0 || m.Seq >= h.StateKeptBelow || m.IsState || m.Seq%h.StateEvery == 0 {
		return true
	}
	return slices.Contains(h.ForwardExtremities, m.EventID)
}

// EncodeLogChunk encodes an arrival-log chunk: event IDs in arrival order.
func EncodeLogChunk(ids []string) []byte { return encodeIDList(kindLog, ids) }

// encodeIDList encodes a record that is a list of event IDs: kind 1 | ids strs.
func encodeIDList(kind byte, ids []string) []byte {
	var e bin.Encoder
	e.U8(kind)
	e.U8(recordVersion)
	e.Strs(ids)
	return e.B
}

// decodeIDList decodes a record encodeIDList wrote; what names it in errors.
func decodeIDList(b []byte, kind byte, what string) ([]string, error) {
	d := bin.NewDecoder(b)
	if err := checkKind(d, kind, what); err != nil {
		return nil, err
	}
	ids := d.Strs("event_ids")
	if err := d.Finish(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorruptRecord, what, err)
	}
	return ids, nil
}

// DecodeLogChunk decodes an arrival-log chunk; ErrCorruptRecord names what is wrong.
func DecodeLogChunk(b []byte) ([]string, error) {
	return decodeIDList(b, kindLog, "arrival log chunk")
}

// EncodeEvent encodes an event record: the event ID and the PDU JSON as received.
func EncodeEvent(eventID string, pduJSON []byte) []byte {
	var e bin.Encoder
	e.B = make([]byte, 0, 2+4+len(eventID)+len(pduJSON))
	e.U8(kindEvent)
	e.U8(recordVersion)
	e.Str(eventID)
	e.Fixed(pduJSON)
	return e.B
}

// DecodeEvent decodes an event record. pduJSON aliases b.
func DecodeEvent(b []byte) (eventID string, pduJSON []byte, err error) {
	d := bin.NewDecoder(b)
	if err := checkKind(d, kindEvent, "event"); err != nil {
		return "", nil, err
	}
	eventID = d.Str("event_id")
	if err := d.Err(); err != nil {
		return "", nil, fmt.Errorf("%w: event: %v", ErrCorruptRecord, err)
	}
	return eventID, b[2+4+len(eventID):], nil
}

// EventRecords returns the IDs of the records of one event: the PDU, its metadata and
// its state record (which exists only once the event was replayed).
func EventRecords(eventID string) (event, meta, state packstore.ID) {
	ev := EventRecordID(eventID)
	return ev, MetaRecordID(ev), StateRecordID(ev)
}

// WithKeepRule returns h with the keep rule of an every-k repack over the events
// imported so far: StateEvery k and StateKeptBelow Events, so that a repack may
// then drop the state records the rule does not require (KeepsState). A head that
// already has a rule of every j accepts only multiples of j: the new rule must
// not require a state record the old one let a repack drop (a forced replay
// clears the rule). k 0 is an error; the errors name the room.
func (h Head) WithKeepRule(k uint32) (Head, error) {
	switch {
	case k == 0:
		return h, fmt.Errorf("roomrecord: room %s: keep rule every 0 events", h.RoomID)
	case h.StateEvery != 0 && k%h.StateEvery != 0:
		return h, fmt.Errorf("roomrecord: room %s: keep rule every %d does not follow every %d (it would require state records already dropped; replay --force first)",
			h.RoomID, k, h.StateEvery)
	}
	h.StateEvery, h.StateKeptBelow = k, h.Events
	return h, nil
}
