// Package specres is a reference implementation of Matrix state resolution v2 and
// v2.1, written from the spec's text over whole state maps, for checking package
// resolver against. It is slow on purpose: it walks whole auth chains, uses no
// index and keeps nothing between calls (within one, the events and power levels
// it has read; it numbers the events it reads, so that its walks mark them in a
// slice). It shares no code with package resolver: it reads events through
// gomatrixserverlib's PDU type and takes the authorization rules as a function.
//
// It follows the Matrix Specification v1.19:
//
//   - Room Versions, room version 2, "State resolution"
//     (https://spec.matrix.org/v1.19/rooms/v2/#state-resolution): the definitions
//     (power events, unconflicted state map and conflicted state set, auth chain,
//     auth difference, full conflicted set, reverse topological power ordering,
//     mainline ordering, iterative auth checks) and the five steps of the
//     algorithm. Each is a function below, named as the spec names it, with the
//     spec's words beside the code.
//   - Room Versions, room version 12, "State resolution"
//     (https://spec.matrix.org/v1.19/rooms/v12/#state-resolution), state
//     resolution v2.1: the conflicted state subgraph joins the full conflicted
//     set, and the first iterative auth checks start from the empty state map.
//     Room version 12's creators have an infinitely high power level
//     (https://spec.matrix.org/v1.19/rooms/v12/#authorisation-rules).
//   - Server-Server API, "Auth events selection"
//     (https://spec.matrix.org/v1.19/server-server-api/#auth-events-selection):
//     the keys whose state the authorization rules read, for the iterative auth
//     checks and AuthEventsFrom.
//
// Where the spec's words leave a choice, this package takes the reading noted at
// the place: "m.room.power_levels event" and "m.room.join_rules event" mean the
// state event of that type with state_key ""; the DAG formed by auth events of a
// set of events has their auth_events among the set as its edges.
//
// Room version 1 (state resolution v1) is not covered: Resolve returns
// ErrUnsupported.
package specres

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/matrix-org/gomatrixserverlib"
)

// Key is a state key: (event_type, state_key).
type Key struct{ Type, StateKey string }

// StateMap is a room state: (event_type, state_key) -> event ID.
type StateMap map[Key]string

// Source gives events by ID: every event of every state map and of their auth
// chains. Rejected reports whether an event was rejected on receipt (Matrix
// spec v1.19, Server-Server API, "Checks performed on receipt of a PDU").
type Source interface {
	Event(eventID string) (gomatrixserverlib.PDU, error)
	Rejected(eventID string) bool
}

// AuthFunc applies the room version's authorization rules (Matrix spec v1.19, each
// room version's "Authorisation rules") to event against authEvents, at most one
// per state key: nil when the event passes them.
type AuthFunc func(event gomatrixserverlib.PDU, authEvents []gomatrixserverlib.PDU) error

var (
	// ErrUnsupported is returned for room versions whose state resolution this
	// package does not implement (room version 1) and for unknown versions.
	ErrUnsupported = errors.New("specres: room version not supported")
	// ErrInput is returned when the events given cannot be resolved: an event a
	// state map or an auth chain names is missing, a state map's event is not a
	// state event or not of the map's key, the auth events form a cycle, or the
	// states hold no m.room.create.
	ErrInput = errors.New("specres: input cannot be resolved")
)

// algorithm is the state resolution algorithm of a room version (Matrix spec v1.19,
// Room Versions, "Complete list of room versions"): 2 for v2, 21 for v2.1;
// ErrUnsupported for version 1 (v1) and unknown versions.
func algorithm(version gomatrixserverlib.RoomVersion) (int, error) {
	switch version {
	case "2", "3", "4", "5", "6", "7", "8", "9", "10", "11":
		return 2, nil
	case "12":
		return 21, nil
	}
	return 0, fmt.Errorf("%w: %q", ErrUnsupported, version)
}

// versionNumber is the room version "1" to "12" as a number (0 for others).
func versionNumber(version gomatrixserverlib.RoomVersion) int {
	n, err := strconv.Atoi(string(version))
	if err != nil || n < 1 || n > 12 || strconv.Itoa(n) != string(version) {
		return 0
	}
	return n
}

// resolution is one call of Resolve: the events it has read, and the room facts
// every step needs.
//
// Each event the call reads gets an index, in the order read: ids[i] and pdus[i]
// are its ID and PDU (index maps the ID back), authIdx[i] the indices of its
// auth_events (nil until a walk needs them), mark[i] the last auth chain walk
// that reached it. The auth chain walks cover the whole history of a large room
// once per state resolved; indices let them mark what they reached in a slice.
type resolution struct {
	version gomatrixserverlib.RoomVersion
	v       int
	src     Source
	auth    AuthFunc
	create  gomatrixserverlib.PDU
	// levels: the users and users_default of the power levels events read for
	// senders' levels in this call (a users map may hold thousands of entries).
	levels map[string]*userLevels

	index   map[string]int32
	ids     []string
	pdus    []gomatrixserverlib.PDU
	authIdx [][]int32
	mark    []uint32
	walks   uint32
}

type userLevels struct {
	users        map[string]int64
	usersDefault int64
}

func newResolution(version gomatrixserverlib.RoomVersion, src Source, auth AuthFunc, sizeHint int) *resolution {
	return &resolution{version: version, v: versionNumber(version), src: src, auth: auth, levels: map[string]*userLevels{},
		index: make(map[string]int32, sizeHint)}
}

// intern returns the index of event id, reading it from the source the first
// time.
func (r *resolution) intern(id string) (int32, error) {
	if i, ok := r.index[id]; ok {
		return i, nil
	}
	p, err := r.src.Event(id)
	if err != nil {
		return 0, fmt.Errorf("%w: event %s: %v", ErrInput, id, err)
	}
	if p == nil {
		return 0, fmt.Errorf("%w: event %s: the source gave none", ErrInput, id)
	}
	i := int32(len(r.ids))
	r.index[id] = i
	r.ids = append(r.ids, id)
	r.pdus = append(r.pdus, p)
	r.authIdx = append(r.authIdx, nil)
	r.mark = append(r.mark, 0)
	return i, nil
}

func (r *resolution) event(id string) (gomatrixserverlib.PDU, error) {
	i, err := r.intern(id)
	if err != nil {
		return nil, err
	}
	return r.pdus[i], nil
}

// authEvents returns the indices of event i's auth_events.
func (r *resolution) authEvents(i int32) ([]int32, error) {
	if r.authIdx[i] != nil {
		return r.authIdx[i], nil
	}
	ids := r.pdus[i].AuthEventIDs()
	out := make([]int32, 0, len(ids))
	for _, a := range ids {
		j, err := r.intern(a)
		if err != nil {
			return nil, err
		}
		out = append(out, j)
	}
	r.authIdx[i] = out
	return out, nil
}

// Resolve returns the resolution of the state maps (Matrix spec v1.19, room version
// 2, "State resolution", "Algorithm"; v2.1 for room version 12). Every event the
// maps name, and every event of their auth chains, must be available from src. auth
// decides the iterative auth checks: an event it returns an error for is left out.
// It returns ErrUnsupported for room version 1 and unknown versions, and ErrInput
// (naming the event) when the input cannot be resolved.
func Resolve(version gomatrixserverlib.RoomVersion, states []StateMap, src Source, auth AuthFunc) (StateMap, error) {
	algo, err := algorithm(version)
	if err != nil {
		return nil, err
	}
	if len(states) == 0 {
		return StateMap{}, nil
	}
	r := newResolution(version, src, auth, 4*len(states[0]))
	// Each state's events, as indices: the roots of its full auth chain.
	roots := make([][]int32, len(states))
	for n, s := range states {
		roots[n] = make([]int32, 0, len(s))
		for k, id := range s {
			i, err := r.intern(id)
			if err != nil {
				return nil, err
			}
			p := r.pdus[i]
			if p.StateKey() == nil || p.Type() != k.Type || *p.StateKey() != k.StateKey {
				return nil, fmt.Errorf("%w: event %s is not the state event of (%s, %q)", ErrInput, id, k.Type, k.StateKey)
			}
			roots[n] = append(roots[n], i)
		}
	}
	if r.create, err = r.findCreate(states); err != nil {
		return nil, err
	}

	unconflicted, conflicted := split(states)
	if len(conflicted) == 0 {
		return unconflicted, nil
	}
	full, err := r.fullConflictedSet(roots, conflicted, algo)
	if err != nil {
		return nil, err
	}

	// Step 1. "Select the set X of all power events that appear in the full
	// conflicted set. For each such power event P, enlarge X by adding the events
	// in the auth chain of P which also belong to the full conflicted set. Sort X
	// into a list using the reverse topological power ordering."
	x := map[string]bool{}
	for id := range full {
		p, err := r.event(id)
		if err != nil {
			return nil, err
		}
		if !isPowerEvent(p) {
			continue
		}
		x[id] = true
		chain, err := r.authChain(id)
		if err != nil {
			return nil, err
		}
		for a := range chain {
			if full[a] {
				x[a] = true
			}
		}
	}
	sortedX, err := r.reverseTopologicalPowerOrdering(x)
	if err != nil {
		return nil, err
	}

	// Step 2. "Apply the iterative auth checks algorithm, starting from the
	// unconflicted state map, to the list of events from the previous step to get
	// a partially resolved state." v2.1: "starting from an empty state map".
	start := StateMap{}
	if algo == 2 {
		start = clone(unconflicted)
	}
	partial, err := r.iterativeAuthChecks(start, sortedX)
	if err != nil {
		return nil, err
	}

	// Step 3. "Take all remaining events that weren't picked in step 1 and order
	// them by the mainline ordering based on the power level in the partially
	// resolved state obtained in step 2."
	rest := map[string]bool{}
	for id := range full {
		if !x[id] {
			rest[id] = true
		}
	}
	sortedRest, err := r.mainlineOrdering(rest, partial)
	if err != nil {
		return nil, err
	}

	// Step 4. "Apply the iterative auth checks algorithm on the partial resolved
	// state and the list of events from the previous step."
	partial, err = r.iterativeAuthChecks(partial, sortedRest)
	if err != nil {
		return nil, err
	}

	// Step 5. "Update the result by replacing any event with the event with the
	// same key from the unconflicted state map, if such an event exists, to get
	// the final resolved state."
	for k, id := range unconflicted {
		partial[k] = id
	}
	return partial, nil
}

// split divides the states (Matrix spec v1.19, room version 2, "State resolution",
// "Unconflicted state map and conflicted state set"): "If a given key K is present
// in every Si with the same value V in each state map, then the pair (K, V) belongs
// to the unconflicted state map. Otherwise, V belongs to the conflicted state set."
func split(states []StateMap) (StateMap, map[string]bool) {
	unconflicted := StateMap{}
	conflicted := map[string]bool{}
	conflict := func(k Key) {
		for _, s := range states {
			if w, ok := s[k]; ok {
				conflicted[w] = true
			}
		}
	}
	// A key in every Si is in the first; a key missing from the first is
	// conflicted.
	for k, v := range states[0] {
		same := true
		for _, s := range states[1:] {
			if w, ok := s[k]; !ok || w != v {
				same = false
				break
			}
		}
		if same {
			unconflicted[k] = v
		} else {
			conflict(k)
		}
	}
	for _, s := range states[1:] {
		for k := range s {
			if _, ok := states[0][k]; !ok {
				conflict(k)
			}
		}
	}
	return unconflicted, conflicted
}

// fullConflictedSet is "the union of the conflicted state set and the auth
// difference" (v2), and of the conflicted state subgraph (v2.1).
func (r *resolution) fullConflictedSet(roots [][]int32, conflicted map[string]bool, algo int) (map[string]bool, error) {
	full := map[string]bool{}
	for id := range conflicted {
		full[id] = true
	}
	diff, err := r.authDifference(roots)
	if err != nil {
		return nil, err
	}
	for id := range diff {
		full[id] = true
	}
	if algo == 21 {
		sub, err := r.conflictedStateSubgraph(conflicted)
		if err != nil {
			return nil, err
		}
		for id := range sub {
			full[id] = true
		}
	}
	return full, nil
}

// authChain is "the auth chain of an event E": "the set containing all of E's
// auth events, all of their auth events, and so on recursively, stretching back
// to the start of the room" (E itself is not in it). Given several events it
// returns the union of their auth chains (one walk).
func (r *resolution) authChain(ids ...string) (map[string]bool, error) {
	roots := make([]int32, len(ids))
	for n, id := range ids {
		i, err := r.intern(id)
		if err != nil {
			return nil, err
		}
		roots[n] = i
	}
	members, err := r.chainMembers(roots)
	if err != nil {
		return nil, err
	}
	chain := make(map[string]bool, len(members))
	for _, i := range members {
		chain[r.ids[i]] = true
	}
	if len(ids) == 1 && chain[ids[0]] {
		return nil, fmt.Errorf("%w: event %s is in its own auth chain", ErrInput, ids[0])
	}
	return chain, nil
}

// chainMembers returns the indices of the events of the union of the roots'
// auth chains, each once, in the order the walk reaches them.
func (r *resolution) chainMembers(roots []int32) ([]int32, error) {
	r.walks++
	var members, stack []int32
	for _, x := range roots {
		a, err := r.authEvents(x)
		if err != nil {
			return nil, err
		}
		stack = append(stack, a...)
	}
	for len(stack) > 0 {
		a := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if r.mark[a] == r.walks {
			continue
		}
		r.mark[a] = r.walks
		members = append(members, a)
		next, err := r.authEvents(a)
		if err != nil {
			return nil, err
		}
		stack = append(stack, next...)
	}
	return members, nil
}

// authDifference is "the union of the full auth chains of each state set minus
// their intersection", where "the full auth chain of a set of events is the union
// of the auth chains of each event in the set": the events in at least one
// state's full auth chain and not in all of them. roots[n] are the events of
// state n.
func (r *resolution) authDifference(roots [][]int32) (map[string]bool, error) {
	fullChains := make([][]int32, len(roots))
	for n, events := range roots {
		var err error
		if fullChains[n], err = r.chainMembers(events); err != nil {
			return nil, err
		}
	}
	in := make([]int, len(r.ids)) // in[i]: the number of full auth chains holding event i
	for _, c := range fullChains {
		for _, i := range c {
			in[i]++
		}
	}
	diff := map[string]bool{}
	for i, n := range in {
		if n > 0 && n < len(roots) {
			diff[r.ids[i]] = true
		}
	}
	return diff, nil
}

// conflictedStateSubgraph is v2.1's "conflicted state subgraph": the events that
// lie on an auth_events path from one event of the conflicted state set to
// another, that is, events that are both an ancestor (in the auth chain) of a
// conflicted event and a descendant of (have in their auth chain) a conflicted
// event; the conflicted events themselves included.
func (r *resolution) conflictedStateSubgraph(conflicted map[string]bool) (map[string]bool, error) {
	ids := make([]string, 0, len(conflicted))
	for id := range conflicted {
		ids = append(ids, id)
	}
	ancestors, err := r.authChain(ids...)
	if err != nil {
		return nil, err
	}
	// descends[x]: a conflicted event is in x's auth chain (x an ancestor; the
	// ancestors are closed under auth_events, so the walk stays among them).
	descends := map[string]bool{}
	var walk func(x string, path map[string]bool) (bool, error)
	walk = func(x string, path map[string]bool) (bool, error) {
		if d, ok := descends[x]; ok {
			return d, nil
		}
		if path[x] {
			return false, fmt.Errorf("%w: event %s is in its own auth chain", ErrInput, x)
		}
		path[x] = true
		defer delete(path, x)
		p, err := r.event(x)
		if err != nil {
			return false, err
		}
		d := false
		for _, a := range p.AuthEventIDs() {
			da, err := walk(a, path)
			if err != nil {
				return false, err
			}
			d = d || conflicted[a] || da
		}
		descends[x] = d
		return d, nil
	}
	sub := map[string]bool{}
	for id := range conflicted {
		sub[id] = true
	}
	for id := range ancestors {
		d, err := walk(id, map[string]bool{})
		if err != nil {
			return nil, err
		}
		if d {
			sub[id] = true
		}
	}
	return sub, nil
}

// isPowerEvent: "A power event is a state event with type m.room.power_levels or
// m.room.join_rules, or a state event with type m.room.member where the
// membership is leave or ban and the sender does not match the state_key." (The
// first two read as the events of state_key "", the ones the authorization rules
// read.)
func isPowerEvent(p gomatrixserverlib.PDU) bool {
	if p.StateKey() == nil {
		return false
	}
	switch p.Type() {
	case "m.room.power_levels", "m.room.join_rules":
		return *p.StateKey() == ""
	case "m.room.member":
		m := membership(p)
		return (m == "leave" || m == "ban") && string(p.SenderID()) != *p.StateKey()
	}
	return false
}

// membership is content.membership of a member event ("" when absent or not a
// string).
func membership(p gomatrixserverlib.PDU) string {
	var c map[string]json.RawMessage
	if json.Unmarshal(p.Content(), &c) != nil {
		return ""
	}
	var m string
	if json.Unmarshal(c["membership"], &m) != nil {
		return ""
	}
	return m
}

// reverseTopologicalPowerOrdering: "The reverse topological power ordering of a
// set of events is the lexicographically smallest topological ordering based on
// the DAG formed by auth events. The reverse topological power ordering is
// ordered from earliest event to latest. For comparing two topological orderings
// to determine which is the lexicographically smallest, the following comparison
// relation on events is used: for events x and y, x < y if 1. x's sender has
// greater power level than y's sender, when looking at their respective
// auth_events; or 2. the senders have the same power level, but x's
// origin_server_ts is less than y's; or 3. the senders have the same power level
// and the events have the same origin_server_ts, but x's event_id is less than
// y's."
//
// Built as the spec defines it: at each position, of the events whose every
// auth event in the set is placed, the smallest by that relation. "The DAG formed
// by auth events" is read as the graph of the set's events with their auth_events
// as edges: an event waits for those of its own auth events that are in the set,
// not for farther ancestors reached through events outside it. (Synapse, whose
// authors wrote the algorithm, builds this graph so:
// https://github.com/element-hq/synapse/blob/develop/synapse/state/v2.py,
// _add_event_and_auth_chain_to_graph. The two readings differ only when an event
// on an auth path between two events of the set is outside the full conflicted
// set; v2.1's conflicted state subgraph takes in those between conflicted events.)
func (r *resolution) reverseTopologicalPowerOrdering(set map[string]bool) ([]string, error) {
	type node struct {
		id    string
		level float64 // +Inf for v12 creators
		ts    int64
		deps  map[string]bool // auth events in the set not placed yet
	}
	nodes := map[string]*node{}
	for id := range set {
		p, err := r.event(id)
		if err != nil {
			return nil, err
		}
		level, err := r.senderPowerLevel(p)
		if err != nil {
			return nil, err
		}
		n := &node{id: id, level: level, ts: int64(p.OriginServerTS()), deps: map[string]bool{}}
		for _, a := range p.AuthEventIDs() {
			if set[a] {
				n.deps[a] = true
			}
		}
		nodes[id] = n
	}
	less := func(x, y *node) bool {
		if x.level != y.level {
			return x.level > y.level
		}
		if x.ts != y.ts {
			return x.ts < y.ts
		}
		return x.id < y.id
	}
	var out []string
	for len(nodes) > 0 {
		var best *node
		for _, n := range nodes {
			if len(n.deps) == 0 && (best == nil || less(n, best)) {
				best = n
			}
		}
		if best == nil {
			return nil, fmt.Errorf("%w: the auth events of %d events form a cycle", ErrInput, len(nodes))
		}
		out = append(out, best.id)
		delete(nodes, best.id)
		for _, n := range nodes {
			delete(n.deps, best.id)
		}
	}
	return out, nil
}

// senderPowerLevel is the power level of p's sender "when looking at their
// respective auth_events": users[sender], else users_default, of the
// m.room.power_levels event among p's auth_events. Without one, the spec's default
// for a room without power levels (Matrix spec v1.19, Client-Server API,
// "m.room.power_levels": "the room creator" has 100, everyone else 0; the creator
// is content.creator of the m.room.create event in room versions 1-10, its sender
// from 11). In room version 12 the room's creators (the create event's sender and
// additional_creators) have an infinitely high power level.
func (r *resolution) senderPowerLevel(p gomatrixserverlib.PDU) (float64, error) {
	sender := string(p.SenderID())
	if r.v >= 12 && slices.Contains(creators(r.create), sender) {
		return math.Inf(1), nil
	}
	for _, a := range p.AuthEventIDs() {
		ae, err := r.event(a)
		if err != nil {
			return 0, err
		}
		if ae.Type() == "m.room.power_levels" && ae.StateKeyEquals("") {
			l, ok := r.levels[a]
			if !ok {
				l = readUserLevels(r.v, ae)
				r.levels[a] = l
			}
			if n, ok := l.users[sender]; ok {
				return float64(n), nil
			}
			return float64(l.usersDefault), nil
		}
	}
	if sender == r.creator() {
		return 100, nil
	}
	return 0, nil
}

// creator is the room creator of room versions 1-11 (content.creator in 1-10,
// else the create event's sender).
func (r *resolution) creator() string {
	if r.v <= 10 {
		var c struct {
			Creator string `json:"creator"`
		}
		_ = json.Unmarshal(r.create.Content(), &c)
		if c.Creator != "" {
			return c.Creator
		}
	}
	return string(r.create.SenderID())
}

// creators is room version 12's room creators: the create event's sender and its
// content.additional_creators.
func creators(create gomatrixserverlib.PDU) []string {
	var c struct {
		Additional []string `json:"additional_creators"`
	}
	_ = json.Unmarshal(create.Content(), &c)
	return append([]string{string(create.SenderID())}, c.Additional...)
}

// readUserLevels reads users and users_default of a power levels event (absent: 0).
// Integers; in room versions 1-9 also integer strings (Matrix spec v1.19, room
// versions 1-9, "m.room.power_levels events accept values as strings"), in 1-5 also
// floats; a value that is none of these counts as absent.
func readUserLevels(v int, pl gomatrixserverlib.PDU) *userLevels {
	var c struct {
		Users        map[string]json.RawMessage `json:"users"`
		UsersDefault json.RawMessage            `json:"users_default"`
	}
	_ = json.Unmarshal(pl.Content(), &c)
	l := &userLevels{users: make(map[string]int64, len(c.Users))}
	for u, raw := range c.Users {
		if n, ok := level(v, raw); ok {
			l.users[u] = n
		}
	}
	l.usersDefault, _ = level(v, c.UsersDefault)
	return l
}

func level(v int, raw json.RawMessage) (int64, bool) {
	s := strings.TrimSpace(string(raw))
	if s == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, true
	}
	if v <= 9 {
		var str string
		if json.Unmarshal(raw, &str) == nil {
			if n, err := strconv.ParseInt(strings.TrimSpace(str), 10, 64); err == nil {
				return n, true
			}
		}
	}
	if v <= 5 {
		if f, err := strconv.ParseFloat(s, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
			return int64(f), true
		}
	}
	return 0, false
}

// mainlineOrdering: "Let P = P0 be an m.room.power_levels event. Starting with
// i = 0, repeatedly fetch Pi+1, the m.room.power_levels event in the auth_events
// of Pi. Increment i and repeat until Pi has no m.room.power_levels event in its
// auth_events. The mainline of P0 is the list of events [P0, P1, ..., Pn]."
// "Let e = e0 be another event ... We can compute a similar list of events
// [e1, ..., em], where ej+1 is the m.room.power_levels event in the auth_events
// of ej ... Find the smallest index j ≥ 1 for which ej belongs to the mainline of
// P. If such a j exists, then ej = Pi for some unique index i ≥ 0. Otherwise set
// i = ∞ ... the mainline position of e is i." "The mainline ordering based on P
// of a set of events is the ordering, from smallest to largest, using the
// following comparison relation on events: for events x and y, x < y if 1. the
// mainline position of x is greater than the mainline position of y ...; or 2.
// the mainline positions of the events are the same, but x's origin_server_ts is
// less than y's; or 3. the mainline positions of the events are the same and the
// events have the same origin_server_ts, but x's event_id is less than y's."
//
// P is the partial state's m.room.power_levels; without one the mainline is empty
// and every position is ∞.
func (r *resolution) mainlineOrdering(set map[string]bool, partial StateMap) ([]string, error) {
	mainline := map[string]int{} // Pi -> i
	if p, ok := partial[Key{"m.room.power_levels", ""}]; ok {
		for i, cur := 0, p; cur != ""; i++ {
			if _, loop := mainline[cur]; loop {
				return nil, fmt.Errorf("%w: the power levels mainline of %s loops at %s", ErrInput, p, cur)
			}
			mainline[cur] = i
			next, err := r.powerLevelsAuthEvent(cur)
			if err != nil {
				return nil, err
			}
			cur = next
		}
	}
	type item struct {
		id       string
		position int // math.MaxInt for ∞
		ts       int64
	}
	items := make([]item, 0, len(set))
	for id := range set {
		p, err := r.event(id)
		if err != nil {
			return nil, err
		}
		pos := math.MaxInt
		seen := map[string]bool{id: true}
		for cur := id; ; {
			next, err := r.powerLevelsAuthEvent(cur)
			if err != nil {
				return nil, err
			}
			if next == "" {
				break
			}
			if seen[next] {
				return nil, fmt.Errorf("%w: the power levels auth events of %s loop at %s", ErrInput, id, next)
			}
			seen[next] = true
			if i, ok := mainline[next]; ok {
				pos = i
				break
			}
			cur = next
		}
		items = append(items, item{id: id, position: pos, ts: int64(p.OriginServerTS())})
	}
	slices.SortFunc(items, func(x, y item) int {
		switch {
		case x.position != y.position:
			if x.position > y.position {
				return -1
			}
			return 1
		case x.ts != y.ts:
			if x.ts < y.ts {
				return -1
			}
			return 1
		}
		return strings.Compare(x.id, y.id)
	})
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.id
	}
	return out, nil
}

// powerLevelsAuthEvent is "the m.room.power_levels event in the auth_events" of
// an event, or "".
func (r *resolution) powerLevelsAuthEvent(id string) (string, error) {
	p, err := r.event(id)
	if err != nil {
		return "", err
	}
	for _, a := range p.AuthEventIDs() {
		ae, err := r.event(a)
		if err != nil {
			return "", err
		}
		if ae.Type() == "m.room.power_levels" && ae.StateKeyEquals("") {
			return a, nil
		}
	}
	return "", nil
}

// iterativeAuthChecks: "The iterative auth checks algorithm takes as input an
// initial room state and a sorted list of state events, and constructs a new room
// state by iterating through the event list and applying the state event to the
// room state if the state event is allowed by the authorisation rules. If the
// state event is not allowed by the authorisation rules, then the event is
// ignored. If a (event_type, state_key) key that is required for checking the
// authorisation rules is not present in the state, then the appropriate state
// event from the event's auth_events is used if the auth event is not rejected."
//
// The keys required are those of the auth events selection; in room version 12
// the rules read the create event the room ID names, which is given whatever the
// state holds.
func (r *resolution) iterativeAuthChecks(state StateMap, list []string) (StateMap, error) {
	state = clone(state)
	for _, id := range list {
		p, err := r.event(id)
		if err != nil {
			return nil, err
		}
		own := map[Key]gomatrixserverlib.PDU{} // the event's non-rejected auth events
		for _, a := range p.AuthEventIDs() {
			ae, err := r.event(a)
			if err != nil {
				return nil, err
			}
			if ae.StateKey() != nil && !r.src.Rejected(a) {
				own[Key{ae.Type(), *ae.StateKey()}] = ae
			}
		}
		var authEvents []gomatrixserverlib.PDU
		for _, k := range selectionKeys(r.v, p) {
			if sid, ok := state[k]; ok {
				se, err := r.event(sid)
				if err != nil {
					return nil, err
				}
				authEvents = append(authEvents, se)
			} else if ae, ok := own[k]; ok {
				authEvents = append(authEvents, ae)
			}
		}
		if r.v >= 12 && !(p.Type() == "m.room.create" && p.StateKeyEquals("")) {
			authEvents = slices.DeleteFunc(authEvents, func(e gomatrixserverlib.PDU) bool { return e.Type() == "m.room.create" })
			authEvents = append(authEvents, r.create)
		}
		if r.auth(p, authEvents) == nil {
			state[Key{p.Type(), *p.StateKey()}] = id
		}
	}
	return state, nil
}

// selectionKeys is the auth events selection (Matrix spec v1.19, Server-Server API,
// "Auth events selection"): "the m.room.create event" (not in room version 12,
// whose room ID names it), "the current m.room.power_levels event, if any", "the
// sender's current m.room.member event, if any", and for m.room.member events "the
// target's current m.room.member event, if any"; "if membership is join, invite or
// knock, the current m.room.join_rules event, if any"; "if membership is invite and
// content contains a third_party_invite property, the current
// m.room.third_party_invite event with state_key matching
// content.third_party_invite.signed.token, if any"; "if
// content.join_authorised_via_users_server is present, and the room version
// supports restricted rooms, then the m.room.member event with state_key matching
// content.join_authorised_via_users_server" (restricted rooms: versions 8 on).
func selectionKeys(v int, p gomatrixserverlib.PDU) []Key {
	if p.Type() == "m.room.create" && p.StateKeyEquals("") {
		return nil
	}
	keys := []Key{{"m.room.power_levels", ""}, {"m.room.member", string(p.SenderID())}}
	if v <= 11 {
		keys = append([]Key{{"m.room.create", ""}}, keys...)
	}
	if p.Type() != "m.room.member" || p.StateKey() == nil {
		return keys
	}
	keys = append(keys, Key{"m.room.member", *p.StateKey()})
	var c struct {
		Membership       json.RawMessage `json:"membership"`
		ThirdPartyInvite *struct {
			Signed struct {
				Token json.RawMessage `json:"token"`
			} `json:"signed"`
		} `json:"third_party_invite"`
		Via json.RawMessage `json:"join_authorised_via_users_server"`
	}
	_ = json.Unmarshal(p.Content(), &c)
	var m string
	_ = json.Unmarshal(c.Membership, &m)
	if m == "join" || m == "invite" || m == "knock" {
		keys = append(keys, Key{"m.room.join_rules", ""})
	}
	if m == "invite" && c.ThirdPartyInvite != nil {
		var token string
		if json.Unmarshal(c.ThirdPartyInvite.Signed.Token, &token) == nil {
			keys = append(keys, Key{"m.room.third_party_invite", token})
		}
	}
	if v >= 8 && c.Via != nil {
		var via string
		if json.Unmarshal(c.Via, &via) == nil {
			keys = append(keys, Key{"m.room.member", via})
		}
	}
	return keys
}

// findCreate returns the room's m.room.create: from a state map, else from an
// auth chain of their events.
func (r *resolution) findCreate(states []StateMap) (gomatrixserverlib.PDU, error) {
	ck := Key{"m.room.create", ""}
	for _, s := range states {
		if id, ok := s[ck]; ok {
			return r.event(id)
		}
	}
	for _, s := range states {
		for _, id := range s {
			chain, err := r.authChain(id)
			if err != nil {
				return nil, err
			}
			for a := range chain {
				p, err := r.event(a)
				if err != nil {
					return nil, err
				}
				if p.Type() == "m.room.create" && p.StateKeyEquals("") {
					return p, nil
				}
			}
		}
	}
	return nil, fmt.Errorf("%w: no m.room.create in the states or their auth chains", ErrInput)
}

// AuthEventsFrom returns the events of state that the auth events selection names
// for p (selectionKeys), and in room version 12 the room's create event (from the
// state): what p is checked against as "the state before the event" (Matrix spec
// v1.19, Server-Server API, "Checks performed on receipt of a PDU", check 5). It
// returns ErrUnsupported for unknown versions and ErrInput when src lacks an event.
func AuthEventsFrom(version gomatrixserverlib.RoomVersion, p gomatrixserverlib.PDU, state StateMap, src Source) ([]gomatrixserverlib.PDU, error) {
	if versionNumber(version) == 0 {
		return nil, fmt.Errorf("%w: %q", ErrUnsupported, version)
	}
	r := newResolution(version, src, nil, len(state))
	var out []gomatrixserverlib.PDU
	keys := selectionKeys(r.v, p)
	if r.v >= 12 && !(p.Type() == "m.room.create" && p.StateKeyEquals("")) {
		keys = append(keys, Key{"m.room.create", ""})
	}
	for _, k := range keys {
		if id, ok := state[k]; ok {
			e, err := r.event(id)
			if err != nil {
				return nil, err
			}
			out = append(out, e)
		}
	}
	return out, nil
}

func clone(s StateMap) StateMap {
	out := make(StateMap, len(s))
	for k, v := range s {
		out[k] = v
	}
	return out
}
