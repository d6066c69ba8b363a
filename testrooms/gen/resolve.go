package gen

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/mtxdb/mtxdb/pdu"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/mtxdb/mtxdb/resolver"
)

// State resolution of the simulation (the states servers build events from;
// what the room's files record is the reference's: reference.go). By default the
// generator resolves with the resolver package's
// implementation of the spec (resolver.ResolveConflicts: state res v2 for room
// versions 10 and 11, v2.1 for 12), the same code resolver.Replay runs over stored
// snapshots, given the same conflicted part:
//
//   - the conflicted keys: every key whose value is not the same in every input
//     state (absent from some included, the spec's rule), from a pmap diff;
//   - per input state, the events it gives the conflicted keys;
//   - the unconflicted map: lookups in the first input state, conflicted keys
//     reported absent;
//   - the room's m.room.create.
//
// The events and the auth graph (auth_events, auth children, state keys) come from
// the generator's arrays (room implements resolver.EventSource and
// resolver.AuthIndex). The result's changes are applied to the first input state.
//
// Options.Resolver "gmsl" resolves v10 and v11 rooms with gomatrixserverlib's
// ResolveStateConflictsV2 instead (the conflicted events, the first state's other
// entries as unconflicted, the conflicted events' auth chain), for
// differential experiments; where gomatrixserverlib departs from the spec the
// reference counts mismatches (and, with NoReference, the replay mismatches).

// resolverName is meta.json's generator.resolver: where the expected state comes
// from, and what resolved the simulation's states.
func (r *room) resolverName() string {
	sim := "mtxdb resolver.ResolveConflicts (spec v2 / v2.1)"
	if r.opts.Resolver == ResolverGMSL {
		sim = "gomatrixserverlib ResolveStateConflictsV2 (state res v2) at the pinned version; unconflicted = the first state's other entries; auth events = auth chain of the conflicted events"
	}
	if r.opts.NoReference {
		return sim + " (no reference: the expected state is the generator's own)"
	}
	return "expected state: resolver/specres, the reference implementation (spec v1.16 state res v2 / v2.1 over whole state maps), stepwise over the generator's states; simulation: " + sim
}

type resolveStats struct {
	resolutions    int // resolutions with two or more distinct states
	conflictedKeys int
	maxConflicted  int
	maxInputStates int
	authDifference int
	fullConflicted int
}

func keyType(k string) string {
	if i := strings.IndexByte(k, 0); i >= 0 {
		return k[:i]
	}
	return k
}

func splitKey(k string) resolver.Key {
	i := strings.IndexByte(k, 0)
	return resolver.Key{Type: k[:i], StateKey: k[i+1:]}
}

// resolve returns the state before an event with the given prev_events: the
// resolution of the distinct states after them (distinct by stateLog record: a
// record names one state object for the whole run), recorded in the stateLog.
// Results are memoised by the set of input records. Most prev sets repeat a
// state set: events that change no state share the state before them.
func (r *room) resolve(prevs []int32) pmap {
	states := make([]pmap, 0, len(prevs))
	for _, p := range prevs {
		st := r.afterOf(p)
		if !slices.ContainsFunc(states, func(x pmap) bool { return x.rec == st.rec }) {
			states = append(states, st)
		}
	}
	switch len(states) {
	case 0:
		return pmap{}
	case 1:
		return states[0]
	}
	recs := make([]int32, len(states))
	for i, st := range states {
		recs[i] = st.rec
	}
	slices.Sort(recs)
	key := make([]byte, 0, 4*len(recs))
	for _, p := range recs {
		key = binary.LittleEndian.AppendUint32(key, uint32(p))
	}
	if st, ok := r.memo[string(key)]; ok {
		return st
	}
	// The resolved entries do not depend on the order of the input states (nor on
	// which one is the base the changes are applied to).
	st := r.record(r.resolveStates(states), states[0])
	if len(r.memo) >= 1<<16 {
		clear(r.memo)
	}
	r.memo[string(key)] = st
	return st
}

// corruptResolution, when set (tests), replaces the generator's resolution of
// the given states: a wrong resolution the reference must catch.
var corruptResolution func(r *room, states []pmap, resolved pmap) pmap

// resolveStates resolves two or more distinct states.
func (r *room) resolveStates(states []pmap) pmap {
	st := r.resolveDistinct(states)
	if corruptResolution != nil {
		st = corruptResolution(r, states, st)
	}
	return st
}

func (r *room) resolveDistinct(states []pmap) pmap {
	keySet := map[string]bool{}
	for _, st := range states[1:] {
		diff(states[0], st, func(k string) { keySet[k] = true })
	}
	if len(keySet) == 0 {
		return states[0]
	}
	r.res.resolutions++
	r.res.conflictedKeys += len(keySet)
	r.res.maxConflicted = max(r.res.maxConflicted, len(keySet))
	r.res.maxInputStates = max(r.res.maxInputStates, len(states))
	keys := make([]string, 0, len(keySet))
	for k := range keySet {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if r.opts.Resolver == ResolverGMSL {
		return r.resolveGMSL(states, keys, keySet)
	}

	in := resolver.ConflictInput{
		PerState: make([][]string, len(states)),
		Create:   r.events[0].pdu,
		Cache:    r.resCache,
	}
	for _, k := range keys {
		for i, st := range states {
			if v, ok := st.get(k); ok {
				in.PerState[i] = append(in.PerState[i], r.events[v].id)
			}
		}
	}
	base := states[0]
	in.Unconflicted = func(k resolver.Key) (string, bool, error) {
		sk := stateKey(k.Type, k.StateKey)
		if keySet[sk] {
			return "", false, nil
		}
		if v, ok := base.get(sk); ok {
			return r.events[v].id, true, nil
		}
		return "", false, nil
	}
	res, err := resolver.ResolveConflicts(in, r, r.newAuthView(base, keySet))
	if err != nil {
		if r.err == nil {
			r.err = fmt.Errorf("gen: resolve %d states (%d conflicted keys): %w", len(states), len(keys), err)
		}
		return base
	}
	r.res.authDifference += res.AuthDifference
	r.res.fullConflicted += res.FullConflicted
	out := base
	for _, k := range res.Delete {
		out = out.del(stateKey(k.Type, k.StateKey))
	}
	set := make([]string, 0, len(res.Set))
	for k := range res.Set {
		set = append(set, stateKey(k.Type, k.StateKey))
	}
	slices.Sort(set)
	for _, k := range set {
		out = out.set(k, r.byID[res.Set[splitKey(k)]])
	}
	return out
}

// authView is the resolver.AuthIndex of one resolution. It answers as the room
// does, except where it knows an event z to be a same-key ancestor of an
// unconflicted state event u (z = u, or z reached from u through the auth event
// with u's key: previous power levels, a member's previous membership): such a z
// is in the auth chain of the unconflicted state map, or in it.
//
//   - AuthEvents(z) is empty: the auth-difference walk includes z but does not go
//     on through it. The difference stays the same: an event x outside that closure
//     is reached by the same paths as before (a path through z would make x an
//     ancestor of u), and an event strictly inside it is left out of the difference
//     by resolver.ResolveConflicts either way (u descends from it), while z itself
//     is still reached wherever it was.
//   - AuthChildren(z), for z != u, is [u]: the only question asked of it is whether
//     an unconflicted state event descends from z, and u is one.
//
// Without this every resolution walks the room's power-levels and membership
// histories, which grow with the room.
type authView struct {
	*room
	base   pmap
	keySet map[string]bool
}

func (r *room) newAuthView(base pmap, keySet map[string]bool) authView {
	return authView{room: r, base: base, keySet: keySet}
}

// unconflictedOf returns the unconflicted state event with e's key, if any.
func (v authView) unconflictedOf(e *event) (int32, bool) {
	if e.key == "" || v.keySet[e.key] {
		return 0, false
	}
	return v.base.get(e.key)
}

// sameKeyAncestor reports whether z is u or reached from u through prevSame links
// (u is the unconflicted event with z's key): u's ancestor at z's lineage depth,
// found through the jump pointers, is z.
func (v authView) sameKeyAncestor(z, u int32) bool {
	return v.ancestorAt(u, v.events[z].sdepth) == z
}

// ancestorAt returns a's same-key ancestor at lineage depth d (a when not deeper).
func (v authView) ancestorAt(a int32, d int32) int32 {
	for v.events[a].sdepth > d {
		if j := v.events[a].jump; v.events[j].sdepth >= d {
			a = j
		} else {
			a = v.events[a].prevSame
		}
	}
	return a
}

// Handle implements resolver.AuthIndex: the event index.
func (v authView) Handle(id string) (int32, error) {
	i, ok := v.byID[id]
	if !ok {
		return 0, fmt.Errorf("gen: no event %s", id)
	}
	return i, nil
}

// ID implements resolver.AuthIndex.
func (v authView) ID(i int32) string { return v.events[i].id }

// AuthEventsOf implements resolver.AuthIndex (see authView).
func (v authView) AuthEventsOf(i int32) []int32 {
	if u, ok := v.unconflictedOf(v.events[i]); ok && v.sameKeyAncestor(i, u) {
		return nil
	}
	return v.events[i].auth
}

// AuthChildrenOf implements resolver.AuthIndex (see authView and room.AuthChildren).
func (v authView) AuthChildrenOf(i int32) []int32 {
	if u, ok := v.unconflictedOf(v.events[i]); ok && u != i && v.sameKeyAncestor(i, u) {
		return []int32{u}
	}
	return v.events[i].kidIdx
}

// Len implements resolver.AuthIndex: the room's events.
func (v authView) Len() int { return len(v.events) }

// UnconflictedOf implements resolver.AuthIndex.
func (v authView) UnconflictedOf(i int32) (int32, bool) { return v.unconflictedOf(v.events[i]) }

// SameKeyAncestor implements resolver.AuthIndex.
func (v authView) SameKeyAncestor(z, u int32) bool {
	return v.events[z].key == v.events[u].key && v.ancestorAt(u, v.events[z].sdepth) == z
}

// SameKeyDepth implements resolver.AuthIndex.
func (v authView) SameKeyDepth(i int32) int32 { return v.events[i].sdepth }

// SameKeyAncestorAt implements resolver.AuthIndex.
func (v authView) SameKeyAncestorAt(i, d int32) int32 { return v.ancestorAt(i, d) }

// StateKeyOfHandle implements resolver.AuthIndex.
func (v authView) StateKeyOfHandle(i int32) (resolver.Key, bool) {
	if k := v.events[i].key; k != "" {
		return splitKey(k), true
	}
	return resolver.Key{}, false
}

// Event implements resolver.EventSource.
func (r *room) Event(id string) (gomatrixserverlib.PDU, error) {
	i, ok := r.byID[id]
	if !ok {
		return nil, fmt.Errorf("gen: no event %s", id)
	}
	if r.events[i].pdu == nil && r.linesFile == nil {
		return nil, fmt.Errorf("gen: event %s: a non-state event's PDU is not kept during the run", id)
	}
	return r.pduOf(i)
}

// AuthOrder implements resolver.GraphSource with the event's index: an event's
// auth events are taken from the state before it (create), so they were created
// earlier and have lower indices.
func (r *room) AuthOrder(id string) (int64, error) {
	i, ok := r.byID[id]
	if !ok {
		return 0, fmt.Errorf("gen: no event %s", id)
	}
	return int64(i), nil
}

// Rejected implements resolver.EventSource.
func (r *room) Rejected(id string) bool {
	i, ok := r.byID[id]
	return ok && r.events[i].rejected
}

// AuthEvents implements resolver.GraphSource (a non-state event's list is
// made from its indices: only state events keep theirs).
func (r *room) AuthEvents(id string) ([]string, error) {
	i, ok := r.byID[id]
	if !ok {
		return nil, fmt.Errorf("gen: no event %s", id)
	}
	if e := r.events[i]; e.key == "" {
		return r.ids(e.auth), nil
	}
	return r.events[i].authIDs, nil
}

// AuthChildren implements resolver.GraphSource, for the one question the resolver
// asks of it (does an event of the unconflicted state map descend from id through
// auth_events?), with the same answer as the full list: it gives only the accepted
// state events that cite id. The others are dead ends: a non-state event is never an
// auth event (auth events come from the state), and a rejected event is in no state
// and every event citing it is rejected too (authorise).
func (r *room) AuthChildren(id string) ([]string, error) {
	i, ok := r.byID[id]
	if !ok {
		return nil, fmt.Errorf("gen: no event %s", id)
	}
	return r.events[i].kids, nil
}

// resolveGMSL resolves by gomatrixserverlib's ResolveStateConflictsV2 (v10, v11).
func (r *room) resolveGMSL(states []pmap, keys []string, keySet map[string]bool) pmap {
	var conflicted []int32
	for _, k := range keys {
		var vals []int32
		for _, st := range states {
			if v, ok := st.get(k); ok && !slices.Contains(vals, v) {
				vals = append(vals, v)
			}
		}
		slices.SortFunc(vals, func(a, b int32) int { return strings.Compare(r.events[a].id, r.events[b].id) })
		conflicted = append(conflicted, vals...)
	}
	var u []gomatrixserverlib.PDU
	states[0].each(func(k string, v int32) {
		if !keySet[k] {
			u = append(u, r.events[v].pdu)
		}
	})
	result, err := resolveGMSL(r.pdus(conflicted), u, r.pdus(r.authChain(conflicted)), r.Rejected)
	if err != nil && r.err == nil {
		r.err = err
	}
	resolved := map[string]int32{}
	for _, p := range result {
		if sk := p.StateKey(); sk != nil {
			if k := stateKey(p.Type(), *sk); keySet[k] {
				resolved[k] = r.byID[p.EventID()]
			}
		}
	}
	out := states[0]
	for _, k := range keys {
		if v, ok := resolved[k]; ok {
			out = out.set(k, v)
		} else {
			out = out.del(k)
		}
	}
	return out
}

func resolveGMSL(conflicted, unconflicted, chain []gomatrixserverlib.PDU, rejected func(string) bool) (out []gomatrixserverlib.PDU, err error) {
	defer func() {
		if rec := recover(); rec != nil {
			out, err = nil, fmt.Errorf("gen: gomatrixserverlib ResolveStateConflictsV2 panicked: %v", rec)
		}
	}()
	return gomatrixserverlib.ResolveStateConflictsV2(conflicted, unconflicted, chain, pdu.UserIDForSender, rejected), nil
}

func (r *room) pdus(idx []int32) []gomatrixserverlib.PDU {
	out := make([]gomatrixserverlib.PDU, len(idx))
	for i, x := range idx {
		out[i] = r.events[x].pdu
	}
	return out
}

// authChain returns the auth chain of the given events, sorted by event index.
func (r *room) authChain(idx []int32) []int32 {
	seen := map[int32]bool{}
	stack := slices.Clone(idx)
	var out []int32
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, a := range r.events[x].auth {
			if !seen[a] {
				seen[a] = true
				out = append(out, a)
				stack = append(stack, a)
			}
		}
	}
	slices.Sort(out)
	return out
}
