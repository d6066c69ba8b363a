package resolver

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/matrix-org/gomatrixserverlib"
)

// AuthIndex answers the auth-graph questions the auth difference needs without
// parsing PDUs, over dense handles (int32) for the events of one room: the walks
// it serves visit thousands of events per resolution in large rooms, and sets of
// handles cost a fraction of sets of event IDs. Resolver implements it over the
// room's graph records; callers that hold a room in memory (the testrooms
// generator) implement it over their own arrays. ResolveConflicts uses it only
// for the auth difference; the rest of the algorithm reads auth_events from the
// EventSource (or, when the source has an AuthEvents(eventID) method, from that),
// which must be the events' real edges.
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
}

// ConflictInput describes one resolution by its conflicted part only.
type ConflictInput struct {
	Version gomatrixserverlib.RoomVersion
	// PerState holds, for each input state, the events it gives the conflicted keys.
	PerState [][]string
	// ConflictedKeys are the keys not equal in every state (absent from some
	// included).
	ConflictedKeys []Key
	// Unconflicted looks a key up in the unconflicted state map; it must report
	// conflicted keys as absent. Every other key of the input states is unconflicted.
	Unconflicted func(Key) (string, bool, error)
	// Create is the room's m.room.create.
	Create gomatrixserverlib.PDU
	// Cache, if set, carries facts about events from one resolution to the next
	// (keep one per room).
	Cache *Cache
}

// Resolution is the outcome of ResolveConflicts: the changes that turn any input
// state into the resolved state.
type Resolution struct {
	Set    map[Key]string // conflicted keys resolved to an event, and keys no state had
	Delete []Key          // conflicted keys resolved to absent, sorted
	// AuthDifference and FullConflicted are the sizes of the auth difference and of
	// the full conflicted set.
	AuthDifference, FullConflicted int
}

// ResolveConflicts runs state resolution v2 or v2.1 (room versions 2-12; spec, "Room
// Versions", and MSC4297 for v2.1) given only the conflicted part of the input states.
// The auth difference is computed from the conflicted events' auth chains: a state's
// full auth chain is the unconflicted map's plus that of its own conflicted events, so
// a candidate missing from some state's conflicted chains belongs to the difference
// unless an event of the unconflicted map descends from it (walked forward through
// idx.AuthChildren). Room version 1 is refused: use ResolveMaps.
func ResolveConflicts(in ConflictInput, src EventSource, idx AuthIndex) (Resolution, error) {
	verImpl, err := gomatrixserverlib.GetRoomVersion(in.Version)
	if err != nil {
		return Resolution{}, fmt.Errorf("%w: unknown room version %q", ErrResolution, in.Version)
	}
	algo := verImpl.StateResAlgorithm()
	if algo != gomatrixserverlib.StateResV2 && algo != gomatrixserverlib.StateResV2_1 {
		return Resolution{}, fmt.Errorf("%w: room version %s uses state resolution v1", ErrResolution, in.Version)
	}
	conflicted := map[string]bool{}
	for _, ids := range in.PerState {
		for _, id := range ids {
			conflicted[id] = true
		}
	}
	diff, err := authDifference(in.PerState, in.Unconflicted, idx)
	if err != nil {
		return Resolution{}, fmt.Errorf("%w: auth difference: %v", ErrResolution, err)
	}
	full := map[string]bool{}
	for id := range conflicted {
		full[id] = true
	}
	for _, id := range diff {
		full[id] = true
	}
	if algo == gomatrixserverlib.StateResV2_1 {
		sub, err := conflictedSubgraph(&stateRes{src: src, pdus: map[string]gomatrixserverlib.PDU{}}, conflicted)
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
	res := Resolution{Set: map[Key]string{}, AuthDifference: len(diff), FullConflicted: len(full)}
	isConflicted := make(map[Key]bool, len(in.ConflictedKeys))
	for _, k := range in.ConflictedKeys {
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

// authDifference returns the events in some but not all of the states' full auth
// chains, in sorted order.
func authDifference(perState [][]string, unconflicted func(Key) (string, bool, error), idx AuthIndex) ([]string, error) {
	ad := &authDiff{idx: idx, unconflicted: unconflicted, lineage: map[Key]*lineage{}, memo: map[int32]bool{},
		uHandle: map[Key]int32{}}
	handles := make([][]int32, len(perState))
	for i, ids := range perState {
		handles[i] = make([]int32, len(ids))
		for j, id := range ids {
			h, err := idx.Handle(id)
			if err != nil {
				return nil, err
			}
			handles[i][j] = h
		}
	}
	if err := ad.findFloors(handles); err != nil {
		return nil, err
	}
	chains := make([]map[int32]bool, len(handles))
	union := map[int32]bool{}
	for i, hs := range handles {
		c, err := ad.chainOf(hs)
		if err != nil {
			return nil, err
		}
		chains[i] = c
		for h := range c {
			union[h] = true
		}
	}
	var diff []string
	for x := range union {
		missing := false
		for _, c := range chains {
			if !c[x] {
				missing = true
				break
			}
		}
		if !missing {
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

// authDiff holds what one auth-difference computation learns.
type authDiff struct {
	idx          AuthIndex
	unconflicted func(Key) (string, bool, error)
	lineage      map[Key]*lineage
	memo         map[int32]bool // inUnconflictedChain answers
	uHandle      map[Key]int32  // the unconflicted event by key, -1 for none
	// floors are events known to be in every state's full auth chain although no
	// unconflicted event is above them (see findFloors).
	floors map[int32]bool
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
	ad.floors = map[int32]bool{}
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
			continue // some state has no value for k
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
			ad.floors[common] = true
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

// lineage is the unconflicted event u of one key and the events reached from u
// through auth events of the same key (its previous power levels, a member's
// previous membership): every one of them but u is in u's auth chain.
type lineage struct {
	u      int32 // -1 when the key is not in the unconflicted map
	events map[int32]bool
}

// unconflictedHandle returns the unconflicted event of a key, -1 for none.
func (ad *authDiff) unconflictedHandle(k Key) (int32, error) {
	if u, ok := ad.uHandle[k]; ok {
		return u, nil
	}
	u := int32(-1)
	id, found, err := ad.unconflicted(k)
	if err != nil {
		return 0, err
	}
	if found {
		if u, err = ad.idx.Handle(id); err != nil {
			return 0, err
		}
	}
	ad.uHandle[k] = u
	return u, nil
}

// inLineage reports whether z is the unconflicted event of its key (self) or in that
// event's same-key lineage below it (below).
func (ad *authDiff) inLineage(z int32) (self, below bool, err error) {
	key, isState := ad.idx.StateKeyOfHandle(z)
	if !isState {
		return false, false, nil
	}
	lin, ok := ad.lineage[key]
	if !ok {
		lin = &lineage{events: map[int32]bool{}}
		if lin.u, err = ad.unconflictedHandle(key); err != nil {
			return false, false, err
		}
		for cur := lin.u; cur >= 0 && !lin.events[cur]; {
			lin.events[cur] = true
			if cur, err = ad.sameKeyParent(cur, key); err != nil {
				return false, false, err
			}
		}
		ad.lineage[key] = lin
	}
	if lin.u < 0 || !lin.events[z] {
		return false, false, nil
	}
	return z == lin.u, z != lin.u, nil
}

// chainOf is the union of the auth chains of events, except that it does not descend
// below an event of the unconflicted map or of its same-key lineage: such an event's
// own auth chain is part of every state's full auth chain, so none of it can be in
// the auth difference (the event itself is kept and tested like any other).
func (ad *authDiff) chainOf(hs []int32) (map[int32]bool, error) {
	seen := map[int32]bool{}
	stack := slices.Clone(hs)
	for len(stack) > 0 {
		h := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[h] { // reached through the walk, not a starting event
			if ad.floors[h] {
				continue
			}
			self, below, err := ad.inLineage(h)
			if err != nil {
				return nil, err
			}
			if self || below {
				continue
			}
		}
		for _, a := range ad.idx.AuthEventsOf(h) {
			if a < 0 {
				return nil, fmt.Errorf("%w: an auth event of %s", errNotInRoom, ad.idx.ID(h))
			}
			if !seen[a] {
				seen[a] = true
				stack = append(stack, a)
			}
		}
	}
	return seen, nil
}

// inUnconflictedChain reports whether some event of the unconflicted map has x in its
// auth chain: at once when x is in the same-key lineage below an unconflicted event,
// otherwise by walking auth_events edges forward from x (AuthChildrenOf) until an
// unconflicted event is met.
func (ad *authDiff) inUnconflictedChain(x int32) (bool, error) {
	if v, ok := ad.memo[x]; ok {
		return v, nil
	}
	if ad.floors[x] {
		return true, nil
	}
	if _, below, err := ad.inLineage(x); err != nil {
		return false, err
	} else if below {
		ad.memo[x] = true
		return true, nil
	}
	seen := map[int32]bool{x: true}
	queue := []int32{x}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, k := range ad.idx.AuthChildrenOf(cur) {
			if seen[k] {
				continue
			}
			seen[k] = true
			if ad.floors[k] {
				ad.memo[x] = true
				return true, nil
			}
			if key, isState := ad.idx.StateKeyOfHandle(k); isState {
				u, err := ad.unconflictedHandle(key)
				if err != nil {
					return false, err
				}
				if u == k {
					ad.memo[x] = true
					return true, nil
				}
			}
			queue = append(queue, k)
		}
	}
	ad.memo[x] = false
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
