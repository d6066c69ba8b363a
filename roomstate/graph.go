package roomstate

import (
	"fmt"
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

// graphBuilder assembles a Graph event by event.
type graphBuilder struct {
	g      *Graph
	index  map[string]int32
	keyIdx map[StatePair]int32
}

func newGraphBuilder(ids []string) *graphBuilder {
	b := &graphBuilder{
		g: &Graph{IDs: ids, Key: make([]int32, 0, len(ids)), Redacted: make([]bool, 0, len(ids)),
			prevOff: make([]int32, 1, len(ids)+1), authOff: make([]int32, 1, len(ids)+1), missing: map[edgeRef]string{}},
		index:  make(map[string]int32, len(ids)),
		keyIdx: map[StatePair]int32{},
	}
	for i, id := range ids {
		b.index[id] = int32(i)
	}
	return b
}

// add appends the next event (its index is the number of events added before).
func (b *graphBuilder) add(m *EventMeta) error {
	g := b.g
	i := int32(len(g.Key))
	if int(i) >= len(g.IDs) || g.IDs[i] != m.EventID {
		return fmt.Errorf("%w: event %d of the arrival log is not %s", ErrCorruptRecord, i, m.EventID)
	}
	k := int32(-1)
	if m.IsState {
		p := StatePair{m.Type, m.StateKey}
		var ok bool
		if k, ok = b.keyIdx[p]; !ok {
			k = int32(len(g.Keys))
			g.Keys = append(g.Keys, p)
			b.keyIdx[p] = k
		}
	}
	g.Key = append(g.Key, k)
	g.Redacted = append(g.Redacted, m.Redacted)
	for j, p := range m.PrevEvents {
		x, ok := b.index[p]
		if !ok {
			x = -1
			g.missing[edgeRef{i, int32(-1 - j)}] = p
		}
		g.prev = append(g.prev, x)
	}
	g.prevOff = append(g.prevOff, int32(len(g.prev)))
	for j, a := range m.AuthEvents {
		x, ok := b.index[a]
		if !ok {
			x = -1
			g.missing[edgeRef{i, int32(j)}] = a
		}
		g.auth = append(g.auth, x)
	}
	g.authOff = append(g.authOff, int32(len(g.auth)))
	return nil
}

// GraphOf builds a Graph from metadata records in arrival order (metas[i] is
// the event with Seq i). For tests and tools that hold events in memory.
func GraphOf(metas []EventMeta) (*Graph, error) {
	ids := make([]string, len(metas))
	for i, m := range metas {
		ids[i] = m.EventID
	}
	b := newGraphBuilder(ids)
	for i := range metas {
		if err := b.add(&metas[i]); err != nil {
			return nil, err
		}
	}
	return b.g, nil
}

// Graph loads the room's DAG in dense form from the metadata records, in arrival
// order. Cost: one metadata read per event.
func (r *Room) Graph() (*Graph, error) {
	ids, err := r.EventIDs()
	if err != nil {
		return nil, err
	}
	b := newGraphBuilder(ids)
	for _, id := range ids {
		m, err := r.Meta(id)
		if err != nil {
			return nil, err
		}
		if err := b.add(&m); err != nil {
			return nil, fmt.Errorf("room %s: %w", r.head.RoomID, err)
		}
	}
	return b.g, nil
}
