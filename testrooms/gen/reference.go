package gen

import (
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/mtxdb/mtxdb/authrules"
	"github.com/mtxdb/mtxdb/resolver/specres"
)

// The expected state comes from the reference implementation.
//
// The simulation resolves with the generator's own fast path (resolve.go:
// resolver.ResolveConflicts, the code replay runs): servers need a state to build
// each event from. Had expected_state.jsonl recorded those states, verify
// --expected would only show that storage and replay agree with the resolver. So
// what expected_state.jsonl and current_state.json record is computed by package
// resolver/specres, the reference implementation written from the spec's text,
// stepwise over the generator's states. For each event E it checks:
//
//   - the state before E: specres.Resolve of the distinct generator states after
//     E's prev_events (one distinct state: that state; none, the create event: the
//     empty state);
//   - E's rejection, as the checks on receipt of a PDU decide it (Matrix spec
//     v1.19, Server-Server API, "Checks performed on receipt of a PDU", checks 4
//     and 5):
//     authrules.CheckAuthEvents (the rules on the auth_events list itself) and
//     authrules.Authorize against the events E's auth_events name, then
//     authrules.Authorize against specres.AuthEventsFrom of the state before;
//   - the state after E: the state before, with E at its key when E is an
//     accepted state event.
//
// Where that state (or that rejection) differs from the generator's, the
// difference is counted in meta.json "reference" (the first few listed: event,
// key, both values) and the reference's state is what expected_state.jsonl
// records, so verify --expected fails on the room; `mtxdb gen` prints them on
// stderr. current_state.json is specres.Resolve of the generator's states after
// the forward extremities, compared the same way.
//
// Why 0 mismatches here and in verify mean that every recorded state is what a
// pure reference replay gives. Let G(E) be the generator's state after E (and its
// rejection), R(E) the step above applied to G of E's prev_events, and P(E) the
// state of a replay that runs the reference alone (the same step applied to P of
// the prev_events). Suppose R(E) = G(E) for every event (this counter is 0, every
// event checked). Then P(E) = G(E) for every event, by induction over the
// topological order: the create event has no prev_events, so P = R = G there;
// for an event E whose prev_events p all have P(p) = G(p), P(E) = step(P(p...)) =
// step(G(p...)) = R(E) = G(E). (The step also reads whether auth events were
// rejected, from G: equal to P's by the same induction, since the events an event
// cites come before it.) expected_state.jsonl records R(E) = P(E), and verify's 0
// mismatches say replay's state after E equals it at every recorded event.
//
// Rooms of more than refAllMax events are checked at a sample only: the events
// expected_state.jsonl records, the last, and, when the recorded events are
// fewer than refSampleMin, every k-th event in file order (refSampleMin of
// them). There each recorded state is still
// the reference's resolution of the generator's states before it, but the
// induction does not hold between the samples (an unchecked step could differ
// from the reference and go unseen, as long as it agrees again at the samples).
//
// The checks run on every CPU after the simulation: each event's check reads
// only the generator's states (persistent pmaps, shared read-only), converted to
// specres.StateMap per resolution. Where there is nothing to resolve (one distinct
// state before E), the state is not converted: AuthEventsFrom is given the
// state's entries of every key that is not m.room.member plus the member entries
// of E's sender, target and authorising user (content
// join_authorised_via_users_server), a superset of every key the auth events
// selection names (Matrix spec v1.19, Server-Server API, "Auth events selection").
//
// Options.NoReference skips all this: the files then record the generator's
// own states. Options.ReferenceAll checks every event of a room of any size.

// refAllMax is the largest room the reference checks at every event (unless
// Options.ReferenceAll). The reference costs about 0.13 s of CPU per resolution
// at 100k events (whole maps, full auth chain walks: every resolution reads
// every event of the states and of their auth chains), and a 100k room has
// about 68k events with two or more distinct states before them: about 2.5
// hours of CPU (docs/generator.md).
const refAllMax = 10_000

// refSampleMin is the least number of events the reference checks in a larger
// room.
const refSampleMin = 1000

// refFirstMax is the number of mismatches meta.json lists.
const refFirstMax = 10

// ReferenceCounts is meta.json "reference": what the reference implementation
// checked and where it disagreed with the generator's own resolution.
type ReferenceCounts struct {
	// Implementation names the reference.
	Implementation string `json:"implementation"`
	// CheckedEvents is the number of events whose state the reference computed;
	// Every is 1 when that is every event, else k (every k-th in file order, the
	// events expected_state.jsonl records, and the last).
	CheckedEvents int `json:"checked_events"`
	Every         int `json:"every"`
	// Resolutions counts the checked events with two or more distinct states
	// after their prev_events (specres.Resolve ran).
	Resolutions int `json:"resolutions"`
	// Mismatches counts the checked events whose state after, or rejection, the
	// reference computes otherwise than the generator; MismatchedKeys the state
	// keys that differ over all of them; RejectionMismatches the events the two
	// reject differently.
	Mismatches          int `json:"mismatches"`
	MismatchedKeys      int `json:"mismatched_keys"`
	RejectionMismatches int `json:"rejection_mismatches"`
	// CurrentStateMismatchedKeys counts the keys of current_state.json where the
	// reference's resolution differs from the generator's.
	CurrentStateMismatchedKeys int `json:"current_state_mismatched_keys"`
	// First lists the first mismatches in file order (current state last).
	First []ReferenceMismatch `json:"first_mismatches,omitempty"`
	// Time is the wall time of the reference's checks, CPU the process's user
	// and system CPU time over them (not written: meta.json is the same for the
	// same options).
	Time time.Duration `json:"-"`
	CPU  time.Duration `json:"-"`
	// Workers is the number of goroutines the checks ran on (not written).
	Workers int `json:"-"`
}

// ReferenceMismatch is one difference between the reference and the generator.
type ReferenceMismatch struct {
	// Event is the event after which the states differ ("" for the current
	// state).
	Event string `json:"event"`
	// Key is the state key "type\u0000state_key" that differs; "" when the two
	// reject the event differently.
	Key string `json:"key,omitempty"`
	// Reference and Generator are each side's value: the event ID at Key, ""
	// when absent; for a rejection, "accepted" or "rejected: reason".
	Reference string `json:"reference"`
	Generator string `json:"generator"`
}

// String formats a mismatch for a log line.
func (m ReferenceMismatch) String() string {
	ev := m.Event
	if ev == "" {
		ev = "current state"
	}
	if m.Key == "" {
		return fmt.Sprintf("event %s: reference %s, generator %s", ev, m.Reference, m.Generator)
	}
	return fmt.Sprintf("event %s key %s: reference %q, generator %q", ev, strings.ReplaceAll(m.Key, "\x00", "|"), m.Reference, m.Generator)
}

// refResult is the reference's verdict on one checked event.
type refResult struct {
	resolved    bool
	rejection   string    // the reference's rejection ("" accepted), when it differs from the generator's
	rejMismatch bool      // the reference rejects or accepts the event otherwise
	diffs       []refDiff // keys of the state after that differ, sorted
}

// refDiff is one key whose value the reference computes otherwise: ref and gen
// are event indices, -1 when absent.
type refDiff struct {
	key      string
	ref, gen int32
}

// reference runs the reference checks (see the top of this file) and keeps the
// states the room's files record: r.refStates for the sampled events whose state
// differs from the generator's, r.refCurrent for the current state.
func (r *room) reference(sampled []int32) error {
	start, startCPU := time.Now(), processCPU()
	checked, every := r.referenceSample(sampled)
	rc := &r.refCounts
	*rc = ReferenceCounts{Implementation: "resolver/specres (spec v1.16 state res v2 / v2.1 over whole state maps)", CheckedEvents: len(checked), Every: every}
	// The generator's current state (the resolution of the states after the
	// forward extremities) is resolved first, so that the simulation's caches
	// can go before the checks (releaseSim).
	tips := r.tips()
	genCurrent := r.resolve(tips)
	r.releaseSim()
	ck := newRefChecker(r)
	results := make([]refResult, len(checked))
	errs := make([]error, len(checked))
	workers := runtime.GOMAXPROCS(0)
	rc.Workers = workers
	var next atomic.Int64
	var wg sync.WaitGroup
	var progressMu sync.Mutex // serialises refProgress calls
	done := 0                 // guarded by progressMu
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := *ck
			w.auth = authrules.NewAuthorizer()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(checked) {
					return
				}
				results[i], errs[i] = w.check(checked[i])
				if r.refProgress != nil {
					progressMu.Lock()
					done++
					r.refProgress(done, len(checked))
					progressMu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("gen: reference: event %s: %w", r.events[checked[i]].id, err)
		}
	}

	isSampled := make(map[int32]bool, len(sampled))
	for _, x := range sampled {
		isSampled[x] = true
	}
	r.refStates = map[int32]pmap{}
	for i, res := range results {
		x := checked[i]
		e := r.events[x]
		if res.resolved {
			rc.Resolutions++
		}
		if !res.rejMismatch && len(res.diffs) == 0 {
			continue
		}
		rc.Mismatches++
		rc.MismatchedKeys += len(res.diffs)
		if res.rejMismatch {
			rc.RejectionMismatches++
			r.noteRefMismatch(ReferenceMismatch{Event: e.id, Reference: rejectionText(res.rejection), Generator: rejectionText(genRejection(e))})
		}
		for _, d := range res.diffs {
			r.noteRefMismatch(ReferenceMismatch{Event: e.id, Key: d.key, Reference: r.idOrNone(d.ref), Generator: r.idOrNone(d.gen)})
		}
		if isSampled[x] {
			r.refStates[x] = patch(r.afterOf(x), res.diffs)
		}
	}

	// The current state: the reference's resolution of the states after the
	// forward extremities, against the generator's.
	r.refCurrent = genCurrent
	if r.err != nil {
		return r.err
	}
	current, resolved, err := ck.stateOf(tips)
	if err != nil {
		return fmt.Errorf("gen: reference: current state: %w", err)
	}
	if resolved != nil {
		diffs := diffMap(r, resolved, r.refCurrent)
		rc.CurrentStateMismatchedKeys = len(diffs)
		for _, d := range diffs {
			r.noteRefMismatch(ReferenceMismatch{Key: d.key, Reference: r.idOrNone(d.ref), Generator: r.idOrNone(d.gen)})
		}
		r.refCurrent = patch(r.refCurrent, diffs)
	} else {
		r.refCurrent = current
	}
	rc.Time, rc.CPU = time.Since(start), processCPU()-startCPU
	return nil
}

// processCPU is the process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (r *room) noteRefMismatch(m ReferenceMismatch) {
	if len(r.refCounts.First) < refFirstMax {
		r.refCounts.First = append(r.refCounts.First, m)
	}
}

func (r *room) idOrNone(i int32) string {
	if i < 0 {
		return ""
	}
	return r.events[i].id
}

func genRejection(e *event) string {
	if e.rejected {
		return "rejected by the generator"
	}
	return ""
}

func rejectionText(reason string) string {
	if reason == "" {
		return "accepted"
	}
	return "rejected: " + reason
}

// referenceSample returns the events the reference checks, in file order, and
// its every: every event up to refAllMax; above, the events
// expected_state.jsonl records and the last, and when those are fewer than
// refSampleMin, every k-th event too (k = events / refSampleMin).
func (r *room) referenceSample(sampled []int32) ([]int32, int) {
	n := len(r.arrival)
	if n <= refAllMax || r.opts.ReferenceAll {
		return slices.Clone(r.arrival), 1
	}
	every := n / refSampleMin
	if len(sampled) >= refSampleMin {
		every = r.sampleEvery
	}
	isSampled := make(map[int32]bool, len(sampled))
	for _, x := range sampled {
		isSampled[x] = true
	}
	var out []int32
	for i, x := range r.arrival {
		if i%every == 0 || i == n-1 || isSampled[x] {
			out = append(out, x)
		}
	}
	return out, every
}

// patch returns st with the reference's values of diffs.
func patch(st pmap, diffs []refDiff) pmap {
	for _, d := range diffs {
		if d.ref < 0 {
			st = st.del(d.key)
		} else {
			st = st.set(d.key, d.ref)
		}
	}
	return st
}

// expectedAfter is the state expected_state.jsonl records after event x: the
// reference's (see reference).
func (r *room) expectedAfter(x int32) pmap {
	if st, ok := r.refStates[x]; ok {
		return st
	}
	return r.afterOf(x)
}

// refChecker runs the reference's step for events of one room; safe for
// concurrent use once the simulation has finished (it reads the room only).
type refChecker struct {
	r       *room
	version gomatrixserverlib.RoomVersion
	// nonMember are the room's state keys of types other than m.room.member.
	nonMember []string
	create    gomatrixserverlib.PDU // v12: the create event the room ID names
	// pdus are the room's events as the reference reads them (refPDU), by
	// index; nil for the events whose PDU the room does not keep (Event reads
	// those back).
	pdus []gomatrixserverlib.PDU
	// auth is the rules, with what they parse kept for the room
	// (authrules.NewAuthorizer): one per worker, it is not safe for concurrent use.
	auth func(gomatrixserverlib.PDU, []gomatrixserverlib.PDU) error
}

// refPDU is an event as the reference reads it: the PDU, with its
// AuthEventIDs computed once (gomatrixserverlib's v12 events build the list,
// the implied create event first, on every call, and the reference's auth chain
// walks call it for every event of every state they resolve: a fifth of their
// time at 30k events). The list is shared: callers only read it.
type refPDU struct {
	gomatrixserverlib.PDU
	authIDs []string
}

// AuthEventIDs returns the PDU's AuthEventIDs, as computed once.
func (p refPDU) AuthEventIDs() []string { return p.authIDs }

var _ specres.Source = (*refChecker)(nil)

// Event implements specres.Source: the room's events.
func (c *refChecker) Event(id string) (gomatrixserverlib.PDU, error) {
	i, ok := c.r.byID[id]
	if !ok {
		return nil, fmt.Errorf("gen: no event %s", id)
	}
	if p := c.pdus[i]; p != nil {
		return p, nil
	}
	return c.r.pduOf(i)
}

// Rejected implements specres.Source: the generator's rejections (see the top
// of this file).
func (c *refChecker) Rejected(id string) bool { return c.r.Rejected(id) }

func newRefChecker(r *room) *refChecker {
	c := &refChecker{r: r, version: r.ver.Version(), pdus: make([]gomatrixserverlib.PDU, len(r.events)),
		auth: authrules.NewAuthorizer()}
	for i, e := range r.events {
		if e.pdu != nil {
			c.pdus[i] = refPDU{PDU: e.pdu, authIDs: e.pdu.AuthEventIDs()}
		}
	}
	seen := map[string]bool{}
	for _, e := range r.events {
		if e.key != "" && keyType(e.key) != spec.MRoomMember && !seen[e.key] {
			seen[e.key] = true
			c.nonMember = append(c.nonMember, e.key)
		}
	}
	slices.Sort(c.nonMember)
	if r.ver.DomainlessRoomIDs() {
		if i, ok := r.byID["$"+strings.TrimPrefix(r.roomID, "!")]; ok {
			c.create = r.events[i].pdu
		}
	}
	return c
}

func specKey(k string) specres.Key {
	i := strings.IndexByte(k, 0)
	return specres.Key{Type: k[:i], StateKey: k[i+1:]}
}

// stateMap converts a generator state to the reference's form.
func (c *refChecker) stateMap(st pmap) specres.StateMap {
	m := make(specres.StateMap, st.size)
	st.each(func(k string, v int32) { m[specKey(k)] = c.r.events[v].id })
	return m
}

// stateOf returns the reference's state after the given events: the one distinct
// generator state (single, resolved nil), or specres.Resolve of two or more
// (resolved). No events: the empty state.
func (c *refChecker) stateOf(prevs []int32) (single pmap, resolved specres.StateMap, err error) {
	var states []pmap
	for _, p := range prevs {
		st := c.r.afterOf(p)
		if !slices.ContainsFunc(states, func(x pmap) bool { return x.rec == st.rec }) {
			states = append(states, st)
		}
	}
	switch len(states) {
	case 0:
		return pmap{}, nil, nil
	case 1:
		return states[0], nil, nil
	}
	maps := make([]specres.StateMap, len(states))
	for i, st := range states {
		maps[i] = c.stateMap(st)
	}
	res, err := specres.Resolve(c.version, maps, c, c.auth)
	if err != nil {
		return pmap{}, nil, err
	}
	return pmap{}, res, nil
}

// check runs the reference's step for event x and compares it with the
// generator's state after x.
func (c *refChecker) check(x int32) (res refResult, err error) {
	r := c.r
	e := r.events[x]
	p, err := r.pduOf(x)
	if err != nil {
		return res, err
	}
	single, resolved, err := c.stateOf(e.prev)
	if err != nil {
		return res, err
	}
	res.resolved = resolved != nil

	// The receipt checks.
	var authState specres.StateMap
	if resolved != nil {
		authState = resolved
	} else {
		authState = c.projection(p, single)
	}
	reason, err := c.rejection(e, p, authState)
	if err != nil {
		return res, err
	}
	if (reason != "") != e.rejected {
		res.rejMismatch, res.rejection = true, reason
	}

	// The state before: where it differs from the generator's.
	var before []refDiff
	if resolved != nil {
		before = diffMap(r, resolved, r.beforeOf(x))
	} else {
		before = diffPmap(single, r.beforeOf(x))
	}
	// The state after: the keys that differ before, and e's own.
	refAt := func(k string) int32 {
		if k == e.key && reason == "" {
			return x
		}
		if resolved != nil {
			if id, ok := resolved[specKey(k)]; ok {
				return r.byID[id]
			}
			return -1
		}
		if v, ok := single.get(k); ok {
			return v
		}
		return -1
	}
	keys := make([]string, 0, len(before)+1)
	for _, d := range before {
		keys = append(keys, d.key)
	}
	if e.key != "" && !slices.Contains(keys, e.key) {
		keys = append(keys, e.key)
	}
	slices.Sort(keys)
	for _, k := range keys {
		gen := int32(-1)
		if v, ok := r.afterOf(x).get(k); ok {
			gen = v
		}
		if ref := refAt(k); ref != gen {
			res.diffs = append(res.diffs, refDiff{key: k, ref: ref, gen: gen})
		}
	}
	return res, nil
}

// rejection decides e (whose PDU is p) as the checks on receipt do: against the events its
// auth_events name (the rules on that list, then the authorization rules), then
// against the state before it (the events the auth events selection names in
// state). It returns the reason, "" when e is accepted; err only when an event is
// missing.
func (c *refChecker) rejection(e *event, p gomatrixserverlib.PDU, state specres.StateMap) (string, error) {
	own := make([]gomatrixserverlib.PDU, len(e.auth))
	for i, a := range e.auth {
		own[i] = c.r.events[a].pdu
	}
	var create gomatrixserverlib.PDU
	if c.create != nil && p.Type() != spec.MRoomCreate {
		create = c.create
	}
	if err := authrules.CheckAuthEvents(p, own, c.r.Rejected, create); err != nil {
		return "against its auth events: " + err.Error(), nil
	}
	if err := c.authorize(p, own); err != nil {
		return "against its auth events: " + err.Error(), nil
	}
	fromState, err := specres.AuthEventsFrom(c.version, p, state, c)
	if err != nil {
		return "", err
	}
	if err := c.authorize(p, fromState); err != nil {
		return "against the state before it: " + err.Error(), nil
	}
	return "", nil
}

// authorize is c.auth, a panic in gomatrixserverlib counted as a rejection.
func (c *refChecker) authorize(p gomatrixserverlib.PDU, list []gomatrixserverlib.PDU) (err error) {
	defer func() {
		if rec := recover(); rec != nil {
			err = fmt.Errorf("gomatrixserverlib panicked: %v", rec)
		}
	}()
	return c.auth(p, list)
}

// projection is the part of st that the auth events selection can name for p
// (see the top of this file): every key not of type m.room.member, and the
// member keys of p's sender, of its state_key (an m.room.member event's target)
// and of content.join_authorised_via_users_server.
func (c *refChecker) projection(p gomatrixserverlib.PDU, st pmap) specres.StateMap {
	m := specres.StateMap{}
	add := func(k string) {
		if v, ok := st.get(k); ok {
			m[specKey(k)] = c.r.events[v].id
		}
	}
	for _, k := range c.nonMember {
		add(k)
	}
	add(stateKey(spec.MRoomMember, string(p.SenderID())))
	if sk := p.StateKey(); sk != nil && p.Type() == spec.MRoomMember {
		add(stateKey(spec.MRoomMember, *sk))
		var content struct {
			Via any `json:"join_authorised_via_users_server"`
		}
		_ = json.Unmarshal(p.Content(), &content)
		if via, ok := content.Via.(string); ok {
			add(stateKey(spec.MRoomMember, via))
		}
	}
	return m
}

// diffMap returns the keys where the reference's map and the generator's state
// differ, sorted.
func diffMap(r *room, ref specres.StateMap, gen pmap) []refDiff {
	var out []refDiff
	refIdx := func(id string) int32 {
		if i, ok := r.byID[id]; ok {
			return i
		}
		return -1 // not an event of the room: specres.Resolve returns only the states' events
	}
	found := 0 // keys of ref that gen has
	gen.each(func(k string, v int32) {
		id, ok := ref[specKey(k)]
		switch {
		case !ok:
			out = append(out, refDiff{key: k, ref: -1, gen: v})
		case id != r.events[v].id:
			found++
			out = append(out, refDiff{key: k, ref: refIdx(id), gen: v})
		default:
			found++
		}
	})
	if found != len(ref) {
		for k, id := range ref {
			sk := stateKey(k.Type, k.StateKey)
			if _, ok := gen.get(sk); !ok {
				out = append(out, refDiff{key: sk, ref: refIdx(id), gen: -1})
			}
		}
	}
	slices.SortFunc(out, func(a, b refDiff) int { return strings.Compare(a.key, b.key) })
	return out
}

// diffPmap returns the keys where two generator states differ, sorted.
func diffPmap(ref, gen pmap) []refDiff {
	var out []refDiff
	diff(ref, gen, func(k string) {
		d := refDiff{key: k, ref: -1, gen: -1}
		if v, ok := ref.get(k); ok {
			d.ref = v
		}
		if v, ok := gen.get(k); ok {
			d.gen = v
		}
		out = append(out, d)
	})
	slices.SortFunc(out, func(a, b refDiff) int { return strings.Compare(a.key, b.key) })
	return out
}
