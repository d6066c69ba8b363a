package gen

import (
	"slices"
	"strings"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/mtxdb/mtxdb/roomstate"
)

// What resolve passes to gomatrixserverlib's ResolveStateConflictsV2, for every
// room version generated (10, 11 and 12):
//
//   - conflicted: for every key whose value is not the same in every input state
//     (absent from some included, the spec's rule), the distinct events the states
//     give it.
//   - auth events: the auth chain of those events (their auth_events, transitively).
//   - unconflicted: the auth-type entries (create, power levels, join rules,
//     members, third-party invites) of the first state, conflicted keys left out.
//     That is what resolver.Resolve passes for v10 and v11. On a large state (more
//     than Options.ExactBelow entries) only the entries the algorithm can read are
//     passed: create, power levels, join rules, the memberships of the senders and
//     targets of the conflicted and auth-chain events, and the unconflicted events
//     inside the auth chain. The algorithm reads the unconflicted set only to skip
//     auth-difference events that are unconflicted, and as the partial state it
//     authorises conflicted events against (by sender and target), so the result
//     for the conflicted keys is the same.
//
// Room version 12 is resolved with state res v2, not v2.1: at the pinned version
// gomatrixserverlib's v2.1 entry point (ResolveConflictsNew) panics on every
// resolution with a conflicted key unless the conflicted events are also passed as
// auth events (its conflicted-subgraph walk inserts authEventMap[id] for them, nil
// otherwise), and then panics on every conflicted power event in a v12 room
// ("getPowerLevelFromAuthEvents: missing resolved create event": v2.1 starts from
// an empty partial state, but its Kahn tie-break needs the resolved create event
// for v12's privileged creators). meta.json records the resolver used.
//
// Only the conflicted keys are read back from the result; the unconflicted ones
// are those of the first state.

type resolveStats struct {
	resolutions    int // resolutions with two or more distinct states
	conflictedKeys int
	reduced        int // resolutions that passed the reduced unconflicted set
	panics         int
	maxConflicted  int
	maxInputStates int
}

// authTypes are the state types the authorisation rules read.
var authTypes = map[string]bool{
	spec.MRoomCreate:           true,
	spec.MRoomPowerLevels:      true,
	spec.MRoomJoinRules:        true,
	spec.MRoomMember:           true,
	spec.MRoomThirdPartyInvite: true,
}

func keyType(k string) string {
	if i := strings.IndexByte(k, 0); i >= 0 {
		return k[:i]
	}
	return k
}

// resolve returns the state before an event with the given prev_events. Results
// are memoised by prev set: servers build on the same extremities many times.
func (r *room) resolve(prevs []int32) pmap {
	key := make([]byte, 0, 4*len(prevs))
	sorted := slices.Clone(prevs)
	slices.Sort(sorted)
	for _, p := range sorted {
		key = append(key, byte(p), byte(p>>8), byte(p>>16), byte(p>>24))
	}
	if st, ok := r.memo[string(key)]; ok {
		return st
	}
	st := r.resolveUncached(sorted)
	if len(r.memo) >= 1<<14 {
		clear(r.memo)
	}
	r.memo[string(key)] = st
	return st
}

func (r *room) resolveUncached(prevs []int32) pmap {
	var states []pmap
	for _, p := range prevs {
		st := r.events[p].after
		if !slices.ContainsFunc(states, func(x pmap) bool { return x.root == st.root }) {
			states = append(states, st)
		}
	}
	switch len(states) {
	case 0:
		return pmap{}
	case 1:
		return states[0]
	}
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

	var conflicted []int32
	perState := make([][]int32, len(states)) // each state's events for the conflicted keys
	for _, k := range keys {
		var vals []int32
		for i, st := range states {
			if v, ok := st.get(k); ok {
				perState[i] = append(perState[i], v)
				if !slices.Contains(vals, v) {
					vals = append(vals, v)
				}
			}
		}
		slices.SortFunc(vals, func(a, b int32) int { return strings.Compare(r.events[a].id, r.events[b].id) })
		conflicted = append(conflicted, vals...)
	}
	chain := r.authChain(conflicted)
	exact := states[0].size <= r.opts.ExactBelow

	var u []gomatrixserverlib.PDU
	if exact {
		states[0].each(func(k string, v int32) {
			if !keySet[k] && authTypes[keyType(k)] {
				u = append(u, r.events[v].pdu)
			}
		})
	} else {
		r.res.reduced++
		u = r.reducedUnconflicted(states[0], keySet, conflicted, chain)
	}
	result := r.resolveV2(r.pdus(conflicted), u, r.pdus(chain))

	resolved := map[string]int32{}
	for _, p := range result {
		if sk := p.StateKey(); sk != nil {
			k := stateKey(p.Type(), *sk)
			if keySet[k] {
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

func (r *room) isRejected(id string) bool {
	i, ok := r.byID[id]
	return ok && r.events[i].rejected
}

func (r *room) pdus(idx []int32) []gomatrixserverlib.PDU {
	out := make([]gomatrixserverlib.PDU, len(idx))
	for i, x := range idx {
		out[i] = r.events[x].pdu
	}
	return out
}

func (r *room) allPDUs(st pmap) []gomatrixserverlib.PDU {
	out := make([]gomatrixserverlib.PDU, 0, st.size)
	st.each(func(_ string, v int32) { out = append(out, r.events[v].pdu) })
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

// reducedUnconflicted is the part of the unconflicted auth state that the v2
// algorithm reads (see the comment at the top of this file).
func (r *room) reducedUnconflicted(st pmap, conflictedKeys map[string]bool, conflicted, chain []int32) []gomatrixserverlib.PDU {
	want := map[string]bool{
		stateKey(spec.MRoomCreate, ""):      true,
		stateKey(spec.MRoomPowerLevels, ""): true,
		stateKey(spec.MRoomJoinRules, ""):   true,
	}
	for _, set := range [][]int32{conflicted, chain} {
		for _, x := range set {
			e := r.events[x]
			want[stateKey(spec.MRoomMember, string(e.pdu.SenderID()))] = true
			if e.member != "" {
				want[e.key] = true
			}
			if e.key != "" {
				if v, ok := st.get(e.key); ok && v == x {
					want[e.key] = true
				}
			}
		}
	}
	keys := make([]string, 0, len(want))
	for k := range want {
		if !conflictedKeys[k] {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []gomatrixserverlib.PDU
	for _, k := range keys {
		if v, ok := st.get(k); ok {
			out = append(out, r.events[v].pdu)
		}
	}
	return out
}

// resolveV2 runs ResolveStateConflictsV2; a panic inside it (none seen) yields no
// result, which deletes the conflicted keys.
func (r *room) resolveV2(conflicted, unconflicted, chain []gomatrixserverlib.PDU) (out []gomatrixserverlib.PDU) {
	defer func() {
		if rec := recover(); rec != nil {
			r.res.panics++
			out = nil
		}
	}()
	return gomatrixserverlib.ResolveStateConflictsV2(conflicted, unconflicted, chain, roomstate.UserIDForSender, r.isRejected)
}
