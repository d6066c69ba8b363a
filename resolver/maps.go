package resolver

import (
	"fmt"
	"slices"
	"sort"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/mtxdb/mtxdb/roomstate"
)

// StateMap is a whole room state: (event_type, state_key) -> event ID.
type StateMap map[Key]string

// ResolveMaps resolves whole state maps by the algorithm of the room version (spec,
// "Room Versions": v1 for room versions 1, v2 for 2-11, v2.1 for 12). Every event of
// every map and of their auth chains must be available from src. It is the reference
// path: it reads every event of every map, so it costs what the room costs, not what
// the conflict costs. Storage-backed resolution (Resolver.Resolve) must agree with it.
func ResolveMaps(version gomatrixserverlib.RoomVersion, maps []StateMap, src EventSource) (StateMap, error) {
	verImpl, err := gomatrixserverlib.GetRoomVersion(version)
	if err != nil {
		return nil, fmt.Errorf("%w: %q", roomstate.ErrUnknownRoomVersion, version)
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
	st := &stateRes{src: src, pdus: map[string]gomatrixserverlib.PDU{}}
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
// events included (MSC4297, room version 12).
//
// Every such event is both in the auth chain of a conflicted event and a
// descendant of one, so either set bounds the search. Without an AuthOrderer the
// whole auth chain of the conflicted events is walked. With one, the ancestors
// walk stops below the lowest conflicted event; if the source also lists auth
// children (authChildLister), a descendants walk bounded by the highest conflicted
// event runs in lockstep with it, and the subgraph is taken from whichever closes
// first. A conflict between a member's first join and a recent membership has a
// vast ancestor set (every power-levels event since, and their senders'
// memberships) and usually a small descendant set.
func conflictedSubgraph(st *stateRes, conflicted map[string]bool) (map[string]bool, error) {
	ids := sortedIDs(conflicted)
	floor, top, err := st.orderRange(ids)
	if err != nil {
		return nil, err
	}
	up := &subgraphWalk{st: st, conflicted: conflicted, next: st.authEventsOf, seen: map[string]bool{}, stack: slices.Clone(ids)}
	if o, ok := st.src.(AuthOrderer); ok && floor != noFloor {
		up.keep = func(id string) (bool, error) {
			n, err := o.AuthOrder(id)
			return n >= floor, err
		}
	}
	down := (*subgraphWalk)(nil)
	if c, ok := st.src.(authChildLister); ok && up.keep != nil && subgraphDirection != subgraphUp {
		o := st.src.(AuthOrderer)
		down = &subgraphWalk{st: st, conflicted: conflicted, next: c.AuthChildren, seen: map[string]bool{}, stack: slices.Clone(ids),
			keep: func(id string) (bool, error) {
				n, err := o.AuthOrder(id)
				return n < top, err
			}}
	}
	for {
		if down == nil || subgraphDirection != subgraphDown {
			if up.done() {
				return up.subgraph()
			}
			if err := up.step(); err != nil {
				return nil, err
			}
		}
		if down != nil {
			if down.done() {
				return down.subgraph()
			}
			if err := down.step(); err != nil {
				return nil, err
			}
		}
	}
}

// subgraphDirection forces one walk of conflictedSubgraph (tests compare them).
var subgraphDirection = subgraphEither

const (
	subgraphEither = iota
	subgraphUp
	subgraphDown
)

// authChildLister is implemented by event sources that can list the events
// citing an event in their auth_events (AuthIndex.AuthChildren: at least every
// accepted state event that does; an event on a path between two conflicted
// events is one).
type authChildLister interface {
	AuthChildren(eventID string) ([]string, error)
}

// subgraphWalk is one direction of conflictedSubgraph's search: from the
// conflicted events along next (auth events: ancestors; auth children:
// descendants), over the events keep admits.
type subgraphWalk struct {
	st         *stateRes
	conflicted map[string]bool
	next       func(id string) ([]string, error)
	keep       func(id string) (bool, error) // nil: every event
	seen       map[string]bool               // reached and kept
	stack      []string
}

func (w *subgraphWalk) done() bool { return len(w.stack) == 0 }

// step expands one event of the walk.
func (w *subgraphWalk) step() error {
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

// subgraph returns, once the walk is done, the conflicted events and the events
// reached that lead on (along next, within the walk) to a conflicted event: for
// the ancestors walk, the reached events that descend from a conflicted one; for
// the descendants walk, those that are ancestors of one.
func (w *subgraphWalk) subgraph() (map[string]bool, error) {
	reaches := map[string]bool{}
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(id string) (bool, error)
	visit = func(id string) (bool, error) {
		if state[id] == 2 {
			return reaches[id], nil
		}
		if state[id] == 1 {
			return false, fmt.Errorf("%w: auth_events cycle at %s", ErrResolution, id)
		}
		state[id] = 1
		next, err := w.next(id)
		if err != nil {
			return false, err
		}
		r := false
		for _, a := range next {
			if w.conflicted[a] {
				r = true
			}
			if w.seen[a] {
				ra, err := visit(a)
				if err != nil {
					return false, err
				}
				r = r || ra
			}
		}
		state[id] = 2
		reaches[id] = r
		return r, nil
	}
	out := map[string]bool{}
	for id := range w.conflicted {
		out[id] = true
	}
	for id := range w.seen {
		r, err := visit(id)
		if err != nil {
			return nil, err
		}
		if r {
			out[id] = true
		}
	}
	return out, nil
}

// findCreate returns the room's m.room.create from the maps or their auth events.
func findCreate(st *stateRes, maps []StateMap) (gomatrixserverlib.PDU, error) {
	ck := Key{spec.MRoomCreate, ""}
	for _, m := range maps {
		if id, ok := m[ck]; ok {
			return st.event(id)
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
					return p, nil
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
	st := &stateRes{src: src, pdus: map[string]gomatrixserverlib.PDU{}}
	var conflicted, unconflictedAuth []gomatrixserverlib.PDU
	chain := map[string]bool{}
	for k, vs := range byKey {
		ids := sortedIDs(vs)
		if len(ids) == 1 {
			out[k] = ids[0]
			if authTypes[k.Type] {
				p, err := st.event(ids[0])
				if err != nil {
					return nil, err
				}
				unconflictedAuth = append(unconflictedAuth, p)
			}
			continue
		}
		for _, id := range ids {
			p, err := st.event(id)
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
		p, err := st.event(id)
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
