package resolver

import (
	"fmt"
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
func conflictedSubgraph(st *stateRes, conflicted map[string]bool) (map[string]bool, error) {
	// Every candidate is in the auth chain of some conflicted event, and descends
	// from one: with an AuthOrderer source, none is numbered below the lowest
	// conflicted event.
	floor, err := st.lowestOrder(sortedIDs(conflicted))
	if err != nil {
		return nil, err
	}
	ancestors := map[string]bool{}
	chain, err := st.authChainAbove(floor, sortedIDs(conflicted)...) // one walk over the union
	if err != nil {
		return nil, err
	}
	for _, a := range chain {
		ancestors[a] = true
	}
	// reaches[x]: x's auth chain holds a conflicted event.
	reaches := map[string]bool{}
	var visit func(id string) (bool, error)
	state := map[string]int{} // 1 visiting, 2 done
	visit = func(id string) (bool, error) {
		if state[id] == 2 {
			return reaches[id], nil
		}
		if state[id] == 1 {
			return false, fmt.Errorf("%w: auth_events cycle at %s", ErrResolution, id)
		}
		state[id] = 1
		auth, err := st.authEventsOf(id)
		if err != nil {
			return false, err
		}
		r := false
		for _, a := range auth {
			if conflicted[a] {
				r = true
			}
			if ancestors[a] {
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
	for id := range conflicted {
		out[id] = true
	}
	for id := range ancestors {
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
