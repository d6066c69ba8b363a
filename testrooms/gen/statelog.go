package gen

import (
	"fmt"
	"slices"

	"github.com/mtxdb/mtxdb/resolver"
)

// stateLog records every state the simulation gives an event (before or after
// it) or resolves, compactly: each state is a record naming an earlier record
// (its parent) and the entries where it differs from it, with state keys
// interned as int32. The room keeps a state's pmap only while the simulation may
// read it again (room.dropDead); materialize rebuilds the states the files and
// the reference need after the run, from the records.
//
// Record 0 is the empty state. A room of n events has at most about 2n
// records (a state after each state event, a resolved state per resolution) of
// 16 bytes, and 8 bytes per differing entry.
type stateLog struct {
	parent []int32 // by record; -1 for record 0
	start  []int32 // by record: its entries are keys/vals[start[i]:start[i+1]]
	size   []int32 // by record: the state's number of entries
	keys   []int32 // interned state keys
	vals   []int32 // event indices, -1 for a key the state does not have
	// keyIDs interns the state keys; keyNames[id] is the key.
	keyIDs   map[string]int32
	keyNames []string
}

func newStateLog() *stateLog {
	return &stateLog{parent: []int32{-1}, start: []int32{0, 0}, size: []int32{0}, keyIDs: map[string]int32{}}
}

// intern returns k's key ID.
func (l *stateLog) intern(k string) int32 {
	if id, ok := l.keyIDs[k]; ok {
		return id
	}
	id := int32(len(l.keyNames))
	l.keyIDs[k] = id
	l.keyNames = append(l.keyNames, k)
	return id
}

// record gives st (a state made from parent by set and del) a record, unless
// it has one, and returns st with it.
func (r *room) record(st, parent pmap) pmap {
	if st.rec >= 0 {
		return st
	}
	if parent.rec < 0 {
		panic("gen: stateLog: parent state not recorded")
	}
	l := r.log
	diff(parent, st, func(k string) {
		v := int32(-1)
		if x, ok := st.get(k); ok {
			v = x
		}
		l.keys = append(l.keys, l.intern(k))
		l.vals = append(l.vals, v)
	})
	st.rec = int32(len(l.parent))
	l.parent = append(l.parent, parent.rec)
	l.start = append(l.start, int32(len(l.keys)))
	l.size = append(l.size, int32(st.size))
	return st
}

// materialize rebuilds the states of the records in want (pmaps with their
// records, sharing structure where their records do), in one pass over the log
// that keeps a state only while a later record builds on it or it is wanted.
func (l *stateLog) materialize(want map[int32]bool) map[int32]pmap {
	n := len(l.parent)
	kids := make([]int32, n)
	for _, p := range l.parent[1:] {
		kids[p]++
	}
	out := make(map[int32]pmap, len(want))
	live := map[int32]pmap{0: {}}
	for i := int32(1); int(i) < n; i++ {
		p := l.parent[i]
		st := live[p]
		if kids[p]--; kids[p] == 0 {
			delete(live, p)
		}
		for j := l.start[i]; j < l.start[i+1]; j++ {
			if v := l.vals[j]; v < 0 {
				st = st.del(l.keyNames[l.keys[j]])
			} else {
				st = st.set(l.keyNames[l.keys[j]], v)
			}
		}
		if int32(st.size) != l.size[i] {
			panic(fmt.Sprintf("gen: stateLog: record %d rebuilt with %d entries, recorded with %d", i, st.size, l.size[i]))
		}
		st.rec = i
		if kids[i] > 0 {
			live[i] = st
		}
		if want[i] {
			out[i] = st
		}
	}
	if want[0] {
		out[0] = pmap{}
	}
	return out
}

// afterOf returns the state after event x: the one the event keeps, or else
// the one materialized for it. It panics if neither is there (a state the
// simulation dropped as dead was read again).
func (r *room) afterOf(x int32) pmap {
	st := r.events[x].after
	if st.root != nil || st.rec == 0 {
		return st
	}
	if m, ok := r.states[st.rec]; ok {
		return m
	}
	panic(fmt.Sprintf("gen: the state after event %d (record %d) is neither kept nor materialized", x, st.rec))
}

// beforeOf returns the state before event x, materialized (or the state after
// it when that is the same state).
func (r *room) beforeOf(x int32) pmap {
	rec := r.events[x].beforeRec
	if rec == r.events[x].after.rec {
		return r.afterOf(x)
	}
	if m, ok := r.states[rec]; ok || rec == 0 {
		return m
	}
	panic(fmt.Sprintf("gen: the state before event %d (record %d) is not materialized", x, rec))
}

// dropEvery is how many held events make the simulation look for dead states
// (room.dropDead).
var dropEvery = 4096

// mayResolve reports whether the simulation may still resolve the state after
// event x: it is a forward extremity of a server, or the origin or a resident
// server has not received it yet (when it does, it may become one). A server
// that is not resident takes the origin's view when it joins (room.join). A
// rejected event is never a forward extremity.
func (r *room) mayResolve(x int32) bool {
	if r.events[x].rejected {
		return false
	}
	for _, s := range r.servers {
		if (s.idx == 0 || s.joined) && !s.known[x] {
			return true
		}
		if slices.Contains(s.extrem, x) {
			return true
		}
	}
	return false
}

// dropDead drops the after states of held events the simulation will not
// resolve again (their records stay).
func (r *room) dropDead() {
	keep := r.held[:0]
	for _, x := range r.held {
		if r.mayResolve(x) {
			keep = append(keep, x)
			continue
		}
		e := r.events[x]
		e.after = pmap{rec: e.after.rec}
	}
	r.held = keep
}

// materializeFor drops every after state the events keep and rebuilds, from the
// stateLog, the states the rest of the run reads: after the events
// expected_state.jsonl records and the forward extremities, and for the events
// the reference checks, the state before and after each and after its
// prev_events.
func (r *room) materializeFor() {
	for _, x := range r.held {
		e := r.events[x]
		e.after = pmap{rec: e.after.rec}
	}
	r.held = nil
	want := map[int32]bool{}
	afters := func(xs []int32) {
		for _, x := range xs {
			want[r.events[x].after.rec] = true
		}
	}
	afters(r.sampled)
	afters(r.tips())
	if !r.opts.NoReference {
		checked, _ := r.referenceSample(r.sampled)
		afters(checked)
		for _, x := range checked {
			want[r.events[x].beforeRec] = true
			afters(r.events[x].prev)
		}
	}
	r.states = r.log.materialize(want)
}

// releaseSim lets go of what only the simulation's own resolutions and
// authorisations use (the memo, the resolver's cache, the authorisation
// outcomes, the servers' views): a resolution after it starts from empty
// caches, with the same result.
func (r *room) releaseSim() {
	r.memo = map[string]pmap{}
	r.resCache = resolver.NewCache()
	r.plainAllowed = map[string]error{}
	clear(r.plCache)
	clear(r.jrCache)
	for _, s := range r.servers {
		s.known, s.refd = nil, nil
	}
}
