// Package resolver computes room state from stored snapshots: the state before an
// event is the resolution of the states after its prev_events, and each event is
// authorised against it (Matrix spec v1.19, each room version's "State resolution"
// and "Authorisation rules": state resolution v1, v2 and v2.1).
//
// State resolution v2 and v2.1 (room versions 2-12) are implemented here, after the
// spec; gomatrixserverlib supplies PDU parsing and power-level parsing, package
// authrules the authorization rules. Resolution over stored snapshots costs what the conflict
// costs: the conflicted keys come from the HAMT N-way diff, which never opens a
// subtree that all snapshots share; only conflicted events, their auth chains and
// the unconflicted entries the authorization rules ask for are loaded. Room version 1
// uses gomatrixserverlib's v1 algorithm with the spec's v1 split.
//
// The auth difference (the union of the states' full auth chains minus their
// intersection) is computed without walking the whole state: a state's full auth
// chain is that of the unconflicted map plus that of its own conflicted events, so
// only events in the chains of conflicted events are candidates, and a candidate
// missing from some state's conflicted chains is in the difference unless an
// unconflicted event descends from it. That last test walks auth_events edges
// forward from the candidate through the room's auth index (built once per replay
// from the graph records) until it meets an event of the unconflicted map.
//
// The entry points, by where the events are:
//
//   - in a roomstate store: Replay computes and stores the state before and after
//     every event of a room; ResolveForwardExtremities measures one resolution of
//     the room's current forward extremities.
//   - anywhere, as whole state maps: ResolveMaps, the reference path, which reads
//     every event of every map.
//   - anywhere, as the conflicted part of the states plus an auth index:
//     ResolveConflicts, and AuthGraph.ResolveWithGraph for a room whose DAG is held
//     as a roomrecord.Graph (a server's own tables).
//
// Replay and ResolveForwardExtremities read and write the store and take a
// context.Context first: Replay checks it before each event and before each
// resolution it computes, ResolveForwardExtremities before its resolution
// (roomstate's package doc, "Contexts", says which roomstate calls take one).
package resolver

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/mtxdb/mtxdb/pdu"

	"github.com/mtxdb/mtxdb/roomrecord"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomstate"
)

// ErrResolution is returned (wrapped, naming the room and events) when state
// resolution cannot run: a snapshot names an event that cannot be loaded, auth
// events form a cycle, or gomatrixserverlib panicked.
var ErrResolution = errors.New("resolver: state resolution failed")

// Stats counts what state resolution cost: summed over the resolutions of a
// replay (ReplayResult), or for one resolution (ResolutionStats, Resolution:
// Resolutions is 1).
type Stats struct {
	Resolutions    int // resolutions of two or more distinct states
	ConflictedKeys int // keys not equal in every input state, summed over resolutions
	AuthDifference int // events in auth differences, summed over resolutions
	FullConflicted int // events in full conflicted sets, summed over resolutions
	// EventsLoaded counts PDUs read from the store and parsed while what is counted
	// ran: in a replay, authorisation's and the parsing ahead of the replay
	// included (the room's event count when every PDU is parsed once, more when
	// the bounded cache no longer holds a PDU asked again); 0 from
	// ResolveConflicts, which reads its EventSource.
	EventsLoaded int
}

// ResolutionStats is what one resolution of two or more distinct stored states
// cost (ReplayOptions.OnResolve): Stats with Resolutions 1, and what only one
// resolution measures.
type ResolutionStats struct {
	Stats
	InputStates   int           // distinct input states
	EventsTouched int           // distinct events whose PDU the resolution used (cached or loaded)
	NodesRead     int           // HAMT nodes read from the store
	Duration      time.Duration // wall time
}

// roomResolver resolves and authorises events of one room. It caches parsed PDUs (a
// bounded LRU) and, from first use, the room's dense auth index (graph: ~250 bytes
// per event) for its lifetime. Not safe for concurrent use.
type roomResolver struct {
	room *roomstate.Room
	rd   *hamtstore.Reader
	// w writes the states resolutions compute (rd is its reader).
	w    *roomstate.StateWriter
	algo gomatrixserverlib.StateResAlgorithm
	pdus *lru.Cache[string, gomatrixserverlib.PDU] // parsed state PDUs but those in others, bounded
	// others are the parsed create, power levels, join rules and third-party
	// invite events, bounded apart: they are auth events of most events and the
	// rules read their content, while the member events that come and go by the
	// hundred thousand in a large room pushed them out of one shared cache.
	others *lru.Cache[string, gomatrixserverlib.PDU]
	// cur is the last non-state PDU parsed (the event being replayed, usually): a
	// message is read once, to authorise it, and no auth chain or resolution
	// reads it again, so non-state PDUs stay out of the LRU, where they pushed
	// out the member events authorisation asks for again (65% of a generated
	// room's events are not state events).
	cur gomatrixserverlib.PDU
	// ahead is what the prefetcher handed over for the event being replayed.
	ahead prefetched
	// aheadUsed counts the outcomes taken from the prefetcher.
	aheadUsed int
	g         *graph // the room's auth index, built on first use
	// rej is the rejection status per graph index: 0 not known yet (read the
	// state record), 1 accepted, 2 rejected.
	rej []uint8
	// upTo is, during Replay, the replay position of the last event replayed: auth
	// children not replayed yet are left out (they are in no state being resolved).
	upTo   int32
	create gomatrixserverlib.PDU
	cache  *Cache
	// memo: resolved snapshot by the sorted set of input snapshots (a snapshot is
	// content-addressed, so a set always resolves to the same root). Most events
	// that change no state share the state before them, so merges repeat sets.
	memo map[string]hamtstore.NodeID
	// What eventHead gives of each state event parsed so far (eventhead.go;
	// empty when the room ID does not parse).
	headTable
	roomID *spec.RoomID
	// keyMemo is the unconflicted-event memo of the current resolution (resView).
	keyMemo keyMemo
	// cursors hold the state snapshots lookups were last asked of (cursor.go).
	cursors cursorSet

	// onResolve, if set, is called after each resolution of two or more distinct
	// snapshots with what it cost.
	onResolve func(ResolutionStats)
	// touch counts the events the current resolution uses while onResolve is set.
	touch touchCount
	// resolutionTimes, if set, receives the wall time of every resolution computed
	// (not answered from the memo).
	resolutionTimes *[]time.Duration

	// stats sums what the resolutions cost, and every PDU loaded.
	stats Stats
}

// touchCount counts the distinct events (by graph index) one resolution uses:
// an event is counted when its stamp is not the current resolution's epoch.
type touchCount struct {
	on    bool     // a resolution is being counted
	epoch uint32   // the current resolution's stamp, from 1
	at    []uint32 // per graph index, the epoch in which it was last counted
	n     int      // events counted in the current epoch
}

// start begins counting one resolution over a graph of size events.
func (t *touchCount) start(size int) {
	if len(t.at) != size {
		t.at, t.epoch = make([]uint32, size), 0
	}
	if t.epoch++; t.epoch == 0 { // wrapped: every stamp may look current
		clear(t.at)
		t.epoch = 1
	}
	t.on, t.n = true, 0
}

// mark counts event i once per resolution.
func (t *touchCount) mark(i int32) {
	if t.at[i] != t.epoch {
		t.at[i] = t.epoch
		t.n++
	}
}

// markID counts an event by ID (while touch.on).
func (r *roomResolver) markID(eventID string) {
	if _, i, err := r.index(eventID); err == nil {
		r.touch.mark(i)
	}
}

const (
	rejUnknown uint8 = iota
	rejAccepted
	rejRejected
)

// newRoomResolver returns a resolver for room. It fails for a room version gomatrixserverlib does
// not know.
func newRoomResolver(room *roomstate.Room) (*roomResolver, error) {
	verImpl, err := gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersion(room.Head().RoomVersion))
	if err != nil {
		return nil, fmt.Errorf("%w: room %s: %q", pdu.ErrUnknownRoomVersion, room.ID(), room.Head().RoomVersion)
	}
	pdus, err := lru.New[string, gomatrixserverlib.PDU](pduCacheSize)
	if err != nil {
		return nil, err
	}
	others, err := lru.New[string, gomatrixserverlib.PDU](otherCacheSize)
	if err != nil {
		return nil, err
	}
	w := room.StateWriter(false)
	return &roomResolver{
		room:   room,
		rd:     w.Reader(),
		w:      w,
		algo:   verImpl.StateResAlgorithm(),
		pdus:   pdus,
		others: others,
		cache:  NewCache(),
		memo:   map[string]hamtstore.NodeID{},
	}, nil
}

// pduCacheSize bounds the parsed PDUs a roomResolver keeps (a parsed PDU is about
// 0.7-1.5 KB: 708 bytes of heap for a generated member event, 751 bytes of
// JSON, and two dozen objects for the collector to mark). A member event the
// cache let go is an auth event or an event being sorted in the lighter form
// eventHead instead, and is not parsed again. The collector's marking grows with
// the size: 125,000 entries (a 1M-event room's 100,000 members) tripled it
// against 20,000 for no gain in wall time; 5,000 entries, with the prefetcher's
// 4,096 members (prefetchMembers), took the 1M-event replay's collections
// under a 900 MiB limit from 23.0 to 15.9 s of CPU against 20,000 and 16,384.
const pduCacheSize = 5_000

// otherCacheSize bounds roomResolver.others. A generated 1M-event room has 4,760
// power levels and 3,916 join rules events.
const otherCacheSize = 8192

// testPDUCache, if above 0, is the PDU cache size once the auth index is loaded
// (set by tests, SetPDUCacheSize, to make every auth event a cache miss).
var testPDUCache int

// maxResolveMemo bounds roomResolver.memo (an entry is ~50-100 bytes).
const maxResolveMemo = 1 << 16

// writeInMemory makes resolutions keep the nodes of the states they compute in
// memory over the room's stored ones, for resolving over a store opened
// read-only (the walks of mtxdb stats --reads). Call it before the first
// resolution.
func (r *roomResolver) writeInMemory() {
	r.w = r.room.StateWriter(true)
	r.rd = r.w.Reader()
}

// graph returns the room's auth index, loading it on first use.
func (r *roomResolver) graph() (*graph, error) {
	if r.g == nil {
		g, err := newGraph(r.room)
		if err != nil {
			return nil, err
		}
		r.g, r.rej = g, make([]uint8, len(g.ids))
		if r.roomID, _ = spec.NewRoomID(r.room.ID()); r.roomID != nil {
			r.headTable = newHeadTable(len(g.ids))
		}
		if testPDUCache > 0 {
			r.pdus.Resize(testPDUCache)
			r.others.Resize(testPDUCache)
		}
	}
	return r.g, nil
}

// index returns the graph index of an event of the room.
func (r *roomResolver) index(eventID string) (*graph, int32, error) {
	g, err := r.graph()
	if err != nil {
		return nil, 0, err
	}
	i, err := g.idx(eventID)
	return g, i, err
}

// Event implements EventSource over the room's stored PDUs.
func (r *roomResolver) Event(eventID string) (gomatrixserverlib.PDU, error) { return r.pdu(eventID) }

// Rejected implements EventSource: the event's rejection as replay recorded it.
func (r *roomResolver) Rejected(eventID string) bool {
	_, i, err := r.index(eventID)
	return err == nil && r.rejectedAt(i)
}

// rejectedAt is Rejected by graph index.
func (r *roomResolver) rejectedAt(i int32) bool {
	if r.rej[i] == rejUnknown {
		st, ok, err := r.room.EventState(r.g.ids[i])
		r.rej[i] = rejAccepted
		if err == nil && ok && st.Rejected {
			r.rej[i] = rejRejected
		}
	}
	return r.rej[i] == rejRejected
}

func (r *roomResolver) setRejected(i int32, rejected bool) {
	r.rej[i] = rejAccepted
	if rejected {
		r.rej[i] = rejRejected
	}
}

func (r *roomResolver) pdu(eventID string) (gomatrixserverlib.PDU, error) {
	if r.touch.on {
		r.markID(eventID)
	}
	if p, ok := r.cached(eventID); ok {
		return p, nil
	}
	redacted := true // unknown: parse and check as at import
	if g, i, err := r.index(eventID); err == nil {
		redacted = g.g.Redacted[i]
	}
	p, err := r.room.StoredEvent(eventID, redacted)
	if err != nil {
		return nil, err
	}
	r.stats.EventsLoaded++
	r.keep(p, nil)
	return p, nil
}

// keep caches a parsed PDU: a non-state event in cur, an auth event whose content
// the rules read (create, power levels, join rules, third-party invite) in others,
// another state event in pdus.
func (r *roomResolver) keep(p gomatrixserverlib.PDU, f *headFacts) {
	r.learn(p, f)
	switch {
	case p.StateKey() == nil:
		r.cur = p
	case p.Type() != spec.MRoomMember && authTypes[p.Type()]:
		r.others.Add(p.EventID(), p)
	default:
		r.pdus.Add(p.EventID(), p)
	}
}

// holds reports whether the resolver caches the parsed PDU of an event.
func (r *roomResolver) holds(eventID string) bool {
	return r.cur != nil && r.cur.EventID() == eventID || r.pdus.Contains(eventID) || r.others.Contains(eventID)
}

// eventIDOf returns the event a snapshot value names.
func (r *roomResolver) eventIDOf(v hamtstore.Value) (string, error) {
	g, err := r.graph()
	if err != nil {
		return "", err
	}
	if i, ok := g.byRecord.find(packstore.ID(v)); ok {
		return g.ids[i], nil
	}
	m, err := r.room.MetaByRecord(packstore.ID(v))
	if err != nil {
		return "", err
	}
	return m.EventID, nil
}

// authChain returns the union of the auth chains of the given events, read from
// the auth index, not PDUs.
func (r *roomResolver) authChain(eventIDs []string) (map[string]bool, error) {
	w := &reachWalk{next: r.AuthEvents, seen: map[string]bool{}, stack: slices.Clone(eventIDs)}
	for !w.done() {
		if err := w.step(); err != nil {
			return nil, err
		}
	}
	return w.seen, nil
}

// authTypes are the state types the authorization rules read.
var authTypes = map[string]bool{
	spec.MRoomCreate:           true,
	spec.MRoomPowerLevels:      true,
	spec.MRoomJoinRules:        true,
	spec.MRoomMember:           true,
	spec.MRoomThirdPartyInvite: true,
}

// conflict is one conflicted key with the event each snapshot gives it ("" where a
// snapshot lacks it).
type conflict struct {
	key    []byte
	k      Key
	events []string // per root
}

// resolveSnapshots returns the snapshot that resolves the given snapshots for this room's
// version; equal inputs short-circuit without reading anything. The result is
// written to the room's node store. ctx is checked before a resolution is
// computed (not within one).
func (r *roomResolver) resolveSnapshots(ctx context.Context, roots []hamtstore.NodeID) (hamtstore.NodeID, error) {
	uniq := uniqueRoots(roots)
	switch len(uniq) {
	case 0:
		return hamtstore.EmptyRoot, nil
	case 1:
		return uniq[0], nil
	}
	memoKey := rootSetKey(uniq)
	if root, ok := r.memo[memoKey]; ok {
		return root, nil
	}
	if err := ctx.Err(); err != nil {
		return hamtstore.NodeID{}, err
	}
	start := time.Now()
	root, err := r.resolve(ctx, uniq)
	if err != nil {
		return root, err
	}
	if r.resolutionTimes != nil {
		*r.resolutionTimes = append(*r.resolutionTimes, time.Since(start))
	}
	if len(r.memo) >= maxResolveMemo {
		clear(r.memo)
	}
	r.memo[memoKey] = root
	return root, nil
}

// rootSetKey names a set of snapshots: their IDs, sorted, concatenated.
func rootSetKey(roots []hamtstore.NodeID) string {
	s := slices.Clone(roots)
	slices.SortFunc(s, func(a, b hamtstore.NodeID) int { return bytes.Compare(a[:], b[:]) })
	b := make([]byte, 0, len(s)*len(hamtstore.NodeID{}))
	for _, x := range s {
		b = append(b, x[:]...)
	}
	return string(b)
}

// resolve resolves two or more distinct snapshots.
func (r *roomResolver) resolve(ctx context.Context, uniq []hamtstore.NodeID) (hamtstore.NodeID, error) {
	if r.onResolve != nil {
		g, err := r.graph()
		if err != nil {
			return hamtstore.NodeID{}, err
		}
		start, before, nodes := time.Now(), r.stats, r.rd.NodesRead()
		r.touch.start(len(g.ids))
		defer func() {
			r.touch.on = false
			now := r.stats
			one := Stats{Resolutions: 1, ConflictedKeys: now.ConflictedKeys - before.ConflictedKeys,
				AuthDifference: now.AuthDifference - before.AuthDifference,
				FullConflicted: now.FullConflicted - before.FullConflicted, EventsLoaded: now.EventsLoaded - before.EventsLoaded}
			r.onResolve(ResolutionStats{Stats: one, InputStates: len(uniq), EventsTouched: r.touch.n,
				NodesRead: r.rd.NodesRead() - nodes, Duration: time.Since(start)})
		}()
	}
	r.stats.Resolutions++
	var conflicts []conflict
	err := r.rd.DiffN(uniq, func(key []byte, vals []*hamtstore.Value) error {
		t, sk, err := roomrecord.SplitStateKey(key)
		if err != nil {
			return err
		}
		c := conflict{key: append([]byte(nil), key...), k: Key{Type: t, StateKey: sk}, events: make([]string, len(vals))}
		for i, v := range vals {
			if v != nil {
				if c.events[i], err = r.eventIDOf(*v); err != nil {
					return err
				}
			}
		}
		conflicts = append(conflicts, c)
		return nil
	})
	if err != nil {
		return hamtstore.NodeID{}, fmt.Errorf("%w: room %s: diff of %d states: %w", ErrResolution, r.room.ID(), len(uniq), err)
	}
	r.stats.ConflictedKeys += len(conflicts)

	var ch stateChanges
	if r.algo == gomatrixserverlib.StateResV1 {
		ch, err = r.resolveV1(uniq[0], conflicts)
	} else {
		ch, err = r.resolveV2(uniq, conflicts)
	}
	if err != nil {
		return hamtstore.NodeID{}, err
	}
	// Start from any input state: its unconflicted entries are those of every state.
	root, err := r.w.Apply(ctx, uniq[0], ch.set, ch.del)
	if err != nil {
		return hamtstore.NodeID{}, fmt.Errorf("resolver: room %s: write resolved state: %w", r.room.ID(), err)
	}
	r.applied(uniq[0], root, ch.set, ch.del)
	return root, nil
}

// resolveV2 resolves the conflicted keys by state resolution v2 or v2.1 and returns
// the changes to apply to base (one of the input snapshots).
func (r *roomResolver) resolveV2(roots []hamtstore.NodeID, conflicts []conflict) (stateChanges, error) {
	base := roots[0]
	in := ConflictInput{PerState: make([][]string, len(roots)), Cache: r.cache}
	conflictedKey := make(map[Key]bool, len(conflicts))
	for _, c := range conflicts {
		conflictedKey[c.k] = true
		for i, id := range c.events {
			if id != "" {
				in.PerState[i] = append(in.PerState[i], id)
			}
		}
	}
	in.Unconflicted = func(k Key) (string, bool, error) {
		if conflictedKey[k] {
			return "", false, nil
		}
		return r.lookup(base, k)
	}
	var err error
	if in.Create, err = r.createEvent(base); err != nil {
		return stateChanges{}, err
	}
	g, err := r.graph()
	if err != nil {
		return stateChanges{}, err
	}
	r.keyMemo.reset(len(g.keys))
	for k := range conflictedKey {
		if ki, ok := g.keyIdx(k); ok {
			r.keyMemo.set(ki, -1) // no unconflicted event
		}
	}
	if _, err := r.stateAt(base); err != nil && !errors.Is(err, errCursorFar) {
		return stateChanges{}, err
	}
	cur := r.cursors.at(base)
	view := &resView{g: g, upTo: r.upTo, memo: &r.keyMemo, unconflicted: func(k int32) (int32, bool, error) {
		// Conflicted keys are in the memo already; the others are the base's.
		if cur != nil && cur.valid && cur.root == base && cur.val[k] != cursorElsewhere {
			x := cur.val[k]
			return x, x >= 0, nil
		}
		v, ok, err := r.rd.Get(base, g.keyBytes(k))
		if err != nil || !ok {
			return -1, false, err
		}
		return r.graphIndexOf(g, v)
	}}
	res, err := ResolveConflicts(in, r, view)
	if err == nil {
		err = view.err
	}
	if err != nil {
		return stateChanges{}, fmt.Errorf("room %s: %w", r.room.ID(), err)
	}
	r.stats.AuthDifference += res.AuthDifference
	r.stats.FullConflicted += res.FullConflicted
	return stateChanges{set: res.Set, del: res.Delete}, nil
}

// stateChanges is what a resolution changes in the state it starts from: the
// keys it sets, to their event IDs, and those it deletes.
type stateChanges struct {
	set StateMap
	del []Key
}

// AuthOrder implements GraphSource with the event's auth depth: 0 for an event
// without auth events, otherwise one more than the deepest of its auth events
// (computed from the auth index and kept for the resolver's lifetime). It fails
// for an event not in the room or whose auth chain has a cycle.
func (r *roomResolver) AuthOrder(eventID string) (int64, error) {
	g, i, err := r.index(eventID)
	if err != nil {
		return 0, err
	}
	return g.authDepth(i)
}

// AuthEvents implements GraphSource from the auth index.
func (r *roomResolver) AuthEvents(eventID string) ([]string, error) {
	g, i, err := r.index(eventID)
	if err != nil {
		return nil, err
	}
	return g.authIDs(i), nil
}

// AuthChildren implements GraphSource: the state events that cite eventID in their
// auth_events, from the auth index. Non-state events are left out: nothing may
// cite them as auth events, so they lead to no event of a state. During a replay,
// events not replayed yet are left out too (they are in no state being resolved).
// The returned slice must not be modified.
func (r *roomResolver) AuthChildren(eventID string) ([]string, error) {
	g, i, err := r.index(eventID)
	if err != nil {
		return nil, err
	}
	return g.children(i, r.upTo), nil
}

// mainlineClosest answers mainline ordering's question in O(log): the position on
// the mainline of power levels event pl (oldest = 1) of the closest mainline event
// of x (x itself if a power levels event on it, else the first event reached
// through the power levels among auth events that is on it), 0 when none is (Matrix
// spec v1.19, room version 2, "State resolution", "Mainline ordering"). The
// mainline is pl's same-key lineage, so the closest mainline event of a power
// levels event is where their lineages meet.
func (r *roomResolver) mainlineClosest(pl, x string) (int64, error) {
	g, i, err := r.index(pl)
	if err != nil {
		return 0, err
	}
	j, err := g.idx(x)
	if err != nil {
		return 0, err
	}
	plKey := Key{Type: spec.MRoomPowerLevels, StateKey: ""}
	if k := g.keyOf(i); k < 0 || g.keys[k] != plKey {
		return 0, nil
	}
	if k := g.keyOf(j); k < 0 || g.keys[k] != plKey {
		id, err := r.powerLevelsAuthEvent(x)
		if err != nil || id == "" {
			return 0, err
		}
		if j, err = g.idx(id); err != nil {
			return 0, err
		}
	}
	m := g.lineageMeet(j, i)
	if m < 0 {
		return 0, nil
	}
	return int64(g.link(m).sdepth) + 1, nil
}

// powerLevelsAuthEvent returns the m.room.power_levels ("" state key) among an
// event's auth_events, "" for none, from the auth index (the first in auth_events
// order, as gomatrixserverlib's reading of the PDU gives it).
func (r *roomResolver) powerLevelsAuthEvent(eventID string) (string, error) {
	g, i, err := r.index(eventID)
	if err != nil {
		return "", err
	}
	for j, a := range g.g.Auth(int(i)) {
		if a < 0 {
			return "", fmt.Errorf("%w: event %s: auth event %s is not in the room", errNoEvent, eventID, g.g.MissingAuth(int(i), j))
		}
		if k := g.keyOf(a); k >= 0 && g.keys[k] == (Key{Type: spec.MRoomPowerLevels, StateKey: ""}) {
			return g.ids[a], nil
		}
	}
	return "", nil
}

// resView is the AuthIndex of one resolution's auth difference. It answers as the
// room's auth index does, except where it knows an event z to be a same-key
// ancestor of the unconflicted state event u of z's key (z = u, or z reached from u
// through the auth event with u's key: previous power levels, a member's previous
// membership): such a z is u or in u's auth chain, so in every state's full auth
// chain.
//
//   - AuthEvents(z) is empty: the walk includes z but does not go on through it.
//     The difference stays the same: an event x outside that closure is reached by
//     the same paths (a path through z would make x an ancestor of u), and an event
//     strictly inside it is left out of the difference by ResolveConflicts either
//     way (u descends from it), while z itself is still reached wherever it was.
//   - AuthChildren(z), for z != u, is [u]: the only question asked of it is whether
//     an event of the unconflicted map descends from z, and u is one.
//
// Without this every resolution walks the room's power-levels and membership
// histories, which grow with the room. Same-key ancestry is answered by jump
// pointers (graph.sameKeyAncestor) in O(log lineage).
type resView struct {
	g *graph
	// upTo is the replay position auth children are restricted to (graph.childHandles;
	// ignored when the graph has no replay positions).
	upTo int32
	// unconflicted returns the unconflicted state event (graph index) of a key
	// (graph.keys index), if the unconflicted state map has the key.
	unconflicted func(k int32) (int32, bool, error)
	memo         *keyMemo // unconflicted's answers in this resolution
	err          error    // the first failed unconflicted lookup (reported after the walk)
}

// unconflictedOf returns the unconflicted state event with i's key, if any.
func (v *resView) unconflictedOf(i int32) (int32, bool) {
	k := v.g.keyOf(i)
	if k < 0 {
		return 0, false
	}
	u, ok := v.memo.get(k)
	if !ok {
		var found bool
		var err error
		u, found, err = v.unconflicted(k)
		if err != nil && v.err == nil {
			v.err = err
		}
		if !found || err != nil {
			u = -1
		}
		v.memo.set(k, u)
	}
	return u, u >= 0
}

// keyMemo maps key indexes to event indexes (-1 for none) for one resolution,
// in epoch-stamped arrays of the room's key count, reused by the next
// resolution after an epoch increment instead of a map per resolution.
type keyMemo struct {
	epoch uint32
	stamp []uint32
	val   []int32
}

// reset starts a new resolution's memo over n keys.
func (m *keyMemo) reset(n int) {
	if len(m.stamp) < n {
		m.stamp, m.val = make([]uint32, n), make([]int32, n)
		m.epoch = 0
	}
	m.epoch++
	if m.epoch == 0 { // wrapped: old stamps could match again
		clear(m.stamp)
		m.epoch = 1
	}
}

func (m *keyMemo) get(k int32) (int32, bool) {
	if m.stamp[k] != m.epoch {
		return 0, false
	}
	return m.val[k], true
}

func (m *keyMemo) set(k, u int32) { m.stamp[k], m.val[k] = m.epoch, u }

// Handle implements AuthIndex: the graph index.
func (v *resView) Handle(eventID string) (int32, error) { return v.g.idx(eventID) }

// ID implements AuthIndex.
func (v *resView) ID(h int32) string { return v.g.ids[h] }

// AuthEventsOf implements AuthIndex (see resView).
func (v *resView) AuthEventsOf(h int32) []int32 {
	if u, ok := v.unconflictedOf(h); ok && v.g.sameKeyAncestor(h, u) {
		return nil
	}
	return v.g.g.Auth(int(h))
}

// AuthChildrenOf implements AuthIndex (see resView).
func (v *resView) AuthChildrenOf(h int32) []int32 {
	if u, ok := v.unconflictedOf(h); ok && u != h && v.g.sameKeyAncestor(h, u) {
		return []int32{u}
	}
	return v.g.childHandles(h, v.upTo)
}

// Len implements AuthIndex: the room's events.
func (v *resView) Len() int { return len(v.g.ids) }

// UnconflictedOf implements AuthIndex (a failed lookup is kept in v.err and
// answers "none").
func (v *resView) UnconflictedOf(h int32) (int32, bool) { return v.unconflictedOf(h) }

// SameKeyAncestor implements AuthIndex by jump pointers (graph.sameKeyAncestor).
func (v *resView) SameKeyAncestor(z, u int32) bool { return v.g.sameKeyAncestor(z, u) }

// SameKeyDepth implements AuthIndex.
func (v *resView) SameKeyDepth(h int32) int32 { return v.g.link(h).sdepth }

// SameKeyAncestorAt implements AuthIndex (graph.climb).
func (v *resView) SameKeyAncestorAt(h, d int32) int32 { return v.g.climb(h, d) }

// StateKeyOfHandle implements AuthIndex.
func (v *resView) StateKeyOfHandle(h int32) (Key, bool) {
	if k := v.g.keyOf(h); k >= 0 {
		return v.g.keys[k], true
	}
	return Key{}, false
}

// createEvent returns the room's m.room.create, from a snapshot or else the arrival
// log's first event.
func (r *roomResolver) createEvent(root hamtstore.NodeID) (gomatrixserverlib.PDU, error) {
	if r.create != nil {
		return r.create, nil
	}
	id, ok, err := r.lookup(root, Key{Type: spec.MRoomCreate, StateKey: ""})
	if err != nil {
		return nil, err
	}
	if !ok {
		ids, err := r.room.EventIDs()
		if err != nil {
			return nil, err
		}
		if len(ids) == 0 {
			return nil, fmt.Errorf("%w: room %s has no events", ErrResolution, r.room.ID())
		}
		id = ids[0]
	}
	p, err := r.pdu(id)
	if err != nil {
		return nil, err
	}
	if p.Type() != spec.MRoomCreate {
		return nil, fmt.Errorf("%w: room %s: no m.room.create found", ErrResolution, r.room.ID())
	}
	r.create = p
	return p, nil
}

// resolveV1 resolves by gomatrixserverlib's v1 algorithm: a key the states give one
// event (present in some, absent in others) keeps it; keys with two or more events
// are resolved against the unconflicted auth state and the conflicted events' auth
// chains.
func (r *roomResolver) resolveV1(base hamtstore.NodeID, conflicts []conflict) (stateChanges, error) {
	changes := stateChanges{set: StateMap{}}
	var conflicted, single []gomatrixserverlib.PDU
	var conflictedIDs []string
	conflictedKey := map[string]bool{}
	for _, c := range conflicts {
		distinct := map[string]bool{}
		for _, id := range c.events {
			if id != "" {
				distinct[id] = true
			}
		}
		ids := sortedIDs(distinct)
		if len(ids) == 1 {
			// One event for the key (the others lack it): no conflict in v1, so
			// it is in R, and the rules read it when it is an auth type.
			changes.set[c.k] = ids[0]
			if authTypes[c.k.Type] {
				p, err := r.pdu(ids[0])
				if err != nil {
					return stateChanges{}, fmt.Errorf("%w: room %s: %v", ErrResolution, r.room.ID(), err)
				}
				single = append(single, p)
			}
			continue
		}
		conflictedKey[string(c.key)] = true
		for _, id := range ids {
			p, err := r.pdu(id)
			if err != nil {
				return stateChanges{}, fmt.Errorf("%w: room %s: %v", ErrResolution, r.room.ID(), err)
			}
			conflicted = append(conflicted, p)
			conflictedIDs = append(conflictedIDs, id)
		}
	}
	if len(conflicted) == 0 {
		return changes, nil
	}
	chain, err := r.authChain(conflictedIDs)
	if err != nil {
		return stateChanges{}, fmt.Errorf("%w: room %s: auth chain: %v", ErrResolution, r.room.ID(), err)
	}
	var auth []gomatrixserverlib.PDU
	for _, id := range sortedIDs(chain) {
		p, err := r.pdu(id)
		if err != nil {
			return stateChanges{}, fmt.Errorf("%w: room %s: auth chain: %v", ErrResolution, r.room.ID(), err)
		}
		auth = append(auth, p)
	}
	// The unconflicted auth state: the keys every snapshot gives one event (read
	// from one snapshot), and those only some give, all with the same event.
	err = r.rd.Iterate(base, func(k []byte, v hamtstore.Value) error {
		t, _, err := roomrecord.SplitStateKey(k)
		if err != nil || conflictedKey[string(k)] || !authTypes[t] {
			return err
		}
		id, err := r.eventIDOf(v)
		if err != nil {
			return err
		}
		p, err := r.pdu(id)
		if err != nil {
			return err
		}
		auth = append(auth, p)
		return nil
	})
	if err != nil {
		return stateChanges{}, fmt.Errorf("%w: room %s: read state: %v", ErrResolution, r.room.ID(), err)
	}
	resolved, err := resolveV1(conflicted, append(auth, single...))
	if err != nil {
		return stateChanges{}, fmt.Errorf("room %s: %w", r.room.ID(), err)
	}
	for _, c := range conflicts {
		if !conflictedKey[string(c.key)] {
			continue
		}
		if id, ok := resolved[c.k]; ok {
			changes.set[c.k] = id
		} else {
			changes.del = append(changes.del, c.k)
		}
	}
	return changes, nil
}

// resolveV1 runs gomatrixserverlib's state resolution v1 over conflicted events, with
// auth giving the auth state (later entries win per key). Panics become errors.
// gomatrixserverlib resolves the m.room.member conflicts one state key at a time,
// each against R as the keys before it left it, in the order the keys first
// appear in conflicted; so conflicted is sorted first (by type, state key, event
// ID), and every caller gets one answer for one input.
func resolveV1(conflicted, auth []gomatrixserverlib.PDU) (out StateMap, err error) {
	defer func() {
		if rec := recover(); rec != nil {
			out, err = nil, fmt.Errorf("%w: gomatrixserverlib panicked in v1 resolution of %d events: %v", ErrResolution, len(conflicted), rec)
		}
	}()
	conflicted = slices.Clone(conflicted)
	slices.SortFunc(conflicted, func(a, b gomatrixserverlib.PDU) int {
		return cmp.Or(strings.Compare(a.Type(), b.Type()), strings.Compare(*a.StateKey(), *b.StateKey()), strings.Compare(a.EventID(), b.EventID()))
	})
	out = StateMap{}
	for _, p := range gomatrixserverlib.ResolveStateConflicts(conflicted, auth, pdu.UserIDForSender) {
		if p.StateKey() != nil {
			out[keyOf(p)] = p.EventID()
		}
	}
	return out, nil
}

func uniqueRoots(roots []hamtstore.NodeID) []hamtstore.NodeID {
	var out []hamtstore.NodeID
	seen := map[hamtstore.NodeID]bool{}
	for _, x := range roots {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
