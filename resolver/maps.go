package resolver

import (
	"fmt"
	"slices"
	"sort"

	"github.com/mtxdb/mtxdb/pdu"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// StateMap is a whole room state: (event_type, state_key) -> event ID.
type StateMap map[Key]string

// ResolveMaps resolves whole state maps by the algorithm of the room version
// (Matrix spec v1.19, each room version's "State resolution": v1 for room version
// 1, v2 for 2-11, v2.1 for 12). Every event of every map and of their auth chains
// must be available from src. It is the reference path: it reads every event of
// every map, so it costs what the room costs, not what the conflict costs.
// Replay's resolutions over stored snapshots must agree with it.
func ResolveMaps(version gomatrixserverlib.RoomVersion, maps []StateMap, src EventSource) (StateMap, error) {
	verImpl, err := gomatrixserverlib.GetRoomVersion(version)
	if err != nil {
		return nil, fmt.Errorf("%w: %q", pdu.ErrUnknownRoomVersion, version)
	}
	if len(maps) == 0 {
		return StateMap{}, nil
	}
	algo := verImpl.StateResAlgorithm()

	// Split: a key is unconflicted when every map has it with the same event.
	unconflicted := StateMap{}
	conflicted := map[string]bool{}
	keys := map[Key]bool{}
	for _, m := range maps {
		for k := range m {
			keys[k] = true
		}
	}
	for k := range keys {
		v, same := maps[0][k]
		for _, m := range maps[1:] {
			if w, ok := m[k]; !ok || w != v || !same {
				same = false
				break
			}
		}
		if same {
			unconflicted[k] = v
			continue
		}
		for _, m := range maps {
			if w, ok := m[k]; ok {
				conflicted[w] = true
			}
		}
	}
	if len(conflicted) == 0 {
		return unconflicted, nil
	}
	if algo == gomatrixserverlib.StateResV1 {
		return resolveV1Maps(maps, src)
	}

	// Auth difference: the union of the full auth chains of the maps minus their
	// intersection, where a map's full auth chain is the union of its events' chains.
	st := newStateRes(src)
	chains := make([]map[string]bool, len(maps))
	for i, m := range maps {
		chains[i] = map[string]bool{}
		for _, id := range m {
			c, err := st.authChain(id)
			if err != nil {
				return nil, err
			}
			for _, a := range c {
				chains[i][a] = true
			}
		}
	}
	full := map[string]bool{}
	for id := range conflicted {
		full[id] = true
	}
	for _, c := range chains {
		for id := range c {
			for _, o := range chains {
				if !o[id] {
					full[id] = true
					break
				}
			}
		}
	}
	if algo == gomatrixserverlib.StateResV2_1 {
		sub, err := conflictedSubgraph(st, conflicted)
		if err != nil {
			return nil, err
		}
		for id := range sub {
			full[id] = true
		}
	}
	in := v2Input{algo: algo, full: sortedIDs(full), unconflicted: func(k Key) (string, bool, error) {
		v, ok := unconflicted[k]
		return v, ok, nil
	}}
	if in.create, err = findCreate(st, maps); err != nil {
		return nil, err
	}
	overlay, err := resolveV2(in, src)
	if err != nil {
		return nil, err
	}
	out := StateMap{}
	for k, v := range overlay {
		out[k] = v
	}
	for k, v := range unconflicted { // step 5
		out[k] = v
	}
	return out, nil
}

// conflictedSubgraph returns the events that lie on an auth_events path between two
// conflicted events (descendants of one and ancestors of another), the conflicted
// events included (Matrix spec v1.19, room version 12, "State resolution",
// "Definitions"; MSC4297).
//
// Every such event is both in the auth chain of a conflicted event and a
// descendant of one, so either set bounds the search. Without a GraphSource the
// whole auth chain of the conflicted events is walked. With one, the ancestors
// walk stops below the lowest conflicted event, and a descendants walk through
// AuthChildren bounded by the highest conflicted event runs in lockstep with it, and the subgraph is taken from whichever closes
// first. A conflict between a member's first join and a recent membership has a
// vast ancestor set (every power-levels event since, and their senders'
// memberships) and usually a small descendant set.
func conflictedSubgraph(st *stateRes, conflicted map[string]bool) (map[string]bool, error) {
	ids := sortedIDs(conflicted)
	floor, top, err := st.orderRange(ids)
	if err != nil {
		return nil, err
	}
	w, _, err := st.lockstep(ids, floor, ids, top)
	if err != nil {
		return nil, err
	}
	defer releaseWalk(w)
	w.setTargets(conflicted)
	out := map[string]bool{}
	for id := range conflicted {
		out[id] = true
	}
	if err := w.forSeenReaching(func(id string) { out[id] = true }); err != nil {
		return nil, err
	}
	return out, nil
}

// lockstep walks the auth graph from upFrom towards ancestors, leaving out events
// numbered below floor, and, when the source is a GraphSource and floor is set, from downFrom towards descendants, leaving out
// events numbered top or higher, one event of each in turn, and returns the walk
// that closes first (up: whether it is the ancestors walk). Without a GraphSource
// the ancestors walk covers whole auth chains. Over the roomResolver it walks
// the auth index by handle (lockstepHandles). The caller hands the walk to
// releaseWalk once done with it.
func (st *stateRes) lockstep(upFrom []string, floor int64, downFrom []string, top int64) (w walkSet, up bool, err error) {
	if st.r != nil && floor != noFloor {
		return st.lockstepHandles(upFrom, floor, downFrom, top)
	}
	o := st.graph
	anc := &reachWalk{next: st.authEventsOf, seen: map[string]bool{}, stack: slices.Clone(upFrom)}
	if o != nil && floor != noFloor {
		anc.keep = func(id string) (bool, error) {
			n, err := o.AuthOrder(id)
			return n >= floor, err
		}
	}
	var desc *reachWalk
	if o != nil && anc.keep != nil && walkDirection != walkUp {
		desc = &reachWalk{next: o.AuthChildren, seen: map[string]bool{}, stack: slices.Clone(downFrom),
			keep: func(id string) (bool, error) {
				n, err := o.AuthOrder(id)
				return n < top, err
			}}
	}
	for {
		if desc == nil || walkDirection != walkDown {
			if anc.done() {
				return anc, true, nil
			}
			if err := anc.step(); err != nil {
				return nil, false, err
			}
		}
		if desc != nil {
			if desc.done() {
				return desc, false, nil
			}
			if err := desc.step(); err != nil {
				return nil, false, err
			}
		}
	}
}

// walkDirection forces one walk of lockstep (tests compare them).
var walkDirection = walkEither

const (
	walkEither = iota
	walkUp
	walkDown
)

// reachWalk is one walk of lockstep: from its start events along next (auth
// events: ancestors; auth children: descendants), over the events keep admits.
type reachWalk struct {
	next  func(id string) ([]string, error)
	keep  func(id string) (bool, error) // nil: every event
	seen  map[string]bool               // reached and kept
	stack []string
	// After the walk: targets, and which events lead to one (memo of reaches).
	targets map[string]bool
	memo    map[string]int8 // 1 visiting, 2 reaches, 3 does not
}

func (w *reachWalk) done() bool { return len(w.stack) == 0 }

// step expands one event of the walk.
func (w *reachWalk) step() error {
	cur := w.stack[len(w.stack)-1]
	w.stack = w.stack[:len(w.stack)-1]
	next, err := w.next(cur)
	if err != nil {
		return err
	}
	for _, a := range next {
		if w.seen[a] {
			continue
		}
		if w.keep != nil {
			ok, err := w.keep(a)
			if err != nil {
				return fmt.Errorf("%w: %s: %v", errNoEvent, a, err)
			}
			if !ok {
				continue
			}
		}
		w.seen[a] = true
		w.stack = append(w.stack, a)
	}
	return nil
}

// reaches reports, once the walk is done, whether a path from id along next
// through events of the walk ends at a target: for the ancestors walk, whether
// id descends from a target; for the descendants walk, whether it is an ancestor
// of one.
func (w *reachWalk) reaches(id string) (bool, error) {
	if w.memo == nil {
		w.memo = map[string]int8{}
	}
	switch w.memo[id] {
	case 1:
		return false, fmt.Errorf("%w: auth_events cycle at %s", ErrResolution, id)
	case 2:
		return true, nil
	case 3:
		return false, nil
	}
	w.memo[id] = 1
	next, err := w.next(id)
	if err != nil {
		return false, err
	}
	r := false
	for _, a := range next {
		if w.targets[a] {
			r = true
		}
		if w.seen[a] {
			ra, err := w.reaches(a)
			if err != nil {
				return false, err
			}
			r = r || ra
		}
	}
	w.memo[id] = 3
	if r {
		w.memo[id] = 2
	}
	return r, nil
}

// findCreate returns the room's m.room.create from the maps or their auth events.
func findCreate(st *stateRes, maps []StateMap) (gomatrixserverlib.PDU, error) {
	ck := Key{Type: spec.MRoomCreate, StateKey: ""}
	for _, m := range maps {
		if id, ok := m[ck]; ok {
			return st.full(id)
		}
	}
	for _, m := range maps {
		for _, id := range m {
			c, err := st.authChain(id)
			if err != nil {
				return nil, err
			}
			for _, a := range c {
				p, err := st.event(a)
				if err != nil {
					return nil, err
				}
				if p.Type() == spec.MRoomCreate && p.StateKeyEquals("") {
					return st.full(a) // its content is read (the creators)
				}
			}
		}
	}
	return nil, fmt.Errorf("%w: no m.room.create in the states or their auth chains", ErrResolution)
}

// resolveV1Maps runs gomatrixserverlib's state resolution v1 over whole maps, with the
// spec's v1 split (a key is conflicted when the maps give it two or more events), the
// same auth input as the storage path: the conflicted events' auth chains, then the
// unconflicted auth state.
func resolveV1Maps(maps []StateMap, src EventSource) (StateMap, error) {
	byKey := map[Key]map[string]bool{}
	for _, m := range maps {
		for k, v := range m {
			if byKey[k] == nil {
				byKey[k] = map[string]bool{}
			}
			byKey[k][v] = true
		}
	}
	out := StateMap{}
	// Events are read parsed (full), never as a source's light form:
	// gomatrixserverlib's v1 reads their depth and content.
	st := newStateRes(src)
	var conflicted, unconflictedAuth []gomatrixserverlib.PDU
	chain := map[string]bool{}
	for k, vs := range byKey {
		ids := sortedIDs(vs)
		if len(ids) == 1 {
			out[k] = ids[0]
			if authTypes[k.Type] {
				p, err := st.full(ids[0])
				if err != nil {
					return nil, err
				}
				unconflictedAuth = append(unconflictedAuth, p)
			}
			continue
		}
		for _, id := range ids {
			p, err := st.full(id)
			if err != nil {
				return nil, err
			}
			conflicted = append(conflicted, p)
			c, err := st.authChain(id)
			if err != nil {
				return nil, err
			}
			for _, a := range c {
				chain[a] = true
			}
		}
	}
	var auth []gomatrixserverlib.PDU
	for _, id := range sortedIDs(chain) {
		p, err := st.full(id)
		if err != nil {
			return nil, err
		}
		auth = append(auth, p)
	}
	resolved, err := resolveV1(conflicted, append(auth, unconflictedAuth...))
	if err != nil {
		return nil, err
	}
	for k, v := range resolved {
		out[k] = v
	}
	return out, nil
}

func sortedIDs(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for id := range set {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}
