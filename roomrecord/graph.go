package roomrecord

import (
	"fmt"
	"math"

	"github.com/mtxdb/mtxdb/internal/bin"
	"github.com/mtxdb/mtxdb/internal/strtab"
	"github.com/mtxdb/mtxdb/packstore"
)

// StatePair is an interned (event_type, state_key).
type StatePair struct{ Type, StateKey string }

// Graph is a room's DAG in dense form: events numbered by arrival index (the
// metadata record's Seq), prev_events and auth_events as numbers in compressed
// sparse rows, state keys interned. An edge to an event the room does not hold
// (an outlier's missing ancestor) is -1, and its ID is kept (MissingPrev,
// MissingAuth). About 40 bytes per event plus 4 per edge, beside the IDs.
//
// Graph is a snapshot: events imported after it was loaded are not in it. Not
// safe for concurrent mutation; concurrent reads are fine.
type Graph struct {
	IDs      []string    // event ID by index
	Keys     []StatePair // interned state keys
	Key      []int32     // per event: index into Keys, -1 for a non-state event
	Redacted []bool      // per event: content hash failed at import (used redacted)
	prevOff  []int32
	prev     []int32
	authOff  []int32
	auth     []int32
	missing  map[edgeRef]string
}

type edgeRef struct {
	event int32
	pos   int32 // position in auth_events, or -1-position in prev_events
}

// Prev returns the prev_events of event i as indexes (-1: not in the room).
func (g *Graph) Prev(i int) []int32 { return g.prev[g.prevOff[i]:g.prevOff[i+1]] }

// Auth returns the auth_events of event i as indexes (-1: not in the room).
func (g *Graph) Auth(i int) []int32 { return g.auth[g.authOff[i]:g.authOff[i+1]] }

// MissingAuth returns the ID of the j-th auth event of i when it is not in the room.
func (g *Graph) MissingAuth(i, j int) string { return g.missing[edgeRef{int32(i), int32(j)}] }

// MissingPrev returns the ID of the j-th prev event of i when it is not in the room.
func (g *Graph) MissingPrev(i, j int) string { return g.missing[edgeRef{int32(i), int32(-1 - j)}] }

// GraphBuilder assembles a Graph event by event, in arrival order: from graph
// records (AddRecord, one per arrival-log chunk) or from metadata records
// (AddMeta, one per event).
type GraphBuilder struct {
	g      *Graph
	index  map[string]int32
	keyIdx map[StatePair]int32
	// The Graph's Keys hold their strings in arena, each event type once
	// (types): a room's keys are then a few objects for the garbage collector
	// to mark, not two per key.
	arena strtab.Arena
	types map[string]string
}

// NewGraphBuilder starts the graph of the events ids (the arrival log, in order).
func NewGraphBuilder(ids []string) *GraphBuilder {
	b := &GraphBuilder{
		g: &Graph{IDs: ids, Key: make([]int32, 0, len(ids)), Redacted: make([]bool, 0, len(ids)),
			prevOff: make([]int32, 1, len(ids)+1), authOff: make([]int32, 1, len(ids)+1), missing: map[edgeRef]string{}},
		index:  make(map[string]int32, len(ids)),
		keyIdx: map[StatePair]int32{},
		types:  map[string]string{},
	}
	for i, id := range ids {
		b.index[id] = int32(i)
	}
	return b
}

// AddMeta appends the next event from its metadata record (its index is the
// number of events added before). An event other than the arrival log's next is
// ErrCorruptRecord.
func (b *GraphBuilder) AddMeta(m *EventMeta) error {
	i := int32(len(b.g.Key))
	if int(i) >= len(b.g.IDs) || b.g.IDs[i] != m.EventID {
		return fmt.Errorf("%w: event %d of the arrival log is not %s", ErrCorruptRecord, i, m.EventID)
	}
	e := GraphEntry{isState: m.IsState, redacted: m.Redacted, key: StatePair{m.Type, m.StateKey}}
	for _, p := range m.PrevEvents {
		e.prev = append(e.prev, graphEdgeMissing)
		e.missing = append(e.missing, p)
	}
	for _, a := range m.AuthEvents {
		e.auth = append(e.auth, graphEdgeMissing)
		e.missing = append(e.missing, a)
	}
	return b.addEntry(&e)
}

// graphEdgeMissing marks, in a graph record, an edge to an event the room did not
// hold when the record was written; its ID follows in the entry's missing list.
const graphEdgeMissing = math.MaxUint32

// GraphEntry is one event of a graph record: its flags, state key, and edges as
// arrival indexes, with the IDs of the events the room did not hold when it was
// written. NewGraphEntry makes one; EncodeGraphChunk writes them.
type GraphEntry struct {
	isState, redacted bool
	key               StatePair
	prev, auth        []uint32 // indexes, graphEdgeMissing for the IDs in missing
	missing           []string // in prev-then-auth order
}

// addEntry appends the next event; a missing edge whose event the room now holds
// is resolved to it.
func (b *GraphBuilder) addEntry(e *GraphEntry) error {
	g := b.g
	i := int32(len(g.Key))
	k := int32(-1)
	if e.isState {
		var ok bool
		if k, ok = b.keyIdx[e.key]; !ok {
			k = int32(len(g.Keys))
			key := StatePair{Type: b.types[e.key.Type], StateKey: b.arena.Copy(e.key.StateKey)}
			if key.Type == "" && e.key.Type != "" {
				key.Type = b.arena.Copy(e.key.Type)
				b.types[key.Type] = key.Type
			}
			g.Keys = append(g.Keys, key)
			b.keyIdx[key] = k
		}
	}
	g.Key = append(g.Key, k)
	g.Redacted = append(g.Redacted, e.redacted)
	next := 0
	edge := func(x uint32, pos int32) (int32, error) {
		if x != graphEdgeMissing {
			if int(x) >= len(g.IDs) {
				return 0, fmt.Errorf("%w: graph record: event %s names event %d of %d", ErrCorruptRecord, g.IDs[i], x, len(g.IDs))
			}
			return int32(x), nil
		}
		if next >= len(e.missing) {
			return 0, fmt.Errorf("%w: graph record: event %s: missing edge without an ID", ErrCorruptRecord, g.IDs[i])
		}
		id := e.missing[next]
		next++
		if y, ok := b.index[id]; ok {
			return y, nil
		}
		g.missing[edgeRef{i, pos}] = id
		return -1, nil
	}
	for j, x := range e.prev {
		y, err := edge(x, int32(-1-j))
		if err != nil {
			return err
		}
		g.prev = append(g.prev, y)
	}
	g.prevOff = append(g.prevOff, int32(len(g.prev)))
	for j, x := range e.auth {
		y, err := edge(x, int32(j))
		if err != nil {
			return err
		}
		g.auth = append(g.auth, y)
	}
	g.authOff = append(g.authOff, int32(len(g.auth)))
	if next != len(e.missing) {
		return fmt.Errorf("%w: graph record: event %s: %d IDs for %d missing edges", ErrCorruptRecord, g.IDs[i], len(e.missing), next)
	}
	return nil
}

// AddRecord appends the events of one graph record (its encoded payload). A
// record that fails to decode, starts elsewhere than at the events added before,
// holds more events than the arrival log, or has an edge past the room's events
// is ErrCorruptRecord.
func (b *GraphBuilder) AddRecord(raw []byte) error {
	base, entries, err := decodeGraphChunk(raw)
	if err != nil {
		return err
	}
	n := len(b.g.Key)
	if int(base) != n || n+len(entries) > len(b.g.IDs) {
		return fmt.Errorf("%w: graph record holds events %d..%d, expected from %d of %d",
			ErrCorruptRecord, base, int(base)+len(entries), n, len(b.g.IDs))
	}
	for k := range entries {
		if err := b.addEntry(&entries[k]); err != nil {
			return err
		}
	}
	return nil
}

// Graph returns the graph once every event of the arrival log was added;
// ErrCorruptRecord names the counts otherwise.
func (b *GraphBuilder) Graph() (*Graph, error) {
	if len(b.g.Key) != len(b.g.IDs) {
		return nil, fmt.Errorf("%w: graph records hold %d events, the arrival log %d", ErrCorruptRecord, len(b.g.Key), len(b.g.IDs))
	}
	return b.g, nil
}

// GraphOf builds a Graph from metadata records in arrival order (metas[i] is
// the event with Seq i). For tests and tools that hold events in memory.
func GraphOf(metas []EventMeta) (*Graph, error) {
	ids := make([]string, len(metas))
	for i, m := range metas {
		ids[i] = m.EventID
	}
	b := NewGraphBuilder(ids)
	for i := range metas {
		if err := b.AddMeta(&metas[i]); err != nil {
			return nil, err
		}
	}
	return b.Graph()
}

// GraphChunkID is the record ID of the graph record of arrival-log chunk i.
func GraphChunkID(i uint32) packstore.ID {
	var b [4]byte
	b[0], b[1], b[2], b[3] = byte(i), byte(i>>8), byte(i>>16), byte(i>>24)
	return hashID([]byte("mtxdb/graph\x00"), b[:])
}

// NewGraphEntry is the graph-record entry of an event: each edge is the arrival
// index known returns for it, or, where known has none, the ID (an event that has
// not arrived yet).
func NewGraphEntry(m *EventMeta, known func(eventID string) (uint32, bool)) GraphEntry {
	e := GraphEntry{isState: m.IsState, redacted: m.Redacted, key: StatePair{m.Type, m.StateKey}}
	edges := func(ids []string) []uint32 {
		out := make([]uint32, len(ids))
		for j, id := range ids {
			if x, ok := known(id); ok {
				out[j] = x
			} else {
				out[j] = graphEdgeMissing
				e.missing = append(e.missing, id)
			}
		}
		return out
	}
	e.prev = edges(m.PrevEvents)
	e.auth = edges(m.AuthEvents)
	return e
}

// EncodeGraphChunk encodes the graph record of the events base.. (see the
// package documentation).
func EncodeGraphChunk(base uint32, entries []GraphEntry) []byte {
	var e bin.Encoder
	e.U8(kindGraph)
	e.U8(recordVersion)
	e.U32(base)
	e.U32(uint32(len(entries)))
	for i := range entries {
		x := &entries[i]
		e.U8(eventFlags(x.isState, x.redacted))
		if x.isState {
			e.Str(x.key.Type)
			e.Str(x.key.StateKey)
		}
		for _, edges := range [][]uint32{x.prev, x.auth} {
			e.U32(uint32(len(edges)))
			for _, v := range edges {
				e.U32(v)
			}
		}
		e.Strs(x.missing)
	}
	return e.B
}

// decodeGraphChunk decodes a graph record; every count is checked against the
// bytes left before anything is allocated.
func decodeGraphChunk(b []byte) (base uint32, entries []GraphEntry, err error) {
	d := bin.NewDecoder(b)
	if err := checkKind(d, kindGraph, "graph record"); err != nil {
		return 0, nil, err
	}
	base = d.U32("base")
	n := d.U32("count")
	if d.Err() == nil && uint64(n) > uint64(len(b))/13 { // an entry takes at least 13 bytes
		return 0, nil, fmt.Errorf("%w: graph record declares %d events in %d bytes", ErrCorruptRecord, n, len(b))
	}
	entries = make([]GraphEntry, 0, n)
	for k := uint32(0); k < n && d.Err() == nil; k++ {
		var x GraphEntry
		f := d.U8("flags")
		if f&^3 != 0 {
			return 0, nil, fmt.Errorf("%w: graph record: event %d: unknown flags %#x", ErrCorruptRecord, base+k, f)
		}
		x.isState, x.redacted = f&1 != 0, f&2 != 0
		if x.isState {
			x.key.Type = d.Str("type")
			x.key.StateKey = d.Str("state_key")
		}
		for _, dst := range []*[]uint32{&x.prev, &x.auth} {
			c := d.U32("edge count")
			if d.Err() != nil || uint64(c) > uint64(len(b))/4 {
				return 0, nil, fmt.Errorf("%w: graph record: event %d: bad edge count %d (%v)", ErrCorruptRecord, base+k, c, d.Err())
			}
			*dst = make([]uint32, c)
			for j := range *dst {
				(*dst)[j] = d.U32("edge")
			}
		}
		x.missing = d.Strs("missing edges")
		entries = append(entries, x)
	}
	if err := d.Finish(); err != nil {
		return 0, nil, fmt.Errorf("%w: graph record: %v", ErrCorruptRecord, err)
	}
	return base, entries, nil
}

// Diff describes the first difference between two graphs of one room (events,
// keys, flags, edges and the IDs of missing edges), "" when they are equal. For
// tests and verify.
func (g *Graph) Diff(o *Graph) string {
	if len(g.Key) != len(o.Key) {
		return fmt.Sprintf("%d events, the other %d", len(g.Key), len(o.Key))
	}
	index := make(map[string]int32, len(o.IDs))
	for i, id := range o.IDs {
		index[id] = int32(i)
	}
	lookup := func(id string) (int32, bool) { x, ok := index[id]; return x, ok }
	for i := range g.Key {
		if g.IDs[i] != o.IDs[i] {
			return fmt.Sprintf("event %d is %s, the other %s", i, g.IDs[i], o.IDs[i])
		}
		m := o.meta(i)
		if d := g.DiffMeta(i, &m, lookup); d != "" {
			return fmt.Sprintf("event %s: %s", g.IDs[i], d)
		}
	}
	return ""
}

// meta returns what the metadata record of event i says of its edges and key.
func (g *Graph) meta(i int) EventMeta {
	m := EventMeta{EventID: g.IDs[i], IsState: g.Key[i] >= 0, Redacted: g.Redacted[i]}
	if m.IsState {
		m.Type, m.StateKey = g.Keys[g.Key[i]].Type, g.Keys[g.Key[i]].StateKey
	}
	for j, x := range g.Prev(i) {
		if x >= 0 {
			m.PrevEvents = append(m.PrevEvents, g.IDs[x])
		} else {
			m.PrevEvents = append(m.PrevEvents, g.MissingPrev(i, j))
		}
	}
	for j, x := range g.Auth(i) {
		if x >= 0 {
			m.AuthEvents = append(m.AuthEvents, g.IDs[x])
		} else {
			m.AuthEvents = append(m.AuthEvents, g.MissingAuth(i, j))
		}
	}
	return m
}

// DiffMeta describes how event i of g differs from its metadata record, "" when
// it does not (index: event ID -> arrival index, false for an event not in the
// room).
func (g *Graph) DiffMeta(i int, m *EventMeta, index func(eventID string) (int32, bool)) string {
	key, isState := StatePair{}, g.Key[i] >= 0
	if isState {
		key = g.Keys[g.Key[i]]
	}
	switch {
	case isState != m.IsState || (isState && key != StatePair{m.Type, m.StateKey}):
		return fmt.Sprintf("key %v (state %v), metadata %v (state %v)", key, isState, StatePair{m.Type, m.StateKey}, m.IsState)
	case g.Redacted[i] != m.Redacted:
		return fmt.Sprintf("redacted %v, metadata %v", g.Redacted[i], m.Redacted)
	case len(g.Prev(i)) != len(m.PrevEvents) || len(g.Auth(i)) != len(m.AuthEvents):
		return fmt.Sprintf("%d prev and %d auth events, metadata %d and %d", len(g.Prev(i)), len(g.Auth(i)), len(m.PrevEvents), len(m.AuthEvents))
	}
	check := func(what string, got []int32, want []string, missing func(j int) string) string {
		for j, id := range want {
			x, ok := index(id)
			if !ok {
				x = -1
			}
			if got[j] != x || (x < 0 && missing(j) != id) {
				return fmt.Sprintf("%s %d is %d, metadata %s", what, j, got[j], id)
			}
		}
		return ""
	}
	if d := check("prev_event", g.Prev(i), m.PrevEvents, func(j int) string { return g.MissingPrev(i, j) }); d != "" {
		return d
	}
	return check("auth_event", g.Auth(i), m.AuthEvents, func(j int) string { return g.MissingAuth(i, j) })
}
