package resolver

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/matrix-org/gomatrixserverlib"
)

// AuthIndex answers the auth-graph questions the auth difference needs without
// parsing PDUs, over dense handles (int32) for the events of one room: the walks
// it serves visit thousands of events per resolution in large rooms, and sets of
// handles cost a fraction of sets of event IDs. Replay implements it over the
// room's graph records, AuthGraph over a roomrecord.Graph; callers that hold a room
// in memory (the testrooms generator) implement it over their own arrays.
// ResolveConflicts uses it for the conflicted keys (the state keys of the
// conflicted events) and the auth difference; the rest of the algorithm reads
// auth_events from the EventSource (from its AuthEvents when it is a
// GraphSource), which must be the events' real edges.
type AuthIndex interface {
	// Handle returns the handle of an event of the room.
	Handle(eventID string) (int32, error)
	// ID returns the event ID of a handle.
	ID(h int32) string
	// AuthEventsOf returns the auth_events of an event; a negative handle is an
	// auth event the room does not hold (an error if the walk reaches it).
	AuthEventsOf(h int32) []int32
	// AuthChildrenOf returns the events that cite h in their auth_events (state
	// events suffice: nothing cites another event as an auth event).
	AuthChildrenOf(h int32) []int32
	// StateKeyOfHandle returns an event's (type, state_key) and whether it is a
	// state event.
	StateKeyOfHandle(h int32) (Key, bool)
	// Len returns the number of handles: every handle is in [0, Len()).
	Len() int
	// UnconflictedOf returns the event the unconflicted state map gives h's key;
	// ok is false for a non-state event and a key the map lacks (conflicted keys
	// included).
	UnconflictedOf(h int32) (u int32, ok bool)
	// SameKeyAncestor reports whether z is u or reached from u through auth
	// events of u's key (its previous power levels, a member's previous
	// membership).
	SameKeyAncestor(z, u int32) bool
	// SameKeyDepth returns a state event's depth in its key's same-key lineage
	// (0 at the lineage's root), and SameKeyAncestorAt its same-key ancestor at
	// depth d (0 <= d <= SameKeyDepth(h)); both O(log depth) by jump pointers.
	SameKeyDepth(h int32) int32
	SameKeyAncestorAt(h, d int32) int32
}

// ConflictInput describes one resolution by its conflicted part only.
type ConflictInput struct {
	// PerState holds, for each input state, the events it gives the conflicted keys
	// (the keys not equal in every state, absent from some included): their state
	// keys are the conflicted keys.
	PerState [][]string
	// Unconflicted looks a key up in the unconflicted state map; it must report
	// conflicted keys as absent. Every other key of the input states is unconflicted.
	Unconflicted func(Key) (string, bool, error)
	// Create is the room's m.room.create; its room version is the resolution's.
	Create gomatrixserverlib.PDU
	// Cache, if set, carries facts about events from one resolution to the next
	// (keep one per room).
	Cache *Cache
}

// Resolution is the outcome of ResolveConflicts: the changes that turn any input
// state into the resolved state, and what the resolution cost (Stats: one
// resolution; the conflicted keys, the sizes of the auth difference and of the
// full conflicted set; EventsLoaded 0).
type Resolution struct {
	Set    map[Key]string // conflicted keys resolved to an event, and keys no state had
	Delete []Key          // conflicted keys resolved to absent, sorted
	Stats
}

// ResolveConflicts runs state resolution v2 or v2.1 (room versions 2-12; Matrix
// spec v1.19, room versions 2 and 12, "State resolution"; MSC4297 for v2.1) given
// only the conflicted part of the input states. The auth difference is computed
// from the conflicted events' auth chains: a state's full auth chain is the
// unconflicted map's plus that of its own conflicted events, so a candidate missing
// from some state's conflicted chains belongs to the difference unless an event of
// the unconflicted map descends from it (walked forward through idx.AuthChildren).
// Room version 1 is refused: use ResolveMaps. Errors wrap ErrResolution: no
// create event, an unknown room version, an event of in.PerState that idx does
// not hold or that is not a state event.
func ResolveConflicts(in ConflictInput, src EventSource, idx AuthIndex) (Resolution, error) {
	if in.Create == nil {
		return Resolution{}, fmt.Errorf("%w: no m.room.create given", ErrResolution)
	}
	version := in.Create.Version()
	verImpl, err := gomatrixserverlib.GetRoomVersion(version)
	if err != nil {
		return Resolution{}, fmt.Errorf("%w: unknown room version %q", ErrResolution, version)
	}
	algo := verImpl.StateResAlgorithm()
	if algo != gomatrixserverlib.StateResV2 && algo != gomatrixserverlib.StateResV2_1 {
		return Resolution{}, fmt.Errorf("%w: room version %s uses state resolution v1", ErrResolution, version)
	}
	keys, err := conflictedKeys(in.PerState, idx)
	if err != nil {
		return Resolution{}, err
	}
	conflicted := map[string]bool{}
	for _, ids := range in.PerState {
		for _, id := range ids {
			conflicted[id] = true
		}
	}
	diff, err := authDifference(in.PerState, idx)
	if err != nil {
		return Resolution{}, fmt.Errorf("%w: auth difference: %w", ErrResolution, err)
	}
	full := map[string]bool{}
	for id := range conflicted {
		full[id] = true
	}
	for _, id := range diff {
		full[id] = true
	}
	if algo == gomatrixserverlib.StateResV2_1 {
		sub, err := conflictedSubgraph(newStateRes(src), conflicted)
		if err != nil {
			return Resolution{}, fmt.Errorf("conflicted subgraph: %w", err)
		}
		for id := range sub {
			full[id] = true
		}
	}
	overlay, err := resolveV2(v2Input{algo: algo, full: sortedIDs(full), unconflicted: in.Unconflicted, create: in.Create, cache: in.Cache}, src)
	if err != nil {
		return Resolution{}, err
	}
	res := Resolution{Set: map[Key]string{}, Stats: Stats{Resolutions: 1, ConflictedKeys: len(keys),
		AuthDifference: len(diff), FullConflicted: len(full)}}
	isConflicted := make(map[Key]bool, len(keys))
	for _, k := range keys {
		isConflicted[k] = true
		if id, ok := overlay[k]; ok {
			res.Set[k] = id
		} else {
			res.Delete = append(res.Delete, k)
		}
	}
	// Step 5 keeps the unconflicted entries; keys no input state has, brought in by
	// auth-difference events, are added.
	for k, id := range overlay {
		if isConflicted[k] {
			continue
		}
		if _, ok, err := in.Unconflicted(k); err != nil {
			return Resolution{}, err
		} else if !ok {
			res.Set[k] = id
		}
	}
	sort.Slice(res.Delete, func(i, j int) bool { return keyLess(res.Delete[i], res.Delete[j]) })
	return res, nil
}

// conflictedKeys returns the state keys of the events perState gives, each once:
// the conflicted keys, since each has an event in some state.
func conflictedKeys(perState [][]string, idx AuthIndex) ([]Key, error) {
	seen := map[Key]bool{}
	var keys []Key
	for _, ids := range perState {
		for _, id := range ids {
			h, err := idx.Handle(id)
			if err != nil {
				return nil, fmt.Errorf("%w: conflicted event %s: %w", ErrResolution, id, err)
			}
			k, ok := idx.StateKeyOfHandle(h)
			if !ok {
				return nil, fmt.Errorf("%w: conflicted event %s is not a state event", ErrResolution, id)
			}
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	return keys, nil
}

// authDifference returns the events in some but not all of the states' full auth
// chains, in sorted order.
func authDifference(perState [][]string, idx AuthIndex) ([]string, error) {
	n := idx.Len()
	ad := &authDiff{idx: idx, words: (len(perState) + 63) / 64}
	slot := sparesOf(idx).walkSlot()
	ad.m = getMarks(slot, n, ad.words)
	defer giveSpare(slot, &marksPool, ad.m)
	handles := make([][]int32, len(perState))
	for i, ids := range perState {
		handles[i] = make([]int32, len(ids))
		for j, id := range ids {
			h, err := idx.Handle(id)
			if err != nil {
				return nil, err
			}
			if h < 0 || int(h) >= n {
				return nil, fmt.Errorf("resolver: handle %d of %s outside the auth index's %d", h, id, n)
			}
			handles[i][j] = h
		}
	}
	if err := ad.findFloors(handles); err != nil {
		return nil, err
	}
	for i, hs := range handles {
		if err := ad.chainOf(i, hs); err != nil {
			return nil, err
		}
	}
	var diff []string
	for _, x := range ad.touched {
		if ad.inEvery(x, len(perState)) {
			continue
		}
		in, err := ad.inUnconflictedChain(x)
		if err != nil {
			return nil, err
		}
		if !in {
			diff = append(diff, idx.ID(x))
		}
	}
	sort.Strings(diff)
	return diff, nil
}

// authDiff holds what one auth-difference computation learns, in epoch-stamped
// arrays over the room's handles (walkMarks) rather than maps: a resolution in a
// 1M-event room walks a few hundred events, and map hashing was a third of the
// walks' time.
type authDiff struct {
	idx     AuthIndex
	m       *walkMarks
	words   int     // bit words per handle: one bit per input state
	touched []int32 // handles in some state's chain, in first-reached order
	floors  []int32 // the events flagged flagFloor, one or two per conflicted key
}

// addFloor flags h as in every state's full auth chain (flagFloor).
func (ad *authDiff) addFloor(h int32) {
	if !ad.flag(h, flagFloor) {
		ad.setFlag(h, flagFloor)
		ad.floors = append(ad.floors, h)
	}
}

// belowFloor reports whether h is a floor or in a floor's same-key lineage
// below it (a member's earlier membership, earlier power levels): then h is
// in the floor's auth chain, so h and its own auth chain are in every
// state's full auth chain, as the floor's are. The walks stop there: a
// conflicted member's or power levels' lineage is also entered from the side
// (a power levels event cites its sender's membership at the time), below
// the floor set on it, and without the stop each state's walk would go down
// that lineage to its root, a walk as long as the key's history.
func (ad *authDiff) belowFloor(h int32) bool {
	for _, f := range ad.floors {
		if ad.idx.SameKeyAncestor(h, f) {
			if h != f {
				belowFloorStops.Add(1)
			}
			return true
		}
	}
	return false
}

// belowFloorStops counts the events belowFloor found under a floor, not
// the floor itself (read by tests).
var belowFloorStops atomic.Int64

// Flags of walkMarks.flags.
const (
	flagFloor    = 1 << iota // in every state's full auth chain (findFloors)
	flagMemo                 // inUnconflictedChain's answer is known
	flagMemoTrue             // and it is true
)

// walkMarks are the per-handle marks of one auth difference. A mark is valid only
// where stamp[h] == epoch, so a fresh computation costs an epoch increment, not a
// clear; visit is a second stamp for the forward walks of inUnconflictedChain,
// each with its own visitEpoch. h's chain bits are the words of bits from
// h*stride (stride >= words, so that computations over fewer states reuse the
// arrays).
type walkMarks struct {
	epoch, visitEpoch uint32
	stamp, visit      []uint32
	bits              []uint64 // bit i set when state i's chain holds the handle
	flags             []uint8
	words, stride     int
}

var marksPool sync.Pool

// markSpares keeps the marks of the last walks over one room's auth index for
// the next walk over it (see sparesOf). Safe for concurrent use: a walk that
// finds the spare taken uses the pool.
type markSpares struct {
	walk  atomic.Pointer[walkMarks]
	reach atomic.Pointer[reachMarks]
}

// sparesOf returns the spares of the room idx indexes, nil if it has none (the
// marks then come from the pools). A replay resolves its room from one
// goroutine, which the pools, kept per P, serve with a second set of marks
// (tens of MB in a 1M-event room) whenever the goroutine moves to the other
// P; its graph keeps spares. Other graphs do not: a server keeps the
// graphs of many rooms (roomrules.Graphs), and marks kept by each would add
// about 26 bytes an event to every one.
func sparesOf(idx AuthIndex) *markSpares {
	if v, ok := idx.(*resView); ok {
		return v.g.markSpares()
	}
	return nil
}

// getMarks returns marks for n handles and the given bit words per handle, with
// a fresh epoch: slot's spare if there is one (slot may be nil), else one from
// the pool (put back with giveSpare).
func getMarks(slot *atomic.Pointer[walkMarks], n, words int) *walkMarks {
	m := takeSpare(slot, &marksPool)
	if m == nil {
		m = &walkMarks{}
	}
	if len(m.stamp) < n || m.stride < words {
		// Grow by an eighth more than is asked: the generator's room grows by
		// an event between resolutions, and arrays of the room's exact size
		// would be allocated (and cleared) at each one; an eighth keeps that to
		// one allocation per n/8 events while a replay's room, which does not
		// grow, holds 1/8 more than it needs.
		size := max(n+n/8+64, len(m.stamp))
		stride := max(words, m.stride)
		*m = walkMarks{stamp: make([]uint32, size), visit: make([]uint32, size), bits: make([]uint64, size*stride),
			flags: make([]uint8, size), stride: stride}
	}
	m.words = words
	m.epoch++
	if m.epoch == 0 { // wrapped: old stamps could match again
		clear(m.stamp)
		m.epoch = 1
	}
	return m
}

// walkSlot and reachSlot return sp's slots, nil when sp is nil.
func (sp *markSpares) walkSlot() *atomic.Pointer[walkMarks] {
	if sp == nil {
		return nil
	}
	return &sp.walk
}

func (sp *markSpares) reachSlot() *atomic.Pointer[reachMarks] {
	if sp == nil {
		return nil
	}
	return &sp.reach
}

// takeSpare returns slot's value when it holds one (slot may be nil), else one
// from pool, else nil.
func takeSpare[T any](slot *atomic.Pointer[T], pool *sync.Pool) *T {
	if slot != nil {
		if m := slot.Swap(nil); m != nil {
			return m
		}
	}
	m, _ := pool.Get().(*T)
	return m
}

// giveSpare puts m back: in slot when it is there and empty, else in pool.
func giveSpare[T any](slot *atomic.Pointer[T], pool *sync.Pool, m *T) {
	if slot == nil || !slot.CompareAndSwap(nil, m) {
		pool.Put(m)
	}
}

// chainBits returns h's chain bit words.
func (m *walkMarks) chainBits(h int32) []uint64 {
	at := int(h) * m.stride
	return m.bits[at : at+m.words]
}

// mark makes h's marks this computation's (zeroed on first touch).
func (ad *authDiff) mark(h int32) {
	m := ad.m
	if m.stamp[h] != m.epoch {
		m.stamp[h] = m.epoch
		clear(m.chainBits(h))
		m.flags[h] = 0
	}
}

func (ad *authDiff) flag(h int32, f uint8) bool {
	return ad.m.stamp[h] == ad.m.epoch && ad.m.flags[h]&f != 0
}

func (ad *authDiff) setFlag(h int32, f uint8) {
	ad.mark(h)
	ad.m.flags[h] |= f
}

// inChain reports whether state i's chain holds h.
func (ad *authDiff) inChain(h int32, i int) bool {
	m := ad.m
	return m.stamp[h] == m.epoch && m.bits[int(h)*m.stride+i/64]&(1<<(i%64)) != 0
}

// addToChain puts h in state i's chain; it reports false when it was there.
func (ad *authDiff) addToChain(h int32, i int) bool {
	if ad.inChain(h, i) {
		return false
	}
	ad.mark(h)
	if ad.anyBits(h) == 0 {
		ad.touched = append(ad.touched, h)
	}
	ad.m.bits[int(h)*ad.m.stride+i/64] |= 1 << (i % 64)
	return true
}

// anyBits reports the OR of h's bit words (0: in no chain yet).
func (ad *authDiff) anyBits(h int32) uint64 {
	var or uint64
	for _, b := range ad.m.chainBits(h) {
		or |= b
	}
	return or
}

// inEvery reports whether each of the n states' chains holds h.
func (ad *authDiff) inEvery(h int32, n int) bool {
	for i := range n {
		if !ad.inChain(h, i) {
			return false
		}
	}
	return true
}

// maxFloorStates bounds the states findFloors handles (one bit per state).
const maxFloorStates = 64

// errNotInRoom is returned when an auth-graph walk reaches an auth event the
// room does not hold.
var errNotInRoom = errors.New("resolver: auth event not in the room")

// findFloors finds, for each conflicted key that every state gives a value, the
// floor of the key's lineage: the highest event reached from every state's value
// through auth events of the same key (previous power levels, a member's previous
// membership) and equal to none of the values. The floor is in the auth chain of
// every state's value, so it and its own auth chain are in every state's full auth
// chain and none of them is in the auth difference; chainOf need not descend below
// it. Without floors, a conflicted member key whose user changed their profile a
// hundred times has its whole history walked once per state, at every resolution.
//
// The values' lineages are walked in lockstep from the values down; the first event
// every walk has passed is their lowest common same-key ancestor (a walk passes it
// before anything below it).
func (ad *authDiff) findFloors(perState [][]int32) error {
	n := len(perState)
	if n < 2 || n > maxFloorStates {
		return nil
	}
	values := map[Key][]int32{}
	for i, hs := range perState {
		for _, h := range hs {
			k, isState := ad.idx.StateKeyOfHandle(h)
			if isState && len(values[k]) == i {
				values[k] = append(values[k], h)
			}
		}
	}
	all := uint64(1)<<n - 1
	const none = -1
	for k, vals := range values {
		if len(vals) != n {
			continue // some state has no value for k: see cutLineages
		}
		cur := slices.Clone(vals)
		passed := map[int32]uint64{}
		common := int32(none)
		for live := n; live > 0 && common == none; {
			live = 0
			for i, c := range cur {
				if c == none {
					continue
				}
				if passed[c]&(1<<i) != 0 {
					cur[i] = none // a same-key cycle (bad data): stop this walk
					continue
				}
				passed[c] |= 1 << i
				if passed[c] == all {
					common = c
					break
				}
				next, err := ad.sameKeyParent(c, k)
				if err != nil {
					return err
				}
				if cur[i] = next; next != none {
					live++
				}
			}
		}
		if common != none && slices.Contains(vals, common) {
			p, err := ad.sameKeyParent(common, k)
			if err != nil {
				return err
			}
			common = p
		}
		if common != none {
			ad.addFloor(common)
		}
	}
	return ad.cutLineages(perState)
}

// minCutDepth is the lineage depth from which cutLineages searches a value's
// lineage: shorter lineages cost chainOf less than the search (a variable for
// the model test, which lowers it to 1 so that its small rooms exercise the cut).
var minCutDepth int32 = 8

// lineageCuts counts the floors cutLineages set (read by tests).
var lineageCuts atomic.Int64

// cutLineages gives a floor to the lineage of each value of a conflicted key that
// some state has no value for (findFloors gives none: no event of the key is in
// that state's conflicted chains). The floor is the highest same-key ancestor z
// of the value that some event of the unconflicted map has in its auth chain: z
// and its auth chain are then in every state's full auth chain, so chainOf need
// not descend below it. Being in the unconflicted map's auth chain is monotone
// down a lineage (an ancestor of a chain member is one), so z is found by binary
// search over lineage depths, O(log depth) tests. Without it, a member that one
// state lacks has their whole membership history (profile changes included)
// walked at every resolution that conflicts them: the part of the auth
// difference that grew with the room (chainOf 6.7 µs per event at 100k events,
// 35 µs at 1M).
func (ad *authDiff) cutLineages(perState [][]int32) error {
	done := map[int32]bool{}
	for _, hs := range perState {
		for _, v := range hs {
			if _, isState := ad.idx.StateKeyOfHandle(v); !isState || done[v] {
				continue
			}
			done[v] = true
			d := ad.idx.SameKeyDepth(v)
			if d < minCutDepth {
				continue
			}
			// Highest depth in [0, d-1] whose ancestor is in the unconflicted chain.
			lo, hi := int32(0), d-1 // answer in [lo-1, hi]; lo-1 = -1: none
			for lo <= hi {
				mid := lo + (hi-lo)/2
				in, err := ad.inUnconflictedChain(ad.idx.SameKeyAncestorAt(v, mid))
				if err != nil {
					return err
				}
				if in {
					lo = mid + 1
				} else {
					hi = mid - 1
				}
			}
			if hi >= 0 {
				ad.addFloor(ad.idx.SameKeyAncestorAt(v, hi))
				lineageCuts.Add(1)
			}
		}
	}
	return nil
}

// sameKeyParent returns the auth event of h with key k, or -1.
func (ad *authDiff) sameKeyParent(h int32, k Key) (int32, error) {
	for _, a := range ad.idx.AuthEventsOf(h) {
		if a < 0 {
			return -1, fmt.Errorf("%w: an auth event of %s", errNotInRoom, ad.idx.ID(h))
		}
		if ak, isState := ad.idx.StateKeyOfHandle(a); isState && ak == k {
			return a, nil
		}
	}
	return -1, nil
}

// inLineage reports whether z is the unconflicted event u of its key (self) or
// in u's same-key lineage below it (below: u's previous power levels, a
// member's previous membership, ...; every such event is in u's auth chain).
func (ad *authDiff) inLineage(z int32) (self, below bool) {
	u, ok := ad.idx.UnconflictedOf(z)
	if !ok {
		return false, false
	}
	if u == z {
		return true, false
	}
	return false, ad.idx.SameKeyAncestor(z, u)
}

// chainOf puts in state i's chain the union of the auth chains of hs, except that
// it does not descend below an event of the unconflicted map or of its same-key
// lineage, nor below a floor or an event of a floor's lineage below it
// (belowFloor): such an event's own auth chain is part of every state's full auth
// chain, so none of it can be in the auth difference (the event itself is kept and
// tested like any other). The events of hs are in the chain only where the walk reaches
// them.
func (ad *authDiff) chainOf(i int, hs []int32) error {
	stack := slices.Clone(hs)
	for len(stack) > 0 {
		h := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if ad.inChain(h, i) { // reached through the walk, not a starting event
			if ad.belowFloor(h) {
				continue
			}
			if self, below := ad.inLineage(h); self || below {
				continue
			}
		}
		for _, a := range ad.idx.AuthEventsOf(h) {
			if a < 0 {
				return fmt.Errorf("%w: an auth event of %s", errNotInRoom, ad.idx.ID(h))
			}
			if ad.addToChain(a, i) {
				stack = append(stack, a)
			}
		}
	}
	return nil
}

// inUnconflictedChain reports whether some event of the unconflicted map has x in its
// auth chain: at once when x is in the same-key lineage below an unconflicted event,
// otherwise by walking auth_events edges forward from x (AuthChildrenOf) until an
// unconflicted event is met.
//
// A walk that meets none has visited every descendant of x, so each event it
// visited has the answer false too, and it is kept: a later walk stops there
// instead of walking the same descendants again. Without that, the walks from the
// events of a conflicted member's lineage each went down the rest of it (a walk
// per event of the auth difference, the lineage growing with the room's age;
// counted in a debug build: 64 events visited per replayed event at 1M, 14-17 at
// 100k).
func (ad *authDiff) inUnconflictedChain(x int32) (bool, error) {
	if ad.flag(x, flagMemo) {
		return ad.flag(x, flagMemoTrue), nil
	}
	answer := func(v bool) (bool, error) {
		ad.setFlag(x, flagMemo)
		if v {
			ad.setFlag(x, flagMemoTrue)
		}
		return v, nil
	}
	if ad.belowFloor(x) {
		return true, nil
	}
	if _, below := ad.inLineage(x); below {
		return answer(true)
	}
	m := ad.m
	m.visitEpoch++
	if m.visitEpoch == 0 {
		clear(m.visit)
		m.visitEpoch = 1
	}
	m.visit[x] = m.visitEpoch
	visited := []int32{x} // in walk order; visited[next:] still to expand
	for next := 0; next < len(visited); next++ {
		for _, k := range ad.idx.AuthChildrenOf(visited[next]) {
			if k < 0 || int(k) >= len(m.visit) {
				return false, fmt.Errorf("resolver: auth child handle %d outside the auth index", k)
			}
			if m.visit[k] == m.visitEpoch {
				continue
			}
			m.visit[k] = m.visitEpoch
			if ad.belowFloor(k) {
				return answer(true)
			}
			if u, ok := ad.idx.UnconflictedOf(k); ok && u == k {
				return answer(true)
			}
			if ad.flag(k, flagMemo) {
				// The memo answers for k's descendants, not for k itself: that k
				// is unconflicted was asked just above.
				if ad.flag(k, flagMemoTrue) {
					return answer(true)
				}
				continue // no unconflicted event below k: nothing to walk
			}
			visited = append(visited, k)
		}
	}
	for _, v := range visited {
		ad.setFlag(v, flagMemo)
	}
	return false, nil
}

func keyLess(a, b Key) bool {
	if a.Type != b.Type {
		return a.Type < b.Type
	}
	return a.StateKey < b.StateKey
}

func sortedKeys(m map[Key]string) []Key {
	out := make([]Key, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return keyLess(out[i], out[j]) })
	return out
}
