package roomrules

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/mtxdb/mtxdb/roomrecord"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/mtxdb/mtxdb/authrules"
	"github.com/mtxdb/mtxdb/resolver"
)

// ErrUseLists is returned by ResolveSnapshots for a room version whose states it
// does not resolve from snapshots (1, and versions outside 1-12): the caller
// hands the states over as event lists to Resolve instead.
var ErrUseLists = errors.New("roomrules: room version not resolved from snapshots")

// ErrStaleGraph is returned (wrapped) by ResolveSnapshots when a state names an
// event or a key the room's graph does not hold: rows the server had not
// committed when the graph was last refreshed. The caller may resolve by Resolve.
var ErrStaleGraph = errors.New("roomrules: the room's auth graph lacks an event of the states")

// NIDKey is a state key as a server numbers it: (event type NID, state key NID).
type NIDKey struct{ Type, StateKey int64 }

// EventRow is one event of a room as a server's event table holds it: no PDU,
// only what the auth graph needs.
type EventRow struct {
	NID     int64 // the server's event NID
	EventID string
	Type    string
	// StateKey is the state key of a state event, nil for other events.
	StateKey *string
	// Key is the state key's NIDs (state events only).
	Key NIDKey
	// AuthNIDs are the event's auth_events as NIDs, in the PDU's order, as the
	// server numbered them when it stored the event: auth events it did not hold
	// then may be left out (Dendrite leaves them out of auth_event_nids).
	AuthNIDs []int64
	// AuthIDs, if not nil, are the event's auth_events as its JSON lists them:
	// every edge, also to events the server did not hold when it stored the event.
	// The graph takes these, then the events of AuthNIDs they lack (in room
	// version 12, the create event the room ID names).
	AuthIDs []string
}

// RoomGraph is a room's auth graph for ResolveSnapshots, grown from the server's
// event rows (Add) and indexed on the next resolution after rows were added
// (resolver.AuthGraph over a roomrecord.Graph: about 250 bytes per event, plus the
// NID maps). Safe for concurrent use: resolutions of one room take turns.
type RoomGraph struct {
	mu      sync.Mutex
	metas   []roomrecord.EventMeta
	last    int64            // highest NID added
	idOf    map[int64]string // event NID -> event ID
	nidOf   map[string]int64 // event ID -> event NID
	keyOf   map[NIDKey]resolver.Key
	nidKey  map[resolver.Key]NIDKey
	indexed *resolver.AuthGraph // nil once rows were added since the last index
	// pending are the auth edges to event NIDs the graph does not hold, by that
	// NID: named "nid:N" until the row arrives.
	pending map[int64][]authEdge
	// wanted are event NIDs a state named that the graph did not hold (an
	// unconflicted entry); asked, those a refresh has read rows from below Last
	// for (once each: a NID still missing after that is not the room's).
	wanted, asked map[int64]bool
	nids          []int64 // the NIDs held, ascending
}

// authEdge is the pos-th auth event of metas[meta].
type authEdge struct{ meta, pos int }

// NewRoomGraph returns an empty graph.
func NewRoomGraph() *RoomGraph {
	return &RoomGraph{idOf: map[int64]string{}, nidOf: map[string]int64{}, keyOf: map[NIDKey]resolver.Key{},
		nidKey: map[resolver.Key]NIDKey{}, pending: map[int64][]authEdge{}, wanted: map[int64]bool{}, asked: map[int64]bool{}}
}

// Last returns the highest event NID added (0 for none): the next refresh asks
// for rows above it.
func (g *RoomGraph) Last() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.last
}

// Add adds rows, in any order; rows of event NIDs the graph holds are skipped.
// A row may come after rows that cite it in their auth events: a server's rows
// need not become visible in NID order (two transactions writing one room, the
// lower NID committed last). An auth NID of an event the graph does not hold is
// a missing edge (named "nid:N" in errors) until the event's row is added.
func (g *RoomGraph) Add(rows []EventRow) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.add(rows)
}

func (g *RoomGraph) add(rows []EventRow) {
	for _, r := range rows {
		if _, held := g.idOf[r.NID]; held {
			continue
		}
		m := roomrecord.EventMeta{Seq: uint32(len(g.metas)), EventID: r.EventID, Type: r.Type, IsState: r.StateKey != nil}
		if r.StateKey != nil {
			m.StateKey = *r.StateKey
			k := resolver.Key{Type: r.Type, StateKey: *r.StateKey}
			g.keyOf[r.Key], g.nidKey[k] = k, r.Key
		}
		m.AuthEvents = slices.Clone(r.AuthIDs)
		for _, a := range r.AuthNIDs {
			id, ok := g.idOf[a]
			switch {
			case ok && slices.Contains(r.AuthIDs, id):
				continue
			case !ok:
				id = fmt.Sprintf("nid:%d", a)
				g.pending[a] = append(g.pending[a], authEdge{meta: len(g.metas), pos: len(m.AuthEvents)})
			}
			m.AuthEvents = append(m.AuthEvents, id)
		}
		g.metas = append(g.metas, m)
		g.idOf[r.NID], g.nidOf[r.EventID] = r.EventID, r.NID
		if i, _ := slices.BinarySearch(g.nids, r.NID); i == len(g.nids) {
			g.nids = append(g.nids, r.NID)
		} else {
			g.nids = slices.Insert(g.nids, i, r.NID)
		}
		for _, e := range g.pending[r.NID] {
			g.metas[e.meta].AuthEvents[e.pos] = r.EventID
		}
		delete(g.pending, r.NID)
		delete(g.wanted, r.NID)
		g.last = max(g.last, r.NID)
		g.indexed = nil
	}
}

// maxRereadRows bounds the rows a refresh reads again from below Last: a row
// that became visible late is among the room's latest, while an auth NID
// further down is another room's event (a rejected event may cite one), and
// reading the room again for it, once per such event, would let a remote server
// make every resolution read the whole room. A variable for tests.
var maxRereadRows = 4096

// refresh adds the rows above Last, then, once per NID, the rows from the lowest
// NID the graph lacks that an auth edge, a conflicted key (st) or an earlier
// resolution's unconflicted entry named: a row that became visible after rows
// above it were read. It does not read again when the graph holds more than
// maxRereadRows rows above that NID. The caller holds g.mu.
func (g *RoomGraph) refresh(rows func(after int64) ([]EventRow, error), st SnapshotStates) error {
	more, err := rows(g.last)
	if err != nil {
		return err
	}
	g.add(more)
	var lowest int64
	want := func(nid int64) {
		if _, held := g.idOf[nid]; nid > 0 && !held && !g.asked[nid] {
			g.asked[nid] = true
			if lowest == 0 || nid < lowest {
				lowest = nid
			}
		}
	}
	for nid := range g.pending {
		want(nid)
	}
	for nid := range g.wanted {
		want(nid)
	}
	for _, c := range st.Conflicts {
		for _, nid := range c.Events {
			want(nid)
		}
	}
	if lowest == 0 {
		return nil
	}
	if i, _ := slices.BinarySearch(g.nids, lowest); len(g.nids)-i > maxRereadRows {
		return nil
	}
	if more, err = rows(lowest - 1); err != nil {
		return err
	}
	g.add(more)
	return nil
}

// index returns the auth index over the rows added so far; the caller holds g.mu.
func (g *RoomGraph) index() (*resolver.AuthGraph, error) {
	if g.indexed == nil {
		rg, err := roomrecord.GraphOf(g.metas)
		if err != nil {
			return nil, err
		}
		g.indexed = resolver.NewAuthGraph(rg)
	}
	return g.indexed, nil
}

// Graphs keeps the RoomGraphs of a server's rooms by room NID, the most recently
// used first, at most a fixed number of rooms. Safe for concurrent use.
type Graphs struct {
	mu    sync.Mutex
	rooms *lru.Cache[int64, *RoomGraph]
}

// NewGraphs keeps the graphs of up to rooms rooms (at least 1).
func NewGraphs(rooms int) *Graphs {
	c, _ := lru.New[int64, *RoomGraph](max(rooms, 1))
	return &Graphs{rooms: c}
}

// Room returns the graph of a room, creating an empty one.
func (gs *Graphs) Room(roomNID int64) *RoomGraph {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if g, ok := gs.rooms.Get(roomNID); ok {
		return g
	}
	g := NewRoomGraph()
	gs.rooms.Add(roomNID, g)
	return g
}

// Conflict is one conflicted key of a server's snapshots: the event NID each
// state gives it, 0 where a state lacks the key.
type Conflict struct {
	Key    NIDKey
	Events []int64
}

// SnapshotStates are the states to resolve as a server keeps them: the
// conflicted keys from a diff of the states' snapshots (every key missing from
// some state or differing between them), and a lookup of any other key, which
// every state gives the same event (the unconflicted state map).
type SnapshotStates struct {
	// N is the number of states; len(Conflict.Events) == N.
	N         int
	Conflicts []Conflict
	// Unconflicted returns the event NID the states give a key not among
	// Conflicts; ok is false when they lack it.
	Unconflicted func(NIDKey) (nid int64, ok bool, err error)
}

// Change is one entry of the resolved state that differs from the input states'
// unconflicted map: Event is the event NID, 0 when the key is absent from the
// resolved state.
type Change struct {
	Key   NIDKey
	Event int64
}

// ResolveSnapshots resolves states given by their snapshots' diff (state
// resolution v2 for room versions 2-11, v2.1 for 12: Matrix spec v1.19, Room Versions,
// "State resolution"; resolver.ResolveConflicts): only the conflicted events,
// their auth chains and the unconflicted entries the algorithm asks for are read
// (events through src, the auth difference from the room's graph, refreshed first
// by rows, which returns the server's rows of the room above an event NID, oldest
// first: called with Last, and once more from below a NID the graph lacks that
// an auth edge or a state names, for a row that became visible late). It
// returns the changes to make to the unconflicted map: each conflicted key's
// outcome, and keys no state had that auth-difference events bring in. Errors:
// ErrUseLists (room version 1 and versions outside 1-12), ErrStaleGraph (wrapped),
// ErrNoEvent, ErrPanic, resolver errors, and those of rows and Unconflicted.
func ResolveSnapshots(version gomatrixserverlib.RoomVersion, st SnapshotStates, g *RoomGraph,
	rows func(after int64) ([]EventRow, error), src Source) (changes []Change, err error) {
	defer func() {
		if rec := recover(); rec != nil {
			changes, err = nil, fmt.Errorf("%w: state resolution of room version %s: %v", ErrPanic, version, rec)
		}
	}()
	if authrules.Rules(string(version)) == nil {
		return nil, ErrUseLists
	}
	if v, err := gomatrixserverlib.GetRoomVersion(version); err != nil || v.StateResAlgorithm() == gomatrixserverlib.StateResV1 {
		return nil, ErrUseLists
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if rows != nil {
		if err := g.refresh(rows, st); err != nil {
			return nil, fmt.Errorf("roomrules: event rows: %w", err)
		}
	}
	idx, err := g.index()
	if err != nil {
		return nil, err
	}
	in, err := g.conflictInput(st)
	if err != nil {
		return nil, err
	}
	es := newEventSource(src)
	if in.Create, err = g.create(st, in.Unconflicted, es); err != nil {
		return nil, err
	}
	res, err := idx.ResolveWithGraph(in, es)
	if err != nil {
		return nil, err
	}
	return g.changes(res)
}

// conflictInput turns the server's conflicted keys and events into the
// resolver's, by the graph's NID maps; the caller holds g.mu.
func (g *RoomGraph) conflictInput(st SnapshotStates) (resolver.ConflictInput, error) {
	in := resolver.ConflictInput{PerState: make([][]string, st.N)}
	conflicted := make(map[resolver.Key]bool, len(st.Conflicts))
	for _, c := range st.Conflicts {
		k, ok := g.keyOf[c.Key]
		if !ok {
			return in, fmt.Errorf("%w: state key NIDs (%d, %d)", ErrStaleGraph, c.Key.Type, c.Key.StateKey)
		}
		if len(c.Events) != st.N {
			return in, fmt.Errorf("roomrules: conflicted key %v has %d events for %d states", k, len(c.Events), st.N)
		}
		conflicted[k] = true
		for i, nid := range c.Events {
			if nid == 0 {
				continue
			}
			id, ok := g.idOf[nid]
			if !ok {
				return in, fmt.Errorf("%w: event NID %d (key %v)", ErrStaleGraph, nid, k)
			}
			in.PerState[i] = append(in.PerState[i], id)
		}
	}
	in.Unconflicted = func(k resolver.Key) (string, bool, error) {
		if conflicted[k] {
			return "", false, nil
		}
		nk, ok := g.nidKey[k]
		if !ok {
			return "", false, nil // no event of the room has this key
		}
		nid, ok, err := st.Unconflicted(nk)
		if err != nil || !ok {
			return "", false, err
		}
		id, ok := g.idOf[nid]
		if !ok {
			g.wanted[nid] = true
			return "", false, fmt.Errorf("%w: event NID %d (key %v)", ErrStaleGraph, nid, k)
		}
		return id, true, nil
	}
	return in, nil
}

// create returns the room's m.room.create: the unconflicted map's, else the
// first conflicted one.
func (g *RoomGraph) create(st SnapshotStates, unconflicted func(resolver.Key) (string, bool, error), es *eventSource) (gomatrixserverlib.PDU, error) {
	k := resolver.Key{Type: spec.MRoomCreate, StateKey: ""}
	id, ok, err := unconflicted(k)
	if err != nil {
		return nil, err
	}
	if !ok {
		for _, c := range st.Conflicts {
			if g.keyOf[c.Key] != k {
				continue
			}
			for _, nid := range c.Events {
				if nid != 0 && id == "" {
					id = g.idOf[nid]
				}
			}
		}
	}
	if id == "" {
		return nil, fmt.Errorf("%w: no m.room.create in the states", ErrNoEvent)
	}
	return es.Event(id)
}

// changes turns the resolver's outcome into the server's NIDs.
func (g *RoomGraph) changes(res resolver.Resolution) ([]Change, error) {
	out := make([]Change, 0, len(res.Set)+len(res.Delete))
	for _, k := range res.Delete {
		nk, ok := g.nidKey[k]
		if !ok {
			return nil, fmt.Errorf("%w: key %v", ErrStaleGraph, k)
		}
		out = append(out, Change{Key: nk})
	}
	for k, id := range res.Set {
		nk, ok := g.nidKey[k]
		nid, ok2 := g.nidOf[id]
		if !ok || !ok2 {
			return nil, fmt.Errorf("%w: resolved event %s (key %v)", ErrStaleGraph, id, k)
		}
		out = append(out, Change{Key: nk, Event: nid})
	}
	return out, nil
}
