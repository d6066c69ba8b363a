package roomstate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/mtxdb/mtxdb/pdu"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomrecord"
)

// Store is the Dendrite-style room storage over one packstore engine. Safe for
// concurrent reads; writes to one room must be serialised by the caller.
type Store struct {
	eng packstore.StorageEngine

	// mu guards heads: the newest head this Store wrote per room (Import, StateWriter.Commit),
	// with a generation that grows on every write, so that every *Room of this
	// Store follows its room's head (Room.refresh).
	mu    sync.Mutex
	heads map[packstore.ID]headGen
}

// headGen is a room head as last written through a Store, and its generation.
type headGen struct {
	gen  uint64
	head roomrecord.Head
	raw  []byte // the head record's bytes (Room.headRaw)
}

// New returns a Store over eng. The Store does not own eng: closing eng is the
// caller's job.
func New(eng packstore.StorageEngine) *Store {
	return &Store{eng: eng, heads: map[packstore.ID]headGen{}}
}

// publish records h as room coll's newest head, after it was written to the engine.
func (s *Store) publish(coll packstore.ID, h roomrecord.Head, raw []byte) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.heads[coll]
	e.gen++
	e.head, e.raw = h, raw
	s.heads[coll] = e
	return e.gen
}

// generation returns room coll's head generation (0: never written through s).
func (s *Store) generation(coll packstore.ID) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.heads[coll].gen
}

// newRoom returns a Room over a head just read from the engine.
func (s *Store) newRoom(coll packstore.ID, h roomrecord.Head, raw []byte) *Room {
	return &Room{s: s, coll: coll, head: h, headRaw: raw, gen: s.generation(coll)}
}

// Engine returns the underlying storage engine.
func (s *Store) Engine() packstore.StorageEngine { return s.eng }

// Rooms returns every room that has a head record, sorted by room ID. ctx is
// checked before the listing and before each room's head is read. A head it
// cannot read or decode is the error (a *HeadError); RoomsAndErrors goes on
// past it.
func (s *Store) Rooms(ctx context.Context) ([]*Room, error) {
	rooms, bad, err := s.RoomsAndErrors(ctx)
	if err == nil && len(bad) > 0 {
		err = bad[0]
	}
	if err != nil {
		return nil, err
	}
	return rooms, nil
}

// HeadError is a room collection whose head record cannot be read or decoded
// (a corrupt frame, a record of an unknown version): its room ID, which the
// head holds, is not known.
type HeadError struct {
	Collection packstore.ID
	Err        error
}

// Error names the collection and says why its head cannot be read.
func (e *HeadError) Error() string {
	return fmt.Sprintf("roomstate: head of room collection %s (the room ID is in the head): %v", e.Collection, e.Err)
}

// Unwrap returns the read or decode error (packstore.ErrCorrupt,
// roomrecord.ErrCorruptRecord, ...), for errors.Is.
func (e *HeadError) Unwrap() error { return e.Err }

// RoomsAndErrors is Rooms going on past the collections whose head it cannot
// read: those come back as HeadErrors, in collection order, beside every room
// it can open. err is a failure to list the collections, or the context's.
func (s *Store) RoomsAndErrors(ctx context.Context) (rooms []*Room, bad []*HeadError, err error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	colls := s.eng.Collections()
	if l, ok := s.eng.(interface {
		ListCollections() ([]packstore.ID, error)
	}); ok {
		// An engine whose listing can fail (pgstore) says so here rather than
		// returning no rooms.
		var err error
		if colls, err = l.ListCollections(); err != nil {
			return nil, nil, fmt.Errorf("roomstate: list rooms: %w", err)
		}
	}
	for _, coll := range colls {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		b, err := getKind(s.eng, coll, roomrecord.HeadRecordID, roomrecord.ReadOther)
		if errors.Is(err, packstore.ErrNotFound) {
			continue // not a room collection
		}
		if err != nil {
			bad = append(bad, &HeadError{Collection: coll, Err: err})
			continue
		}
		h, err := s.decodeHead(coll, b)
		if err != nil {
			bad = append(bad, &HeadError{Collection: coll, Err: err})
			continue
		}
		rooms = append(rooms, s.newRoom(coll, h, b))
	}
	sort.Slice(rooms, func(i, j int) bool { return rooms[i].head.RoomID < rooms[j].head.RoomID })
	sort.Slice(bad, func(i, j int) bool { return bytes.Compare(bad[i].Collection[:], bad[j].Collection[:]) < 0 })
	return rooms, bad, nil
}

// Room opens a room by its room ID; ErrUnknownRoom if it was never imported.
func (s *Store) Room(ctx context.Context, roomID string) (*Room, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	coll := roomrecord.CollectionID(roomID)
	b, err := getKind(s.eng, coll, roomrecord.HeadRecordID, roomrecord.ReadOther)
	if errors.Is(err, packstore.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrUnknownRoom, roomID)
	}
	if err != nil {
		return nil, fmt.Errorf("roomstate: head of %s: %w", roomID, err)
	}
	h, err := s.decodeHead(coll, b)
	if err != nil {
		return nil, fmt.Errorf("room %s: %w", roomID, err)
	}
	if h.RoomID != roomID {
		return nil, fmt.Errorf("%w: head of collection for %s names room %s", roomrecord.ErrCorruptRecord, roomID, h.RoomID)
	}
	return s.newRoom(coll, h, b), nil
}

// decodeHead decodes the head record b of collection coll and reads the
// forward-extremity chunks it names (roomrecord.Head.ReadExtremityChunks). A
// chunk the head names that is not stored is corruption (ErrCorruptRecord), not
// packstore.ErrNotFound, so that it is not taken for a collection without a head.
func (s *Store) decodeHead(coll packstore.ID, b []byte) (roomrecord.Head, error) {
	h, err := roomrecord.DecodeHead(b)
	if err != nil {
		return h, err
	}
	err = h.ReadExtremityChunks(func(id packstore.ID) ([]byte, error) {
		return getKind(s.eng, coll, id, roomrecord.ReadOther)
	})
	if errors.Is(err, packstore.ErrNotFound) {
		err = fmt.Errorf("%w: %v", roomrecord.ErrCorruptRecord, err)
	}
	if err != nil {
		return roomrecord.Head{}, fmt.Errorf("head of room %s: %w", h.RoomID, err)
	}
	return h, nil
}

// Room is one room's view of the store. A Room caches its head and follows the
// room: after an Import or a StateWriter Commit through the same Store (by this handle or any
// other), the next Head, EventIDs, Graph, Check, RoomRecords, StateWriter or
// state query sees the new head, so a handle taken before an import replays the
// events it added (resolver.Replay). Writes by another Store or another process
// are not followed: take a new handle with Store.Room. Not safe for concurrent use.
type Room struct {
	s    *Store
	coll packstore.ID
	head roomrecord.Head
	// headRaw is the head record as last read or written (nil: not stored
	// yet): on engines several processes write (packstore.ConditionalPutter),
	// the next head write succeeds only if the stored head still is this.
	headRaw []byte
	gen     uint64 // the Store's head generation r.head is from
}

// refresh takes the room's newest head written through the Store, if it is newer
// than the cached one.
func (r *Room) refresh() {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if e, ok := r.s.heads[r.coll]; ok && e.gen != r.gen {
		r.head, r.headRaw, r.gen = e.head, e.raw, e.gen
	}
}

// ID returns the room ID.
func (r *Room) ID() string { return r.head.RoomID }

// Head returns the room's head record: the cached one, or the newer one an Import or
// StateWriter.Commit through the same Store wrote since.
func (r *Room) Head() roomrecord.Head {
	r.refresh()
	return r.head
}

// putWithHead writes recs and then the head h as one batch and caches h. On an
// engine several processes write, the batch is conditional on the stored head
// being the one this Room last read or wrote: if another writer changed it,
// nothing is written and the error wraps packstore.ErrConflict (open the room
// again and redo the work).
func (r *Room) putWithHead(recs []packstore.Record, h roomrecord.Head) error {
	raw := roomrecord.EncodeHead(&h)
	recs = append(recs, packstore.Record{ID: roomrecord.HeadRecordID, Data: raw})
	var err error
	if cp, ok := r.s.eng.(packstore.ConditionalPutter); ok {
		err = cp.PutManyIf(r.coll, recs, roomrecord.HeadRecordID, r.headRaw)
		if errors.Is(err, packstore.ErrConflict) {
			err = fmt.Errorf("the room head changed since this process read it (another process writes this room; rerun to continue from what it stored): %w", err)
		}
	} else {
		err = r.s.eng.PutMany(r.coll, recs)
	}
	if err != nil {
		return err
	}
	r.head, r.headRaw = h, raw
	r.gen = r.s.publish(r.coll, h, raw)
	return nil
}

// ReleaseMapped drops the store's file mappings from the process's resident set
// when the engine can (packstore PackfileStorage.ReleaseMapped); a no-op
// otherwise. Long scans call it now and then to bound their RSS.
func (r *Room) ReleaseMapped() error {
	if e, ok := r.s.eng.(interface{ ReleaseMapped() error }); ok {
		return e.ReleaseMapped()
	}
	return nil
}

// EventIDs returns every imported event ID in arrival order.
func (r *Room) EventIDs() ([]string, error) {
	r.refresh()
	ids := make([]string, 0, r.head.Events)
	for i := uint32(0); i < r.head.LogChunks; i++ {
		b, err := getKind(r.s.eng, r.coll, roomrecord.LogChunkID(i), roomrecord.ReadOther)
		if err != nil {
			return nil, fmt.Errorf("roomstate: room %s: arrival log chunk %d: %w", r.head.RoomID, i, err)
		}
		chunk, err := roomrecord.DecodeLogChunk(b)
		if err != nil {
			return nil, fmt.Errorf("room %s chunk %d: %w", r.head.RoomID, i, err)
		}
		ids = append(ids, chunk...)
	}
	if uint32(len(ids)) != r.head.Events {
		return nil, fmt.Errorf("%w: room %s: head says %d events, arrival log holds %d",
			roomrecord.ErrCorruptRecord, r.head.RoomID, r.head.Events, len(ids))
	}
	return packStrings(ids), nil
}

// packStrings makes every string of ids a substring of one string (the slice is
// changed in place and returned): a 1M-event room's IDs are then one object for
// the garbage collector to mark instead of a million, and the resolver keeps
// them for the room's lifetime.
func packStrings(ids []string) []string {
	var all strings.Builder
	n := 0
	for _, id := range ids {
		n += len(id)
	}
	all.Grow(n)
	for _, id := range ids {
		all.WriteString(id)
	}
	s, off := all.String(), 0
	for i, id := range ids {
		ids[i] = s[off : off+len(id)]
		off += len(id)
	}
	return ids
}

// EventJSON returns the PDU JSON of an event as it was imported.
func (r *Room) EventJSON(eventID string) ([]byte, error) {
	b, err := getKind(r.s.eng, r.coll, roomrecord.EventRecordID(eventID), roomrecord.ReadPDU)
	if err != nil {
		return nil, fmt.Errorf("roomstate: room %s: event %s: %w", r.head.RoomID, eventID, err)
	}
	id, js, err := roomrecord.DecodeEvent(b)
	if err != nil {
		return nil, fmt.Errorf("event %s: %w", eventID, err)
	}
	if id != eventID {
		return nil, fmt.Errorf("%w: record for event %s holds event %s", roomrecord.ErrCorruptRecord, eventID, id)
	}
	return js, nil
}

// Event loads and parses one PDU (redacted if its content hash fails).
func (r *Room) Event(eventID string) (gomatrixserverlib.PDU, error) {
	js, err := r.EventJSON(eventID)
	if err != nil {
		return nil, err
	}
	pd, err := pdu.Parse(r.version(), js)
	if err != nil {
		return nil, fmt.Errorf("room %s: stored event %s: %w", r.head.RoomID, eventID, err)
	}
	return pd, nil
}

// StoredEvent loads one PDU for reading, as Event does, but trusts what import
// checked: an event whose content hash passed at import (redacted false, as its
// metadata records) is parsed with its stored event ID, without recomputing the
// reference and content hashes (about half the cost of a parse). redacted true
// takes Event's path (the event is redacted again on parse).
func (r *Room) StoredEvent(eventID string, redacted bool) (pd gomatrixserverlib.PDU, err error) {
	if redacted {
		return r.Event(eventID)
	}
	js, err := r.EventJSON(eventID)
	if err != nil {
		return nil, err
	}
	if pd, err = pdu.ParseTrusted(r.version(), eventID, js); err != nil {
		return nil, fmt.Errorf("room %s: stored event %s: %w", r.head.RoomID, eventID, err)
	}
	return pd, nil
}

// Meta loads the metadata record of an event; an error names the event.
func (r *Room) Meta(eventID string) (roomrecord.EventMeta, error) {
	return r.meta(roomrecord.EventRecordID(eventID), func() string { return "event " + eventID })
}

// MetaByRecord loads the metadata record of the event whose record ID (= HAMT value)
// is ev. An error names the event: its ID, found by a search of the arrival
// log (EventIDs, one record ID computed per event, on the error path only),
// or the record ID when the log cannot be read or does not hold it.
func (r *Room) MetaByRecord(ev packstore.ID) (roomrecord.EventMeta, error) {
	return r.meta(ev, func() string { return r.recordName(ev) })
}

// recordName names the event whose record ID is ev for an error: "event $ID"
// when the arrival log names it, else "event record <ev>".
func (r *Room) recordName(ev packstore.ID) string {
	if ids, err := r.EventIDs(); err == nil {
		for _, id := range ids {
			if roomrecord.EventRecordID(id) == ev {
				return "event " + id
			}
		}
	}
	return "event record " + ev.String()
}

// meta loads the metadata record of event record ev; an error calls the event
// what().
func (r *Room) meta(ev packstore.ID, what func() string) (roomrecord.EventMeta, error) {
	b, err := getKind(r.s.eng, r.coll, roomrecord.MetaRecordID(ev), roomrecord.ReadMeta)
	if err != nil {
		return roomrecord.EventMeta{}, fmt.Errorf("roomstate: room %s: metadata of %s: %w", r.head.RoomID, what(), err)
	}
	m, err := roomrecord.DecodeMeta(b)
	if err != nil {
		return roomrecord.EventMeta{}, fmt.Errorf("room %s, metadata of %s: %w", r.head.RoomID, what(), err)
	}
	if roomrecord.EventRecordID(m.EventID) != ev {
		return roomrecord.EventMeta{}, fmt.Errorf("%w: room %s: metadata of %s names event %s", roomrecord.ErrCorruptRecord, r.head.RoomID, what(), m.EventID)
	}
	return m, nil
}

// CheckMeta loads the metadata record of event i of g (the room's graph,
// Graph) and compares it with the event's graph entry (roomrecord.Graph.DiffMeta;
// index: event ID -> arrival index), as Check does for every event. An error
// names the event.
func (r *Room) CheckMeta(g *roomrecord.Graph, i int, index func(eventID string) (int32, bool)) (roomrecord.EventMeta, error) {
	id := g.IDs[i]
	m, err := r.Meta(id)
	if err != nil {
		return m, err
	}
	if d := g.DiffMeta(i, &m, index); d != "" {
		return m, fmt.Errorf("%w: room %s: the graph record of event %s disagrees with its metadata: %s", roomrecord.ErrCorruptRecord, r.head.RoomID, id, d)
	}
	return m, nil
}

// EventState loads the state record of an event; ok is false before replay.
func (r *Room) EventState(eventID string) (st roomrecord.EventState, ok bool, err error) {
	b, err := getKind(r.s.eng, r.coll, roomrecord.StateRecordID(roomrecord.EventRecordID(eventID)), roomrecord.ReadOther)
	if errors.Is(err, packstore.ErrNotFound) {
		return roomrecord.EventState{}, false, nil
	}
	if err != nil {
		return roomrecord.EventState{}, false, &StateRecordError{RoomID: r.head.RoomID, EventID: eventID, Err: err}
	}
	st, err = roomrecord.DecodeState(b)
	if err != nil {
		return roomrecord.EventState{}, false, &StateRecordError{RoomID: r.head.RoomID, EventID: eventID, Err: err}
	}
	return st, true, nil
}

// StateRecordError is returned by EventState (and the state queries that read
// state records) when an event's state record exists but cannot be read or
// decoded: a corrupt frame, a record that does not decode, or a failed read.
// Replay with Force writes every state record again.
type StateRecordError struct {
	RoomID, EventID string
	Err             error // the read or decode error
}

// Error names the room and the event whose state record failed, and why.
func (e *StateRecordError) Error() string {
	return fmt.Sprintf("roomstate: room %s: state of event %s: %v", e.RoomID, e.EventID, e.Err)
}

// Unwrap returns the read or decode error (packstore.ErrCorrupt,
// roomrecord.ErrCorruptRecord, ...), for errors.Is.
func (e *StateRecordError) Unwrap() error { return e.Err }

// Errors of state queries (StateBefore, StateAfter, MembershipAt).
var (
	// ErrStateNotKept is returned for an event whose state record an every-k repack
	// dropped as garbage (Head.KeepsState; docs/library.md, repack). The
	// event, its PDU and its edges are stored; its snapshots are not. Replay
	// recomputes such a state in memory when a new event needs it; `mtxdb replay
	// --force` writes every state record again.
	ErrStateNotKept = errors.New("roomstate: state not kept (dropped by an every-k repack)")
	// ErrNoState is returned for an event of the room that has no state record
	// because it was not replayed yet or is an outlier (an ancestor never arrived).
	ErrNoState = errors.New("roomstate: event has no state")
)

// StateAfter is the snapshot after an event, as stored by replay. It is an error to
// ask before the event was replayed (ErrNoState), for an outlier (ErrNoState) and
// for an event whose state an every-k repack dropped (ErrStateNotKept).
func (r *Room) StateAfter(eventID string) (hamtstore.NodeID, error) {
	st, err := r.replayedState(eventID)
	return st.After, err
}

// replayedState is EventState for an event that must have been replayed.
func (r *Room) replayedState(eventID string) (roomrecord.EventState, error) {
	st, ok, err := r.EventState(eventID)
	if err != nil || ok {
		return st, err
	}
	m, err := r.Meta(eventID)
	if errors.Is(err, packstore.ErrNotFound) {
		return st, fmt.Errorf("roomstate: room %s: event %s is not in the room", r.head.RoomID, eventID)
	}
	if err != nil {
		return st, err
	}
	return st, r.stateGap(m)
}

// stateGap says why an event of the room has no state record: an outlier, not
// replayed yet, dropped by the keep rule (ErrStateNotKept), or damage
// (ErrCorruptRecord). It walks the event's ancestors (prev and auth events) through
// those without a state record: an ancestor missing from the room makes it an
// outlier; one that arrived after the keep rule was set means it was an outlier when
// the rule was set, so the rule did not drop its state.
// hasCycle reports whether the graph of parents (event ID -> parent IDs, every
// parent a key) has a cycle: Kahn's algorithm leaves some event unremoved.
func hasCycle(parents map[string][]string) bool {
	pending := make(map[string]int, len(parents))
	children := map[string][]string{}
	for x, ps := range parents {
		for _, p := range slices.Compact(slices.Sorted(slices.Values(ps))) {
			pending[x]++
			children[p] = append(children[p], x)
		}
	}
	var ready []string
	for x := range parents {
		if pending[x] == 0 {
			ready = append(ready, x)
		}
	}
	removed := 0
	for len(ready) > 0 {
		x := ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		removed++
		for _, c := range children[x] {
			if pending[c]--; pending[c] == 0 {
				ready = append(ready, c)
			}
		}
	}
	return removed < len(parents)
}

func (r *Room) stateGap(m roomrecord.EventMeta) error {
	r.refresh()
	h := r.head
	if !h.Replayed && h.StateEvery == 0 {
		return fmt.Errorf("%w: room %s: event %s: not replayed yet (replay first)", ErrNoState, h.RoomID, m.EventID)
	}
	late := m.Seq >= h.StateKeptBelow
	seen := map[string]bool{m.EventID: true}
	// The events without a state record that m descends from, with their parents
	// among them: a cycle there leaves m out of any topological order.
	parents := map[string][]string{m.EventID: nil}
	queue := []roomrecord.EventMeta{m}
	for len(queue) > 0 {
		x := queue[0]
		queue = queue[1:]
		for _, p := range slices.Concat(x.PrevEvents, x.AuthEvents) {
			if seen[p] {
				if _, stateless := parents[p]; stateless {
					parents[x.EventID] = append(parents[x.EventID], p)
				}
				continue
			}
			seen[p] = true
			pm, err := r.Meta(p)
			if errors.Is(err, packstore.ErrNotFound) {
				return fmt.Errorf("%w: room %s: event %s is an outlier (its ancestor %s never arrived)", ErrNoState, h.RoomID, m.EventID, p)
			}
			if err != nil {
				return err
			}
			if _, ok, err := r.EventState(p); err != nil {
				return err
			} else if !ok {
				late = late || pm.Seq >= h.StateKeptBelow
				queue = append(queue, pm)
				parents[x.EventID] = append(parents[x.EventID], p)
				parents[p] = nil
			}
		}
	}
	if hasCycle(parents) {
		return fmt.Errorf("%w: room %s: event %s is an outlier (it or an ancestor lies on a cycle of prev_events and auth_events)", ErrNoState, h.RoomID, m.EventID)
	}
	switch {
	case h.StateEvery > 0 && !late && !h.KeepsState(m):
		return fmt.Errorf("%w: room %s: event %s (every-%d repack)", ErrStateNotKept, h.RoomID, m.EventID, h.StateEvery)
	case !h.Replayed:
		return fmt.Errorf("%w: room %s: event %s: not replayed yet (replay first)", ErrNoState, h.RoomID, m.EventID)
	}
	return fmt.Errorf("%w: room %s: replayed, but event %s has no state record", roomrecord.ErrCorruptRecord, h.RoomID, m.EventID)
}

// NewReader returns a hamtstore reader over this room's snapshots.
func (r *Room) NewReader() *hamtstore.Reader { return hamtstore.NewReader(r.nodes()) }

// nodes is the node store of this room's state snapshots: HAMT nodes are records
// of the room's collection, record ID = node ID.
func (r *Room) nodes() hamtstore.NodeStore { return nodeStore{eng: r.s.eng, coll: r.coll} }

// Lookup returns the event ID at (event_type, state_key) in a snapshot: about depth
// node reads plus one metadata read.
func (r *Room) Lookup(rd *hamtstore.Reader, root hamtstore.NodeID, eventType, stateKey string) (string, bool, error) {
	v, ok, err := rd.Get(root, roomrecord.StateKey(eventType, stateKey))
	if err != nil || !ok {
		return "", false, err
	}
	m, err := r.MetaByRecord(packstore.ID(v))
	if err != nil {
		return "", false, err
	}
	return m.EventID, true, nil
}

// State returns a whole snapshot (a state before or after an event, or the
// current state: StateBefore, StateAfter, CurrentState) as (event_type,
// state_key) -> event ID. The key type is resolver.Key's (an alias of StatePair),
// so the result converts to a resolver.StateMap. It reads every node of the
// snapshot and one metadata record per entry (about 16 + 8 x depth bytes of
// node reads per entry), checking that each entry names a state event of its
// key (ErrCorruptRecord otherwise). To read one entry, Lookup is cheaper; to
// read many snapshots of one room, StateMemo. ctx is checked before the walk.
func (r *Room) State(ctx context.Context, rd *hamtstore.Reader, root hamtstore.NodeID) (map[roomrecord.StatePair]string, error) {
	return r.StateMemo(ctx, rd, root, EntryMemo{})
}

// EntryMemo remembers, for StateMemo, the checked snapshot entries of one room by
// record. The zero value is not usable: make one with EntryMemo{}.
type EntryMemo map[hamtstore.Value]memoEntry

type memoEntry struct {
	raw string // HAMT key
	key roomrecord.StatePair
	id  string // event ID
}

// StateMemo is State for reading many snapshots of one room: the event an entry
// names is looked up and checked once per memo (make one EntryMemo and pass it to
// every call), so the cost is a metadata read per distinct entry instead of per
// entry. Errors as State.
func (r *Room) StateMemo(ctx context.Context, rd *hamtstore.Reader, root hamtstore.NodeID, memo EntryMemo) (map[roomrecord.StatePair]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make(map[roomrecord.StatePair]string)
	err := rd.Iterate(root, func(k []byte, v hamtstore.Value) error {
		if m, ok := memo[v]; ok && m.raw == string(k) {
			out[m.key] = m.id
			return nil
		}
		m, err := r.snapshotEntry(k, v)
		if err != nil {
			return err
		}
		e := memoEntry{raw: string(k), key: roomrecord.StatePair{Type: m.Type, StateKey: m.StateKey}, id: m.EventID}
		memo[v] = e
		out[e.key] = e.id
		return nil
	})
	return out, err
}

// snapshotEntry returns the metadata of the event a snapshot entry names, checking
// that it is a state event of the entry's key.
func (r *Room) snapshotEntry(k []byte, v hamtstore.Value) (roomrecord.EventMeta, error) {
	t, sk, err := roomrecord.SplitStateKey(k)
	if err != nil {
		return roomrecord.EventMeta{}, err
	}
	m, err := r.MetaByRecord(packstore.ID(v))
	if err != nil {
		return roomrecord.EventMeta{}, err
	}
	if m.Type != t || m.StateKey != sk || !m.IsState {
		return roomrecord.EventMeta{}, fmt.Errorf("%w: room %s: snapshot key (%q, %q) names event %s of (%q, %q)",
			roomrecord.ErrCorruptRecord, r.head.RoomID, t, sk, m.EventID, m.Type, m.StateKey)
	}
	return m, nil
}

// RoomRecords returns the IDs of the room-level records: the head, the
// forward-extremity chunks it names, then the arrival log chunks in order, each
// followed by its graph record when the room has them (a room imported before
// graph records existed has none; a failure to read the first is taken as
// present, so that a repack meets it and reports it).
func (r *Room) RoomRecords() []packstore.ID {
	r.refresh()
	ids := []packstore.ID{roomrecord.HeadRecordID}
	for _, c := range r.head.ExtremityChunks {
		ids = append(ids, c.ID)
	}
	has, err := r.hasGraphRecords()
	for i := uint32(0); i < r.head.LogChunks; i++ {
		ids = append(ids, roomrecord.LogChunkID(i))
		if has || err != nil {
			ids = append(ids, roomrecord.GraphChunkID(i))
		}
	}
	return ids
}

// nodeStore stores HAMT nodes as records of one collection.
type nodeStore struct {
	eng  packstore.StorageEngine
	coll packstore.ID
}

func (n nodeStore) GetNode(id hamtstore.NodeID) ([]byte, error) {
	return getKind(n.eng, n.coll, packstore.ID(id), roomrecord.ReadNode)
}

func (n nodeStore) PutNodes(nodes []hamtstore.EncodedNode) error {
	if len(nodes) == 0 {
		return nil
	}
	recs := make([]packstore.Record, len(nodes))
	for i, nd := range nodes {
		recs[i] = packstore.Record{ID: packstore.ID(nd.ID), Data: nd.Data, Dense: true}
	}
	return n.eng.PutMany(n.coll, recs)
}

// StateBefore is the snapshot before an event (the state the event was authorised
// against), as stored by replay; errors as StateAfter.
func (r *Room) StateBefore(eventID string) (hamtstore.NodeID, error) {
	st, err := r.replayedState(eventID)
	return st.Before, err
}

// version is the room version from the room's m.room.create.
func (r *Room) version() gomatrixserverlib.RoomVersion {
	return gomatrixserverlib.RoomVersion(r.head.RoomVersion)
}
