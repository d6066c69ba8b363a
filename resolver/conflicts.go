package resolver

import (
	"fmt"
	"slices"
	"sort"

	"github.com/matrix-org/gomatrixserverlib"
)

// AuthIndex answers the auth-graph questions the auth difference needs without
// parsing PDUs. Resolver implements it over metadata records; callers that hold a
// room in memory (the testrooms generator) implement it over their own arrays.
// ResolveConflicts uses it only for the auth difference; the rest of the algorithm
// reads auth_events from the EventSource (or, when the source has an
// AuthEvents(eventID) method, from that), which must be the events' real edges.
type AuthIndex interface {
	// AuthEvents returns the auth_events of an event.
	AuthEvents(eventID string) ([]string, error)
	// AuthChildren returns the events that cite eventID in their auth_events.
	AuthChildren(eventID string) ([]string, error)
	// StateKeyOf returns an event's (type, state_key) and whether it is a state event.
	StateKeyOf(eventID string) (Key, bool, error)
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
	ad := &authDiff{idx: idx, unconflicted: unconflicted, lineage: map[Key]*lineage{}, memo: map[string]bool{}}
	if err := ad.findFloors(perState); err != nil {
		return nil, err
	}
	chains := make([]map[string]bool, len(perState))
	union := map[string]bool{}
	for i, ids := range perState {
		c, err := ad.chainOf(ids)
		if err != nil {
			return nil, err
		}
		chains[i] = c
		for id := range c {
			union[id] = true
		}
	}
	var diff []string
	for _, x := range sortedIDs(union) {
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
			diff = append(diff, x)
		}
	}
	return diff, nil
}

// authDiff holds what one auth-difference computation learns.
type authDiff struct {
	idx          AuthIndex
	unconflicted func(Key) (string, bool, error)
	lineage      map[Key]*lineage
	memo         map[string]bool // inUnconflictedChain answers
	// floors are events known to be in every state's full auth chain although no
	// unconflicted event is above them (see findFloors).
	floors map[string]bool
}

// maxFloorStates bounds the states findFloors handles (one bit per state).
const maxFloorStates = 64

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
func (ad *authDiff) findFloors(perState [][]string) error {
	ad.floors = map[string]bool{}
	n := len(perState)
	if n < 2 || n > maxFloorStates {
		return nil
	}
	values := map[Key][]string{}
	for i, ids := range perState {
		for _, id := range ids {
			k, isState, err := ad.idx.StateKeyOf(id)
			if err != nil {
				return err
			}
			if isState && len(values[k]) == i {
				values[k] = append(values[k], id)
			}
		}
	}
	all := uint64(1)<<n - 1
	for k, vals := range values {
		if len(vals) != n {
			continue // some state has no value for k
		}
		cur := slices.Clone(vals)
		passed := map[string]uint64{}
		common := ""
		for live := n; live > 0 && common == ""; {
			live = 0
			for i, c := range cur {
				if c == "" {
					continue
				}
				if passed[c]&(1<<i) != 0 {
					cur[i] = "" // a same-key cycle (bad data): stop this walk
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
				if cur[i] = next; next != "" {
					live++
				}
			}
		}
		if common != "" && slices.Contains(vals, common) {
			p, err := ad.sameKeyParent(common, k)
			if err != nil {
				return err
			}
			common = p
		}
		if common != "" {
			ad.floors[common] = true
		}
	}
	return nil
}

// sameKeyParent returns the auth event of id with key k, or "".
func (ad *authDiff) sameKeyParent(id string, k Key) (string, error) {
	auth, err := ad.idx.AuthEvents(id)
	if err != nil {
		return "", err
	}
	for _, a := range auth {
		ak, isState, err := ad.idx.StateKeyOf(a)
		if err != nil {
			return "", err
		}
		if isState && ak == k {
			return a, nil
		}
	}
	return "", nil
}

// lineage is the unconflicted event u of one key and the events reached from u
// through auth events of the same key (its previous power levels, a member's
// previous membership): every one of them but u is in u's auth chain.
type lineage struct {
	u      string // "" when the key is not in the unconflicted map
	events map[string]bool
}

// inLineage reports whether z is the unconflicted event of its key (self) or in that
// event's same-key lineage below it (below).
func (ad *authDiff) inLineage(z string) (self, below bool, err error) {
	key, isState, err := ad.idx.StateKeyOf(z)
	if err != nil || !isState {
		return false, false, err
	}
	lin, ok := ad.lineage[key]
	if !ok {
		lin = &lineage{events: map[string]bool{}}
		u, found, err := ad.unconflicted(key)
		if err != nil {
			return false, false, err
		}
		if found {
			lin.u = u
		}
		for cur := lin.u; cur != "" && !lin.events[cur]; {
			lin.events[cur] = true
			if cur, err = ad.sameKeyParent(cur, key); err != nil {
				return false, false, err
			}
		}
		ad.lineage[key] = lin
	}
	if lin.u == "" || !lin.events[z] {
		return false, false, nil
	}
	return z == lin.u, z != lin.u, nil
}

// chainOf is the union of the auth chains of events, except that it does not descend
// below an event of the unconflicted map or of its same-key lineage: such an event's
// own auth chain is part of every state's full auth chain, so none of it can be in
// the auth difference (the event itself is kept and tested like any other).
func (ad *authDiff) chainOf(ids []string) (map[string]bool, error) {
	seen := map[string]bool{}
	stack := append([]string(nil), ids...)
	for len(stack) > 0 {
		id := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[id] { // reached through the walk, not a starting event
			if ad.floors[id] {
				continue
			}
			self, below, err := ad.inLineage(id)
			if err != nil {
				return nil, err
			}
			if self || below {
				continue
			}
		}
		auth, err := ad.idx.AuthEvents(id)
		if err != nil {
			return nil, err
		}
		for _, a := range auth {
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
// otherwise by walking auth_events edges forward from x (AuthChildren) until an
// unconflicted event is met.
func (ad *authDiff) inUnconflictedChain(x string) (bool, error) {
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
	seen := map[string]bool{x: true}
	queue := []string{x}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		kids, err := ad.idx.AuthChildren(cur)
		if err != nil {
			return false, err
		}
		for _, k := range kids {
			if seen[k] {
				continue
			}
			seen[k] = true
			if ad.floors[k] {
				ad.memo[x] = true
				return true, nil
			}
			key, isState, err := ad.idx.StateKeyOf(k)
			if err != nil {
				return false, err
			}
			if isState {
				id, ok, err := ad.unconflicted(key)
				if err != nil {
					return false, err
				}
				if ok && id == k {
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
