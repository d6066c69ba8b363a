package resolver

import (
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/mtxdb/mtxdb/authrules"
	"github.com/mtxdb/mtxdb/roomrecord"
)

// Key is a state key: (event_type, state_key). It is roomrecord.StatePair, so the
// map roomstate.Room.State returns is a StateMap.
type Key = roomrecord.StatePair

func keyOf(p gomatrixserverlib.PDU) Key { return Key{Type: p.Type(), StateKey: *p.StateKey()} }

// EventSource gives the resolution algorithm the events it needs by ID: the
// conflicted events, their auth chains and the unconflicted events the auth rules
// read. Rejected reports whether an event was rejected when it was received (rejected
// auth events are skipped by the iterative auth checks).
type EventSource interface {
	Event(eventID string) (gomatrixserverlib.PDU, error)
	Rejected(eventID string) bool
}

// GraphSource is an EventSource that also answers a room's auth-graph questions
// from an index, the one optional interface state resolution looks for: with it,
// auth chains are walked and events numbered without parsing PDUs, and two walks
// stop early (step 1's walk of the power events' auth chains goes below no event
// numbered under the full conflicted set's lowest, v2.1's conflicted subgraph
// below none under the lowest conflicted event, and the subgraph walks
// descendants through AuthChildren when that closes sooner). Without it,
// auth_events come from the PDUs and both walks cover whole auth chains. Replay's
// resolver implements it over the room's auth index.
type GraphSource interface {
	EventSource
	// AuthOrder numbers the room's events so that every event's number is
	// greater than those of its auth events (an arrival order in which auth
	// events come first, or the auth depth); an error for an event not in the room.
	AuthOrder(eventID string) (int64, error)
	// AuthEvents returns an event's auth_events as its PDU lists them.
	AuthEvents(eventID string) ([]string, error)
	// AuthChildren returns the events citing eventID in their auth_events: at
	// least every accepted state event that does (an event on a path between two
	// conflicted events is one).
	AuthChildren(eventID string) ([]string, error)
}

// newStateRes returns the state of one resolution over src, with its
// GraphSource and roomResolver forms when it has them.
func newStateRes(src EventSource) *stateRes {
	st := &stateRes{src: src, pdus: map[string]gomatrixserverlib.PDU{}}
	st.graph, _ = src.(GraphSource)
	st.r, _ = src.(*roomResolver)
	return st
}

// v2Input is what the state resolution v2 / v2.1 algorithm (Matrix spec v1.19, room
// versions 2 and 12, "State resolution") needs besides the events themselves.
type v2Input struct {
	algo gomatrixserverlib.StateResAlgorithm
	// full is the full conflicted set: conflicted state set, auth difference and,
	// for v2.1, the conflicted state subgraph (event IDs, no duplicates).
	full []string
	// unconflicted looks a key up in the unconflicted state map.
	unconflicted func(Key) (string, bool, error)
	// create is the room's m.room.create (v2.1 starts from the empty map, and v12
	// gives its creators infinite power).
	create gomatrixserverlib.PDU
	// cache, if set, carries facts between resolutions (a fresh one otherwise).
	cache *Cache
}

// errNoEvent wraps failures to load an event the algorithm needs.
var errNoEvent = errors.New("resolver: event needed by state resolution not available")

// resolveV2 runs steps 1-4 of state resolution v2 (v2.1 when in.algo says so) and
// returns the partial state built on top of the starting map: the events the
// iterative auth checks accepted, by key. The caller applies step 5 (the unconflicted
// state map wins on its keys).
func resolveV2(in v2Input, src EventSource) (map[Key]string, error) {
	st := newStateRes(src)
	st.in, st.overlay, st.pdus = in, map[Key]string{}, make(map[string]gomatrixserverlib.PDU, len(in.full))
	st.heads, st.plCache, st.cache = make(map[string]gomatrixserverlib.PDU, len(in.full)), map[string]*gomatrixserverlib.PowerLevelContent{}, in.cache
	if st.cache == nil {
		st.cache = NewCache()
	}
	full := make(map[string]bool, len(in.full))
	for _, id := range in.full {
		p, err := st.event(id)
		if err != nil {
			return nil, err
		}
		if p.StateKey() == nil {
			return nil, fmt.Errorf("%w: %s is not a state event", errNoEvent, id)
		}
		full[id] = true
	}
	if in.create != nil {
		st.creators = st.cache.roomCreators(in.create)
		verImpl, err := gomatrixserverlib.GetRoomVersion(in.create.Version())
		if err == nil {
			st.privilegedCreators = verImpl.PrivilegedCreators()
		}
	}

	// Step 1: the power events of the full conflicted set, with the events of their
	// auth chains that are also in the full conflicted set.
	x, err := st.powerSubset(in.full, full)
	if err != nil {
		return nil, err
	}
	inX := make(map[string]bool, len(x))
	for _, id := range x {
		inX[id] = true
	}
	ordered, err := st.reverseTopologicalPowerOrder(x)
	if err != nil {
		return nil, err
	}
	// Step 2: iterative auth checks from the unconflicted state map (v2) or from the
	// empty map (v2.1).
	if err := st.iterativeAuthChecks(ordered); err != nil {
		return nil, err
	}
	// Step 3: the rest, in mainline order of the power levels event just resolved.
	var rest []string
	for _, id := range in.full {
		if !inX[id] {
			rest = append(rest, id)
		}
	}
	ordered, err = st.mainlineOrder(rest)
	if err != nil {
		return nil, err
	}
	// Step 4.
	if err := st.iterativeAuthChecks(ordered); err != nil {
		return nil, err
	}
	return st.overlay, nil
}

// powerSubset returns step 1's set: the power events of the full conflicted set
// (ids; full holds the same as a set) and the events of their auth chains that
// are in the full conflicted set. With a GraphSource no event below the
// full set's lowest is walked, and (lockstep) a walk down from the full set's
// other events, bounded by the highest power event, may close first: the events
// it finds to be ancestors of a power event are those of the auth chains.
func (st *stateRes) powerSubset(ids []string, full map[string]bool) ([]string, error) {
	var power, others []string
	powerSet := map[string]bool{}
	for _, id := range ids {
		p, err := st.event(id)
		if err != nil {
			return nil, err
		}
		if isPowerEvent(p) {
			power = append(power, id)
			powerSet[id] = true
		} else {
			others = append(others, id)
		}
	}
	floor, _, err := st.orderRange(ids)
	if err != nil {
		return nil, err
	}
	_, top, err := st.orderRange(power)
	if err != nil {
		return nil, err
	}
	w, up, err := st.lockstep(power, floor, others, top)
	if err != nil {
		return nil, err
	}
	defer releaseWalk(w)
	x := power
	if up {
		err := w.forSeen(func(a string) error {
			if full[a] && !powerSet[a] {
				x = append(x, a)
			}
			return nil
		})
		return x, err
	}
	w.setTargets(powerSet)
	for _, id := range others {
		r, err := w.reaches(id)
		if err != nil {
			return nil, err
		}
		if r {
			x = append(x, id)
		}
	}
	return x, nil
}

type stateRes struct {
	src EventSource
	// graph is src when it is a GraphSource, else nil: auth events, auth children
	// and event numbers then come from the PDUs and whole auth chains.
	graph GraphSource
	// r is src when it is the roomResolver, else nil: ordering reads state events in
	// their light form (eventHead), the rules read auth events and checked events
	// so, and mainline positions come from its auth index.
	r       *roomResolver
	in      v2Input
	overlay map[Key]string                   // partial state on top of the starting map
	pdus    map[string]gomatrixserverlib.PDU // parsed PDUs (full)
	heads   map[string]gomatrixserverlib.PDU // events in a light form for ordering (roomResolver.headOf), never checked by the rules
	plCache map[string]*gomatrixserverlib.PowerLevelContent

	creators           []string
	privilegedCreators bool
	cache              *Cache
}

// event returns an event for what resolution's ordering reads of it (type, state
// key, sender, origin_server_ts, auth_events, a member's membership): the parsed
// PDU when there is one, else the roomResolver's light form (headOf), else the PDU
// parsed. Its content is read only through full.
func (st *stateRes) event(id string) (gomatrixserverlib.PDU, error) {
	if p, ok := st.pdus[id]; ok {
		return p, nil
	}
	if p, ok := st.heads[id]; ok {
		return p, nil
	}
	if st.r != nil {
		if p, ok := st.r.headOf(id); ok {
			if st.heads == nil {
				st.heads = map[string]gomatrixserverlib.PDU{}
			}
			st.heads[id] = p
			return p, nil
		}
	}
	return st.full(id)
}

// full returns the parsed PDU of an event, for reading its content or checking it
// against the authorization rules.
func (st *stateRes) full(id string) (gomatrixserverlib.PDU, error) {
	if p, ok := st.pdus[id]; ok {
		return p, nil
	}
	p, err := st.src.Event(id)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", errNoEvent, id, err)
	}
	st.pdus[id] = p
	return p, nil
}

// checked returns an event to check against the authorization rules: the parsed
// PDU, else the roomResolver's form for checking (checkEvent), else the PDU parsed.
func (st *stateRes) checked(id string) (gomatrixserverlib.PDU, error) {
	return st.lightOr(id, (*roomResolver).checkEvent)
}

// lightOr returns the parsed PDU of an event, else what get gives from the
// roomResolver (a light form where the authorization rules read no more of the
// event: eventHead), else the PDU parsed.
func (st *stateRes) lightOr(id string, get func(*roomResolver, string) (gomatrixserverlib.PDU, error)) (gomatrixserverlib.PDU, error) {
	if p, ok := st.pdus[id]; ok {
		return p, nil
	}
	if st.r != nil {
		p, err := get(st.r, id)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", errNoEvent, id, err)
		}
		return p, nil
	}
	return st.full(id)
}

// authEvent returns an event to use only as an auth event of the event being
// checked: the parsed PDU, else the roomResolver's light form (authEvent; not kept,
// so that event() never answers it for an event that is checked itself), else
// the PDU parsed.
func (st *stateRes) authEvent(id string) (gomatrixserverlib.PDU, error) {
	return st.lightOr(id, (*roomResolver).authEvent)
}

// lookup reads the partial state: the overlay, then (v2 only) the unconflicted map.
func (st *stateRes) lookup(k Key) (string, bool, error) {
	if id, ok := st.overlay[k]; ok {
		return id, true, nil
	}
	if st.in.algo == gomatrixserverlib.StateResV2_1 || st.in.unconflicted == nil {
		return "", false, nil
	}
	return st.in.unconflicted(k)
}

// authChain returns the union of the auth chains of events (closure over
// auth_events, not including the events unless one is in another's chain),
// sorted.
func (st *stateRes) authChain(ids ...string) ([]string, error) {
	w := &reachWalk{next: st.authEventsOf, seen: map[string]bool{}, stack: slices.Clone(ids)}
	for !w.done() {
		if err := w.step(); err != nil {
			return nil, err
		}
	}
	return sortedIDs(w.seen), nil
}

// noFloor is the order floor when the source is no GraphSource. With one, an
// event numbered below the floor can be neither in the full conflicted set nor a
// descendant of a conflicted event; without, walks cover whole auth chains
// (every earlier power levels event, and their senders' membership histories).
const noFloor = math.MinInt64

// orderRange returns the lowest and highest AuthOrder among ids, or noFloor for
// both when the source is no GraphSource or ids is empty.
func (st *stateRes) orderRange(ids []string) (low, high int64, err error) {
	o := st.graph
	if o == nil || len(ids) == 0 {
		return noFloor, noFloor, nil
	}
	low, high = math.MaxInt64, math.MinInt64
	for _, id := range ids {
		n, err := o.AuthOrder(id)
		if err != nil {
			return 0, 0, fmt.Errorf("%w: %s: %v", errNoEvent, id, err)
		}
		low, high = min(low, n), max(high, n)
	}
	return low, high, nil
}

// authEventsOf returns an event's auth_events, without parsing the PDU when the
// event source is a GraphSource.
func (st *stateRes) authEventsOf(id string) ([]string, error) {
	if st.graph != nil {
		return st.graph.AuthEvents(id)
	}
	p, err := st.event(id)
	if err != nil {
		return nil, err
	}
	return p.AuthEventIDs(), nil
}

// isPowerEvent: m.room.power_levels, m.room.join_rules, or an m.room.member whose
// membership is leave or ban and whose sender is not its state_key (Matrix spec
// v1.19, room version 2, "State resolution", "Power events"). The create event is
// not one: where it is conflicted (a state without it, as ResolveMaps may be
// given), it is ordered by the mainline ordering with the other events.
func isPowerEvent(p gomatrixserverlib.PDU) bool {
	switch p.Type() {
	case spec.MRoomPowerLevels, spec.MRoomJoinRules:
		return p.StateKeyEquals("")
	case spec.MRoomMember:
		m, err := p.Membership()
		if err != nil {
			return false
		}
		return (m == spec.Leave || m == spec.Ban) && string(p.SenderID()) != *p.StateKey()
	}
	return false
}

// senderPowerLevel is the power level of an event's sender as given by its auth
// events (Matrix spec v1.19, room version 2, "State resolution", "Reverse
// topological power ordering"): the m.room.power_levels among them, or the room
// creator's default of 100 when there is none; in room versions with privileged
// creators (v12) the creators rank above everyone.
func (st *stateRes) senderPowerLevel(p gomatrixserverlib.PDU) (int64, error) {
	sender := string(p.SenderID())
	if st.privilegedCreators {
		for _, c := range st.creators {
			if c == sender {
				return gomatrixserverlib.CreatorPowerLevel, nil
			}
		}
	}
	var plEvent, createEvent gomatrixserverlib.PDU
	for _, a := range p.AuthEventIDs() {
		ae, err := st.event(a)
		if err != nil {
			return 0, err
		}
		// The first of each, as plAuthEventID and the auth index name it (an
		// event citing two is rejected on receipt, but an atomic resolution
		// may still sort it).
		switch {
		case ae.Type() == spec.MRoomPowerLevels && ae.StateKeyEquals("") && plEvent == nil:
			plEvent = ae
		case ae.Type() == spec.MRoomCreate && ae.StateKeyEquals("") && createEvent == nil:
			createEvent = ae
		}
	}
	if plEvent == nil {
		var err error
		if createEvent == nil {
			createEvent = st.in.create
		} else if createEvent, err = st.full(createEvent.EventID()); err != nil {
			return 0, err // its content is read (an event head has none)
		}
		if createEvent != nil && roomCreator(createEvent) == sender {
			return 100, nil
		}
		return 0, nil
	}
	pl, err := st.powerLevels(plEvent)
	if errors.Is(err, errNoEvent) {
		return 0, err // the event could not be loaded (plEvent may be a head)
	}
	if err != nil {
		return 0, nil // unparseable levels: treat the sender as powerless
	}
	return pl.UserLevel(p.SenderID()), nil
}

// roomCreator is the room creator a create event names: content.creator in room
// versions 1-10 (Matrix spec v1.19, room versions 1-10, "Authorisation rules": the
// creator of a room without power levels has level 100), the sender from 11 and
// when content.creator is missing. A v1-10 create event may name another user than
// its sender.
func roomCreator(create gomatrixserverlib.PDU) string {
	if v := versionNumber(create.Version()); v >= 1 && v <= 10 {
		var c struct {
			Creator string `json:"creator"`
		}
		if json.Unmarshal(create.Content(), &c) == nil && c.Creator != "" {
			return c.Creator
		}
	}
	return string(create.SenderID())
}

// powerLevels returns the parsed content of a power levels event: from this
// resolution's plCache, else the Cache's (kept between resolutions), else parsed
// from its PDU (plEvent may be a head, which has no content).
func (st *stateRes) powerLevels(plEvent gomatrixserverlib.PDU) (*gomatrixserverlib.PowerLevelContent, error) {
	id := plEvent.EventID()
	if pl, ok := st.plCache[id]; ok {
		return pl, nil
	}
	if pl, ok := st.cache.levels[id]; ok {
		st.plCache[id] = pl
		return pl, nil
	}
	p, err := st.full(id)
	if err != nil {
		return nil, err
	}
	var pl gomatrixserverlib.PowerLevelContent
	verImpl, err := gomatrixserverlib.GetRoomVersion(p.Version())
	if err != nil {
		return nil, err
	}
	if err := verImpl.ParsePowerLevels(p.Content(), &pl); err != nil {
		return nil, err
	}
	st.plCache[id] = &pl
	if len(st.cache.levels) >= maxLevels {
		clear(st.cache.levels)
	}
	st.cache.levels[id] = &pl
	return &pl, nil
}

// orderItem is an event with its sort key.
type orderItem struct {
	id    string
	major int64 // power level (negated) or mainline position
	ts    int64
}

func lessItem(a, b orderItem) bool {
	if a.major != b.major {
		return a.major < b.major
	}
	if a.ts != b.ts {
		return a.ts < b.ts
	}
	return a.id < b.id
}

type itemHeap []orderItem

func (h itemHeap) Len() int           { return len(h) }
func (h itemHeap) Less(i, j int) bool { return lessItem(h[i], h[j]) }
func (h itemHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *itemHeap) Push(x any)        { *h = append(*h, x.(orderItem)) }
func (h *itemHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// reverseTopologicalPowerOrder sorts events so each comes after those of its auth
// events that are in the list, breaking ties by higher sender power level, then
// earlier origin_server_ts, then smaller event ID (Kahn's algorithm taking the
// smallest ready event each time: the lexicographically smallest such ordering).
func (st *stateRes) reverseTopologicalPowerOrder(ids []string) ([]string, error) {
	in := make(map[string]bool, len(ids))
	for _, id := range ids {
		in[id] = true
	}
	pending := make(map[string]int, len(ids))       // auth events in the set not yet output
	children := make(map[string][]string, len(ids)) // auth event -> events in the set that cite it
	items := make(map[string]orderItem, len(ids))
	for _, id := range ids {
		p, err := st.event(id)
		if err != nil {
			return nil, err
		}
		seen := map[string]bool{}
		for _, a := range p.AuthEventIDs() {
			if in[a] && !seen[a] {
				seen[a] = true
				pending[id]++
				children[a] = append(children[a], id)
			}
		}
		pl, err := st.senderPowerLevel(p)
		if err != nil {
			return nil, err
		}
		items[id] = orderItem{id: id, major: -pl, ts: int64(p.OriginServerTS())}
	}
	h := &itemHeap{}
	for _, id := range ids {
		if pending[id] == 0 {
			heap.Push(h, items[id])
		}
	}
	out := make([]string, 0, len(ids))
	for h.Len() > 0 {
		it := heap.Pop(h).(orderItem)
		out = append(out, it.id)
		for _, c := range children[it.id] {
			if pending[c]--; pending[c] == 0 {
				heap.Push(h, items[c])
			}
		}
	}
	if len(out) != len(ids) {
		return nil, fmt.Errorf("%w: auth_events among %d power events form a cycle", ErrResolution, len(ids))
	}
	return out, nil
}

// Cache keeps what never changes about an event across the resolutions of one room:
// the m.room.power_levels among its auth events, the mainline of a power levels
// event, and the outcome of an authorization check of an event against a given set
// of auth events (the rules are a pure function of the two; event IDs name one
// PDU each in a room). Replay keeps one for the room; callers of ResolveConflicts
// may pass one (ConflictInput.Cache). Not safe for concurrent use.
type Cache struct {
	// plParent: event ID -> its power levels auth event ("" if none). Cleared at
	// maxPLParents entries.
	plParent map[string]string
	// mainline: power levels event -> its mainline's positions, oldest = 1, for
	// the last few power levels events asked (at most maxMainlines: one map per
	// power levels event of a room grows with the square of their number, 4,608
	// in a generated 1M-event room).
	mainline map[string]map[string]int64
	// allowed: authCheckKey(event, auth events) -> whether the rules allowed it;
	// when it reaches maxAllowedChecks entries it becomes allowedOld (still read) and
	// a new one starts, so the most recent checks are kept.
	allowed, allowedOld map[checkKey]bool
	// needed: event ID -> the state keys the authorization rules read for it
	// (gomatrixserverlib.StateNeededForAuth). Cleared at maxAuthChecks entries.
	needed map[string][]gomatrixserverlib.StateKeyTuple
	// plain: outcome of a plain event's check by (room, type, sender, auth events)
	// (allowedOnce). Cleared at maxAuthChecks entries.
	plain map[checkKey]error
	// levels: power levels event ID -> its parsed content, for the senders' power
	// levels of reverse topological power ordering. Cleared at maxLevels entries.
	levels map[string]*gomatrixserverlib.PowerLevelContent
	// authorize applies the authorization rules, keeping what they parse of power
	// levels and create events (authrules.NewAuthorizer).
	authorize func(p gomatrixserverlib.PDU, authEvents []gomatrixserverlib.PDU) error
	// creators: the creators of the last create event asked
	// (gomatrixserverlib.CreatorsFromCreateEvent), by its event ID.
	creatorsOf string
	creators   []string
}

// roomCreators returns gomatrixserverlib.CreatorsFromCreateEvent(create), kept
// for the last create event asked (a room's resolutions all ask the same one).
// The returned slice must not be modified.
func (c *Cache) roomCreators(create gomatrixserverlib.PDU) []string {
	if c.creators == nil || c.creatorsOf != create.EventID() {
		c.creatorsOf, c.creators = create.EventID(), gomatrixserverlib.CreatorsFromCreateEvent(create)
	}
	return c.creators
}

// maxMainlines bounds Cache.mainline; maxPLParents bounds Cache.plParent.
const (
	maxMainlines = 4
	maxPLParents = 1 << 18
	// maxLevels bounds Cache.levels (a parsed power levels content is a few
	// hundred bytes plus its users: a generated room's hold a few dozen).
	maxLevels = 1 << 10
)

// maxAuthChecks bounds Cache.plain and Cache.needed.
const maxAuthChecks = 1 << 16

// maxAllowedChecks bounds each generation of Cache.allowed (an entry is a
// 16-byte checkKey and its outcome, about 30 bytes of map: 7.5 MiB a full
// generation). The iterative auth checks of a resolution ask again the checks
// of old events (an old member event against its own auth events): a
// replay of the generated 1M-event room notes about 500,000 checks; of its
// resolutions' 2,094,536 lookups, 40,905 miss at this bound (as many as with no
// bound) and 117,384 at 65,536.
const maxAllowedChecks = 1 << 18

// NewCache returns an empty Cache.
func NewCache() *Cache {
	return &Cache{plParent: map[string]string{}, mainline: map[string]map[string]int64{}, allowed: map[checkKey]bool{},
		needed: map[string][]gomatrixserverlib.StateKeyTuple{}, plain: map[checkKey]error{},
		levels: map[string]*gomatrixserverlib.PowerLevelContent{}, authorize: authrules.NewAuthorizer()}
}

// allowedCached is check with its outcome kept in the Cache.
func (c *Cache) allowedCached(p gomatrixserverlib.PDU, byKey map[Key]gomatrixserverlib.PDU) bool {
	k := authCheckKey(p.EventID(), byKey)
	if ok, hit := c.lookupAllowed(k); hit {
		return ok
	}
	ok := c.check(p, byKey) == nil
	c.noteAllowed(k, ok)
	return ok
}

func (c *Cache) lookupAllowed(k checkKey) (ok, hit bool) {
	if ok, hit = c.allowed[k]; !hit {
		ok, hit = c.allowedOld[k]
	}
	return ok, hit
}

func (c *Cache) noteAllowed(k checkKey, ok bool) {
	if len(c.allowed) >= maxAllowedChecks {
		c.allowedOld, c.allowed = c.allowed, make(map[checkKey]bool, maxAllowedChecks)
	}
	c.allowed[k] = ok
}

// byStateKey indexes events by state key; ok is false when two share one (or an
// event is not a state event).
func byStateKey(events []gomatrixserverlib.PDU) (byKey map[Key]gomatrixserverlib.PDU, ok bool) {
	byKey = make(map[Key]gomatrixserverlib.PDU, len(events))
	for _, e := range events {
		if e.StateKey() == nil {
			return nil, false
		}
		k := keyOf(e)
		if _, dup := byKey[k]; dup {
			return nil, false
		}
		byKey[k] = e
	}
	return byKey, true
}

// Authorized reports whether the authorization rules (authrules.Authorize: the
// room version's rules; Matrix spec v1.19, "Authorisation rules") allow p
// against authEvents, one event per state key, and keeps the outcome in c: the
// iterative auth checks of later resolutions with c look it up instead of checking
// p against the same events again (an event's check against its own auth events is
// the common case). A panic in the rules counts as not allowed. Auth events that
// share a state key, or include a non-state event, are checked without the cache.
func (c *Cache) Authorized(p gomatrixserverlib.PDU, authEvents []gomatrixserverlib.PDU) bool {
	byKey, ok := byStateKey(authEvents)
	if !ok {
		return c.authorize(p, authEvents) == nil
	}
	return c.allowedCached(p, byKey)
}

// allowedOnce checks p against authEvents with the authorization rules
// (authrules.Authorize) and returns the reason it is not allowed. The outcome of a
// state event is noted for the iterative auth checks (note). A plain event (no
// state key, and not of a type whose rules gomatrixserverlib picks by type:
// create, aliases, member, power levels, redaction) is checked once per (room,
// type, sender, auth events): the rules read nothing else of it (Matrix spec
// v1.19, "Authorisation rules", the rules after the membership ones: the sender's
// membership, the event type's required power level, the create event's
// m.federate), so one outcome serves every plain event with the same four, as the
// room generator does.
func (c *Cache) allowedOnce(p gomatrixserverlib.PDU, authEvents []gomatrixserverlib.PDU) error {
	return c.allowedOnceBy(p, authEvents, func() error { return c.authorize(p, authEvents) })
}

// allowedOnceBy is allowedOnce with the check made by check, which returns
// what c.authorize(p, authEvents) returns (the replay's prefetcher computes it
// ahead, on another goroutine).
func (c *Cache) allowedOnceBy(p gomatrixserverlib.PDU, authEvents []gomatrixserverlib.PDU, check func() error) error {
	if p.StateKey() != nil || contentRuled[p.Type()] {
		err := check()
		if p.StateKey() != nil {
			c.note(p, authEvents, err == nil)
		}
		return err
	}
	ids := make([]string, len(authEvents))
	for i, a := range authEvents {
		ids[i] = a.EventID()
	}
	key := plainCheckKey(p, ids)
	if err, ok := c.plain[key]; ok {
		return err
	}
	err := check()
	if len(c.plain) >= maxAuthChecks {
		clear(c.plain)
	}
	c.plain[key] = err
	return err
}

// note records the outcome of a check of p against authEvents made elsewhere
// (roomResolver.authorize keeps the rules' reason for its error).
func (c *Cache) note(p gomatrixserverlib.PDU, authEvents []gomatrixserverlib.PDU, ok bool) {
	if byKey, distinct := byStateKey(authEvents); distinct {
		c.noteAllowed(authCheckKey(p.EventID(), byKey), ok)
	}
}

// plAuthEventID returns the m.room.power_levels among an event's auth events, or "".
func (st *stateRes) plAuthEventID(id string) (string, error) {
	if pl, ok := st.cache.plParent[id]; ok {
		return pl, nil
	}
	if st.r != nil {
		return st.r.powerLevelsAuthEvent(id)
	}
	p, err := st.event(id)
	if err != nil {
		return "", err
	}
	pl := ""
	for _, a := range p.AuthEventIDs() {
		ae, err := st.event(a)
		if err != nil {
			return "", err
		}
		if ae.Type() == spec.MRoomPowerLevels && ae.StateKeyEquals("") {
			pl = a
			break
		}
	}
	if len(st.cache.plParent) >= maxPLParents {
		clear(st.cache.plParent)
	}
	st.cache.plParent[id] = pl
	return pl, nil
}

// mainlinePositions returns the mainline of a power levels event as positions,
// oldest = 1 (Matrix spec v1.19, room version 2, "State resolution", "Mainline
// ordering").
func (st *stateRes) mainlinePositions(plID string) (map[string]int64, error) {
	if pos, ok := st.cache.mainline[plID]; ok {
		return pos, nil
	}
	var mainline []string
	onMainline := map[string]bool{}
	for cur := plID; cur != ""; {
		if onMainline[cur] {
			return nil, fmt.Errorf("%w: power levels mainline of %s loops at %s", ErrResolution, plID, cur)
		}
		onMainline[cur] = true
		mainline = append(mainline, cur)
		next, err := st.plAuthEventID(cur)
		if err != nil {
			return nil, err
		}
		cur = next
	}
	pos := make(map[string]int64, len(mainline))
	for i, id := range mainline {
		pos[id] = int64(len(mainline) - i)
	}
	if len(st.cache.mainline) >= maxMainlines {
		clear(st.cache.mainline)
	}
	st.cache.mainline[plID] = pos
	return pos, nil
}

// mainlineOrder sorts events by the position of their closest mainline event in the
// mainline of the power levels event of the partial state (older first), then by
// origin_server_ts, then by event ID (Matrix spec v1.19, room version 2, "State
// resolution", "Mainline ordering"). Events with no mainline event sort before all
// others.
func (st *stateRes) mainlineOrder(ids []string) ([]string, error) {
	plID, ok, err := st.lookup(Key{Type: spec.MRoomPowerLevels, StateKey: ""})
	if err != nil {
		return nil, err
	}
	// closest returns the position of an event's closest mainline event. With no
	// power levels event in the partial state (v2.1 starts from the empty map)
	// every position is 0: walking each event's power-levels chain to its root
	// to find that out cost the room's whole power-levels history per event.
	closest := func(string) (int64, error) { return 0, nil }
	if ok && st.r != nil {
		closest = func(id string) (int64, error) { return st.r.mainlineClosest(plID, id) }
	} else if ok {
		if closest, err = st.mainlineWalk(plID); err != nil {
			return nil, err
		}
	}
	items := make([]orderItem, 0, len(ids))
	for _, id := range ids {
		p, err := st.event(id)
		if err != nil {
			return nil, err
		}
		pos, err := closest(id)
		if err != nil {
			return nil, err
		}
		items = append(items, orderItem{id: id, major: pos, ts: int64(p.OriginServerTS())})
	}
	sort.Slice(items, func(i, j int) bool { return lessItem(items[i], items[j]) })
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.id
	}
	return out, nil
}

// mainlineWalk returns closest for sources without a mainline index: walk an
// event's power levels auth events until one is on plID's mainline (positions
// from mainlinePositions), remembering the answer for every event walked.
func (st *stateRes) mainlineWalk(plID string) (func(string) (int64, error), error) {
	position, err := st.mainlinePositions(plID)
	if err != nil {
		return nil, err
	}
	memo := map[string]int64{}
	return func(id string) (int64, error) {
		var pos int64
		var walked []string
		for cur := id; cur != ""; {
			if v, ok := memo[cur]; ok {
				pos = v
				break
			}
			if v, ok := position[cur]; ok {
				pos = v
				break
			}
			walked = append(walked, cur)
			var err error
			if cur, err = st.plAuthEventID(cur); err != nil {
				return 0, err
			}
		}
		for _, w := range walked {
			memo[w] = pos
		}
		return pos, nil
	}, nil
}

// iterativeAuthChecks applies events in order to the partial state: each event's
// auth events are its non-rejected auth_events, overridden by the partial state's
// entries for the keys the authorization rules read; an event that passes is put in
// the partial state (Matrix spec v1.19, room version 2, "State resolution",
// "Iterative auth checks").
func (st *stateRes) iterativeAuthChecks(ids []string) error {
	for _, id := range ids {
		p, err := st.event(id)
		if err != nil {
			return err
		}
		byKey := map[Key]gomatrixserverlib.PDU{}
		for _, a := range p.AuthEventIDs() {
			if st.src.Rejected(a) {
				continue
			}
			ae, err := st.authEvent(a)
			if err != nil {
				return err
			}
			if ae.StateKey() != nil {
				byKey[keyOf(ae)] = ae
			}
		}
		for _, t := range st.neededForAuth(p) {
			sid, ok, err := st.lookup(Key{Type: t.EventType, StateKey: t.StateKey})
			if err != nil {
				return err
			}
			if ok {
				se, err := st.authEvent(sid)
				if err != nil {
					return err
				}
				byKey[Key{Type: t.EventType, StateKey: t.StateKey}] = se
			}
		}
		if st.privilegedCreators && st.in.create != nil {
			byKey[Key{Type: spec.MRoomCreate, StateKey: ""}] = st.in.create
		}
		k := authCheckKey(id, byKey)
		ok, hit := st.cache.lookupAllowed(k)
		if !hit {
			fp, err := st.checked(id)
			if err != nil {
				return err
			}
			ok = st.cache.check(fp, byKey) == nil
			st.cache.noteAllowed(k, ok)
		}
		if ok {
			st.overlay[keyOf(p)] = id
		}
	}
	return nil
}

// neededForAuth returns the state keys the authorization rules read for p
// (gomatrixserverlib.StateNeededForAuth), remembered in the cache.
func (st *stateRes) neededForAuth(p gomatrixserverlib.PDU) []gomatrixserverlib.StateKeyTuple {
	return st.cache.neededFor(p)
}

// neededFor returns gomatrixserverlib.StateNeededForAuth's tuples for p,
// remembered by event ID.
func (c *Cache) neededFor(p gomatrixserverlib.PDU) []gomatrixserverlib.StateKeyTuple {
	if t, ok := c.needed[p.EventID()]; ok {
		return t
	}
	if len(c.needed) >= maxAuthChecks {
		clear(c.needed)
	}
	t := gomatrixserverlib.StateNeededForAuth([]gomatrixserverlib.PDU{p}).Tuples()
	c.needed[p.EventID()] = t
	return t
}

// check runs the authorization rules with the given auth events, one per key
// (authrules.Authorize), keeping what they parse in c.
func (c *Cache) check(p gomatrixserverlib.PDU, byKey map[Key]gomatrixserverlib.PDU) error {
	list := make([]gomatrixserverlib.PDU, 0, len(byKey))
	for _, e := range byKey {
		list = append(list, e)
	}
	return c.authorize(p, list)
}
