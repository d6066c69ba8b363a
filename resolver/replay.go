package resolver

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/mtxdb/mtxdb/authrules"
	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/roomrecord"
	"github.com/mtxdb/mtxdb/roomstate"
)

// errRejected is wrapped by the reason an event fails authorization (the reason
// its state record keeps).
var errRejected = errors.New("resolver: event rejected")

// authorize checks a PDU the way a server does on receipt (Matrix spec v1.19,
// Server-Server API, "Checks performed on receipt of a PDU", steps 4 and 5):
// against the events named in its auth_events (none of which may be rejected), then
// against the state before it. It returns nil when the event is allowed and an
// error wrapping errRejected that says why when it is not. Panics inside
// gomatrixserverlib become rejections naming the event.
func (r *roomResolver) authorize(pdu gomatrixserverlib.PDU, at int32, before hamtstore.NodeID) (err error) {
	defer func() {
		if rec := recover(); rec != nil {
			err = fmt.Errorf("%w: event %s: gomatrixserverlib panicked: %v", errRejected, pdu.EventID(), rec)
		}
	}()
	var authPDUs []gomatrixserverlib.PDU
	ids := pdu.AuthEventIDs()
	var edges []int32 // the auth events' graph indexes, as the PDU lists them
	if at >= 0 && r.g != nil {
		if e := r.g.g.Auth(int(at)); len(e) == len(ids) {
			edges = e
		}
	}
	var at4 [4]int32
	idx := at4[:0] // the graph index of each auth event, as light takes it
	for j, id := range ids {
		x := findIndex
		if edges != nil && (edges[j] < 0 || r.g.ids[edges[j]] == id) { // else the graph record and the PDU disagree: look the ID up
			x = edges[j]
		}
		idx = append(idx, x)
		p, err := r.authEventAt(id, x)
		if err != nil {
			return err
		}
		authPDUs = append(authPDUs, p)
	}
	rejected := func(id string) bool { // Rejected, by the indexes known above
		for j, aid := range ids {
			if aid == id && idx[j] >= 0 {
				return r.rejectedAt(idx[j])
			}
		}
		return r.Rejected(id)
	}
	// The rules on auth_events first; then the rules against the auth events and
	// the state (authrules.Authorize).
	if err := authrules.CheckAuthEvents(pdu, authPDUs, rejected, r.impliedCreate(pdu)); err != nil {
		return fmt.Errorf("%w: event %s: against its auth events: %w", errRejected, pdu.EventID(), err)
	}
	if err := r.allowedByAuthEvents(pdu, authPDUs); err != nil {
		return fmt.Errorf("%w: event %s: against its auth events: %v", errRejected, pdu.EventID(), err)
	}

	var statePDUs []gomatrixserverlib.PDU
	same := true // the state before gives exactly the auth events, key for key
	for _, t := range r.cache.neededFor(pdu) {
		id, x, ok, err := r.lookupAt(before, Key{Type: t.EventType, StateKey: t.StateKey})
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		p, err := r.authEventAt(id, x)
		if err != nil {
			return err
		}
		statePDUs = append(statePDUs, p)
	}
	if same = sameByKey(authPDUs, statePDUs); same {
		// The rules read the same event for every key they ask: the outcome is the
		// one just computed (gomatrixserverlib.Allowed is a function of the event
		// and those events).
		return nil
	}
	if err := r.cache.allowedOnce(pdu, statePDUs); err != nil {
		return fmt.Errorf("%w: event %s: against the state before it: %v", errRejected, pdu.EventID(), err)
	}
	return nil
}

// allowedByAuthEvents is Cache.allowedOnce for pdu against its auth events,
// taking the outcome the prefetcher computed for it when there is one.
func (r *roomResolver) allowedByAuthEvents(pdu gomatrixserverlib.PDU, authPDUs []gomatrixserverlib.PDU) error {
	if a := r.ahead; a.checked && a.id == pdu.EventID() {
		r.aheadUsed++
		return r.cache.allowedOnceBy(pdu, authPDUs, func() error { return a.authErr })
	}
	return r.cache.allowedOnce(pdu, authPDUs)
}

// sameByKey reports whether two lists of state events hold, key for key, the same
// events, each key once.
func sameByKey(a, b []gomatrixserverlib.PDU) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if x.StateKey() == nil {
			return false
		}
		n := 0
		for _, y := range a {
			if y.StateKey() != nil && keyOf(y) == keyOf(x) {
				n++
			}
		}
		if n != 1 || !slices.ContainsFunc(b, func(y gomatrixserverlib.PDU) bool { return y.EventID() == x.EventID() }) {
			return false
		}
	}
	return true
}

// ReplayOptions tune Replay.
type ReplayOptions struct {
	// Force recomputes every event and writes every state record, including those an
	// every-k repack dropped, and clears the room head's keep rule (Head.StateEvery):
	// the room is all-snapshots again until the next every-k repack. The rule is
	// cleared, and the room marked not replayed, before the first record is
	// written, so that a Force replay that does not finish leaves the events
	// without a state record to a plain Replay. By default an
	// event whose state record exists and whose prev_events were not recomputed keeps
	// its stored state.
	Force bool
	// Progress, if set, is called after each event with (done, total).
	Progress func(done, total int)
	// OnResolve, if set, receives the cost of every resolution of two or more
	// distinct states that the replay computes (one it has computed before, for
	// the same states, is not computed again).
	OnResolve func(ResolutionStats)
	// ResolutionTimes, if set, receives the wall time of every resolution the replay
	// computes, as OnResolve's Duration: cheaper than OnResolve, which counts the
	// events each resolution uses.
	ResolutionTimes *[]time.Duration
	// Stop, if set, is asked before each event; when it returns true, Replay writes
	// and syncs the state records computed so far and returns ErrStopped with the
	// counts up to there. The head is not updated (the room stays not replayed), so
	// a later Replay computes only the events left without a state record; after a
	// stopped Force replay (records partly rewritten, the keep rule already
	// cleared), Force again rewrites every record, and a plain Replay computes
	// the events left without one.
	Stop func() bool

	// batchSize is the number of state records written per batch (0: 1000; tests
	// set it).
	batchSize int
}

// ErrStopped is returned by Replay when ReplayOptions.Stop asked it to stop; what
// it computed before is stored and synced.
var ErrStopped = errors.New("resolver: replay stopped")

// ReplayResult counts what Replay did. Its Stats sum the resolutions' costs, and
// Stats.EventsLoaded counts every PDU parsed. The forward extremities and
// current state it set are the room's head (roomstate.Room.Head).
type ReplayResult struct {
	Events   int // events walked
	Computed int // events whose state was computed and written this run
	Outliers int // events left out: a prev or auth event (or theirs) never arrived, or Cyclic
	// Cyclic names, by arrival, the events left out because they, or an ancestor, lie
	// on a cycle of prev_events and auth_events (an event naming itself, two naming
	// each other, an auth event that descends from the event): no topological order
	// holds them.
	Cyclic []string
	// NotKept counts events whose state record an every-k repack dropped: they keep
	// having none. Rederived counts those whose state after was recomputed in memory
	// because a computed event names them in prev_events.
	NotKept, Rederived int
	Rejected           int // events that failed authorization
	// AuthAhead counts the events whose check against their own auth events
	// ran ahead, on the goroutine that parses the PDUs.
	AuthAhead int
	Stats
}

// Replay computes the state before and after every event of a room in topological
// order over prev_events (ties by arrival, so an import in arrival order replays in
// that order; events imported with AnyOrder are sorted), leaves out as outliers the
// events whose prev or auth events are missing or lie on a cycle (and their
// descendants; ReplayResult.Cyclic names the cycle's), rejects
// what fails authorization, stores a state record per event, and sets the room's
// forward extremities (the non-rejected events no non-rejected event points at) and
// current state (the resolution of the states after them).
//
// Replay reads each event's graph record, its PDU and its state records, not its
// metadata record: roomstate.Room.Check (mtxdb verify) compares the two.
//
// Replay is incremental: an event that already has a state record keeps it unless
// one of its prev_events was computed in this run (or opts.Force is set), so running
// it after an import computes only the new events, and running it twice writes
// nothing the second time.
//
// On a room after an every-k repack (roomrecord.Head.KeepsState), an event whose state
// record the rule let the repack drop is taken as replayed and accepted (the repack
// keeps rejected events' records) and gets no record. New events usually need only
// the states after the forward extremities, which the rule keeps; when a new event
// names a dropped event in prev_events, Replay recomputes that state in memory from
// the nearest ancestors whose states are stored (their resolution, as the first
// replay computed it) and does not write it. With opts.Force the whole room is
// replayed again and every record is written (see ReplayOptions.Force).
//
// ctx is checked before each event, as opts.Stop is: when it is done, Replay
// stops as for Stop and returns an error matching both ErrStopped and ctx.Err().
func Replay(ctx context.Context, room *roomstate.Room, opts ReplayOptions) (ReplayResult, error) {
	if opts.batchSize <= 0 {
		opts.batchSize = 1000
	}
	r, err := newRoomResolver(room)
	if err != nil {
		return ReplayResult{}, err
	}
	r.onResolve, r.resolutionTimes = opts.OnResolve, opts.ResolutionTimes
	// Snapshot nodes and state records go to the store on another goroutine,
	// beside the replay's; run waits for the last write.
	r.w.WriteBehind()
	r.rd = r.w.Reader()
	// Load the auth index up front, so its one pass over the room is not charged
	// to the first resolution.
	g, err := r.graph()
	if err != nil {
		return ReplayResult{}, err
	}
	g.keepMarks = true
	n := len(g.ids)
	rp := &replay{ctx: ctx, writeCtx: context.WithoutCancel(ctx), r: r, g: g, opts: opts, after: make([]hamtstore.NodeID, n), hasAfter: make([]bool, n),
		computed: make([]bool, n), referenced: make([]bool, n), dropped: make([]bool, n)}
	return rp.run()
}

// replay is the state of one Replay: per event (by graph index) the state after it
// once known, and what the walk learnt. Slices of the room's size hold a few bytes
// per event; states are roots, never maps.
type replay struct {
	ctx context.Context // Replay's
	// writeCtx is ctx without its cancellation, for the writes of a step
	// and of stop: a replay stops between events, with what it computed
	// written and synced.
	writeCtx   context.Context
	r          *roomResolver
	g          *graph
	opts       ReplayOptions
	res        ReplayResult
	after      []hamtstore.NodeID
	hasAfter   []bool
	computed   []bool          // state computed in this run
	referenced []bool          // named in prev_events by an accepted event
	dropped    []bool          // state record dropped by the keep rule
	head       roomrecord.Head // the room's head when the replay started
	// late is, under a keep rule, whether an event arrived after the rule was set
	// or descends from such an event; nil without one.
	late []bool
	// pf parses the PDUs ahead of the replay; nil until the first event computed
	// (the events before it keep their stored state and need no PDU, so an
	// incremental replay of a few new events does not parse the whole room ahead).
	pf *prefetcher
	// batchIDs and batch are the state records computed and not yet written.
	batchIDs []string
	batch    []roomrecord.EventState
	// uncommitted counts the state records written since the last commit.
	uncommitted int
}

// run replays the room in phases: order (the topological order and each event's
// position in it), then per event step (reuse the stored state, or compute it),
// then finish (forward extremities, current state, head).
func (rp *replay) run() (_ ReplayResult, err error) {
	order, err := rp.order()
	if err != nil {
		return rp.res, err
	}
	rp.head = rp.r.room.Head()
	defer func() { rp.pf.stop() }()
	defer func() {
		// No write is left running when Replay returns; its error, if the
		// replay had none of its own.
		if werr := rp.r.w.Wait(); werr != nil && err == nil {
			err = werr
		}
	}()
	if rp.head.StateEvery > 0 {
		rp.late = make([]bool, len(rp.g.ids))
	}
	if err := rp.startForce(); err != nil {
		return rp.res, err
	}
	for p := range order {
		if cerr := rp.ctx.Err(); cerr != nil || rp.opts.Stop != nil && rp.opts.Stop() {
			err := rp.stop(p, len(order), cerr)
			return rp.res, err
		}
		if err := rp.step(order, p); err != nil {
			return rp.res, err
		}
	}
	if err := rp.flush(); err != nil {
		return rp.res, err
	}
	rp.r.upTo = int32(len(order))
	err = rp.finish(order)
	return rp.res, err
}

// startForce, for a Force replay of a room under an every-k keep rule, clears
// the rule and marks the room not replayed in its head, synced before the first
// state record is written. A Force replay stopped or killed before its end then
// leaves a room whose events without a state record a plain Replay computes
// (and verify counts as unreplayed); under the rule they would be taken as
// dropped by the repack and computed by nothing but another Force replay.
// rp.head keeps the head as it was read.
func (rp *replay) startForce() error {
	h := rp.r.room.Head()
	if !rp.opts.Force || h.StateEvery == 0 {
		return nil
	}
	h.StateEvery, h.StateKeptBelow, h.Replayed = 0, 0, false
	if err := rp.r.w.Commit(rp.writeCtx, &h); err != nil {
		return fmt.Errorf("resolver: room %s: clear the keep rule before a forced replay: %w", h.RoomID, err)
	}
	return nil
}

// order computes the replay order (replayOrder), records each event's position in
// it (graph.pos, -1 for the outliers left out) and counts the outliers.
func (rp *replay) order() ([]int32, error) {
	g := rp.g
	n := len(g.ids)
	order, err := rp.replayOrder()
	if err != nil {
		return nil, err
	}
	g.pos = make([]int32, n)
	for i := range g.pos {
		g.pos[i] = -1
	}
	for p, i := range order {
		g.pos[i] = int32(p)
	}
	g.sortKidsByPosition()
	rp.res.Outliers = n - len(order)
	return order, nil
}

// stop ends a replay that opts.Stop (or, with cause set, the context) asked to
// stop before the event at position p of total: it writes and syncs the state
// records computed so far and returns ErrStopped naming where, wrapping cause
// too.
func (rp *replay) stop(p, total int, cause error) error {
	room := rp.r.room
	if err := rp.flush(); err != nil {
		return err
	}
	if err := rp.r.w.Commit(rp.writeCtx, nil); err != nil {
		return err
	}
	rp.res.Stats, rp.res.AuthAhead = rp.r.stats, rp.r.aheadUsed
	if cause != nil {
		return fmt.Errorf("%w: room %s after %d of %d events: %w", ErrStopped, room.ID(), p, total, cause)
	}
	return fmt.Errorf("%w: room %s after %d of %d events", ErrStopped, room.ID(), p, total)
}

// step replays the event at position p of order: it bounds what the replay keeps
// in memory, then reuses the event's stored state when it may (reuse) or computes
// it (compute).
func (rp *replay) step(order []int32, p int) error {
	r, g, room := rp.r, rp.g, rp.r.room
	i := order[p]
	r.upTo = int32(p) - 1
	rp.pf.take()
	if p%readerResetEvery == readerResetEvery-1 {
		// Bound the decoded nodes kept (later reads go to the store).
		r.rd.Reset()
	}
	if p%releaseMappedEvery == releaseMappedEvery-1 {
		// Bound the store's pages mapped into the process (a replay reads
		// every PDU).
		if err := room.ReleaseMapped(); err != nil {
			return err
		}
	}
	prevs, auths := g.g.Prev(int(i)), g.g.Auth(int(i))
	if rp.late != nil {
		rp.late[i] = uint32(i) >= rp.head.StateKeptBelow
		for _, x := range slices.Concat(prevs, auths) {
			rp.late[i] = rp.late[i] || rp.late[x]
		}
	}
	if !rp.opts.Force {
		kept, err := rp.reuse(i)
		if err != nil {
			return err
		}
		if kept {
			rp.res.Events++
			if r.rejectedAt(i) {
				rp.res.Rejected++
			}
			if rp.opts.Progress != nil {
				rp.opts.Progress(p+1, len(g.ids))
			}
			return nil
		}
	}
	if err := rp.compute(order, p, prevs); err != nil {
		return err
	}
	rp.res.Events++
	if rp.opts.Progress != nil {
		rp.opts.Progress(p+1, len(g.ids))
	}
	return nil
}

// reuse takes event i as replayed without computing it: when its stored state
// record stands (keepStored), or when the room's keep rule let an every-k repack
// drop the record and the event arrived before the rule (keepDropped).
func (rp *replay) reuse(i int32) (bool, error) {
	kept, err := rp.keepStored(i)
	if err == nil && !kept && rp.head.StateEvery > 0 && !rp.late[i] && !rp.head.KeepsState(rp.metaForKeep(i)) {
		if kept = rp.keepDropped(i); kept {
			rp.dropped[i] = true
			rp.res.NotKept++
		}
	}
	return kept, err
}

// compute computes the state of the event at position p of order, whose
// prev_events are prevs: the state before it is the resolution of the states
// after them; the event is authorised against its auth events and that state;
// the state after it adds the event under its key when it is an accepted state
// event. The state record is queued for writing.
func (rp *replay) compute(order []int32, p int, prevs []int32) error {
	r, g, room := rp.r, rp.g, rp.r.room
	i := order[p]
	id := g.ids[i]
	rp.computed[i] = true
	rp.res.Computed++
	if rp.pf == nil && (rp.opts.Force || !rp.head.Replayed) {
		// From this event on: the prefetcher keeps the state events it
		// parsed as auth events of the later ones. A replay that resumes
		// parses the room's first event (its create event, an auth event of
		// every event) for the prefetcher to start with.
		if p > 0 {
			if _, err := r.pdu(g.ids[order[0]]); err != nil {
				return err
			}
		}
		rp.pf = rp.prefetch(order[p:])
		rp.pf.take()
	}
	prevRoots := make([]hamtstore.NodeID, 0, len(prevs))
	for _, x := range prevs {
		root, err := rp.afterOf(x)
		if err != nil {
			return fmt.Errorf("resolver: room %s: event %s: %w", room.ID(), id, err)
		}
		prevRoots = append(prevRoots, root)
	}
	if b, ok := prevsBound(g, prevs); ok && boundByPrevs {
		if b < r.upTo {
			boundedResolutions.Add(1)
		}
		r.upTo = b
	}
	before, err := r.resolveSnapshots(rp.ctx, prevRoots)
	r.upTo = int32(p) - 1
	if err != nil {
		return fmt.Errorf("event %s: %w", id, err)
	}
	pdu, err := r.pdu(id)
	if err != nil {
		return err
	}
	st := roomrecord.EventState{Before: before, After: before}
	if aerr := r.authorize(pdu, i, before); aerr != nil {
		if !errors.Is(aerr, errRejected) {
			return aerr
		}
		st.Rejected, st.Reason = true, aerr.Error()
		r.setRejected(i, true)
		rp.res.Rejected++
	} else {
		r.setRejected(i, false)
		for _, x := range prevs {
			rp.referenced[x] = true
		}
		if k := g.keyOf(i); k >= 0 {
			change := StateMap{g.keys[k]: id}
			st.After, err = r.w.Apply(rp.writeCtx, before, change, nil)
			if err != nil {
				return fmt.Errorf("resolver: room %s: event %s: write state: %w", room.ID(), id, err)
			}
			r.applied(before, st.After, change, nil)
		}
	}
	rp.after[i], rp.hasAfter[i] = st.After, true
	rp.batchIDs = append(rp.batchIDs, id)
	rp.batch = append(rp.batch, st)
	if len(rp.batchIDs) >= rp.opts.batchSize {
		return rp.flush()
	}
	return nil
}

// flush writes the state records queued by compute.
func (rp *replay) flush() error {
	if len(rp.batchIDs) == 0 {
		return nil
	}
	err := rp.r.w.PutEventStates(rp.writeCtx, rp.batchIDs, rp.batch)
	rp.uncommitted += len(rp.batchIDs)
	rp.batchIDs, rp.batch = rp.batchIDs[:0], rp.batch[:0]
	if err == nil && rp.uncommitted >= replayCommitEvery {
		// Made durable along the way: a replay that crashes resumes from here,
		// and the engine's index entries of the records written so far do not
		// wait in memory for the end.
		err = rp.r.w.Commit(rp.writeCtx, nil)
		rp.uncommitted = 0
	}
	return err
}

// replayCommitEvery is how many state records a replay writes between commits
// (each a sync of the store; a variable for the tests).
var replayCommitEvery = 100_000

// finish sets the room's head once every event of order is replayed: the forward
// extremities (the accepted events no accepted event names in prev_events, sorted)
// and the current state (the resolution of the states after them), and syncs.
// When nothing was computed and the room was replayed before, the stored head
// stands.
func (rp *replay) finish(order []int32) error {
	r, g, room := rp.r, rp.g, rp.r.room
	if rp.res.Computed == 0 && room.Head().Replayed {
		return nil
	}
	var fwd []string
	fwdIdx := map[string]int32{}
	for _, i := range order {
		if !r.rejectedAt(i) && !rp.referenced[i] {
			fwd = append(fwd, g.ids[i])
			fwdIdx[g.ids[i]] = i
		}
	}
	sort.Strings(fwd)
	// The decoded nodes kept since the last reset are of the events just
	// replayed; the resolution of the extremities' states reads its own.
	r.rd.Reset()
	var fwdRoots []hamtstore.NodeID
	for _, id := range fwd {
		root, err := rp.afterOf(fwdIdx[id])
		if err != nil {
			return fmt.Errorf("resolver: room %s: forward extremity: %w", room.ID(), err)
		}
		fwdRoots = append(fwdRoots, root)
	}
	cur, err := r.resolveSnapshots(rp.ctx, fwdRoots)
	if err != nil {
		return fmt.Errorf("current state: %w", err)
	}
	h := room.Head()
	h.ForwardExtremities, h.CurrentState, h.Replayed = fwd, cur, true
	if rp.opts.Force {
		h.StateEvery, h.StateKeptBelow = 0, 0 // every state record was written again
	}
	if err := r.w.Commit(rp.writeCtx, &h); err != nil {
		return err
	}
	rp.res.Stats, rp.res.AuthAhead = r.stats, r.aheadUsed
	return nil
}

// prevsBound returns the last replay position of prevs. The states after
// them hold only events at that position or before: a state after an event
// holds events of its history (prev_events, followed back), and the replay
// order puts an event after its prev_events. So does every path of auth
// events between two events of those states (each event on it is in the
// history of the later one). The resolution of the states leaves out the
// auth children replayed after it (graph.childHandles): an event whose
// prev_events are far back in the room's history would otherwise have its
// auth difference's forward walks (inUnconflictedChain) and conflicted
// subgraph walk through every later event of the room. ok is false when a
// prev event has no replay position.
func prevsBound(g *graph, prevs []int32) (bound int32, ok bool) {
	bound = -1
	for _, x := range prevs {
		if x < 0 || g.pos[x] < 0 {
			return 0, false
		}
		bound = max(bound, g.pos[x])
	}
	return bound, len(prevs) > 0
}

// boundByPrevs turns prevsBound's bound on (tests compare without it);
// boundedResolutions counts the events it lowered the bound for.
var (
	boundByPrevs       = true
	boundedResolutions atomic.Int64
)

// readerResetEvery bounds the HAMT nodes a replay keeps decoded: the reader is reset
// every so many events (the nodes a later event needs are read again from the store).
const readerResetEvery = 4096

// releaseMappedEvery is how often (in events) a replay releases the store's
// mapped pages.
const releaseMappedEvery = 4096

// metaForKeep is what Head.KeepsState reads of an event.
func (rp *replay) metaForKeep(i int32) roomrecord.EventMeta {
	return roomrecord.EventMeta{Seq: uint32(i), IsState: rp.g.keyOf(i) >= 0, EventID: rp.g.ids[i]}
}

// keepStored uses an event's stored state record when it has one and none of its
// prev_events was computed in this run; it records what Replay tracks per event.
func (rp *replay) keepStored(i int32) (bool, error) {
	prevs := rp.g.g.Prev(int(i))
	for _, x := range prevs {
		if rp.computed[x] {
			return false, nil
		}
	}
	st, ok, err := rp.r.room.EventState(rp.g.ids[i])
	if err != nil || !ok {
		return false, err
	}
	rp.after[i], rp.hasAfter[i] = st.After, true
	rp.r.setRejected(i, st.Rejected)
	if !st.Rejected {
		for _, x := range prevs {
			rp.referenced[x] = true
		}
	}
	return true, nil
}

// keepDropped takes as replayed an event whose state record the room's keep rule let
// an every-k repack drop, unless one of its prev_events was computed in this run (then
// it is computed and its record written again). Such an event was accepted (the
// repack keeps rejected events' records), so it references its prev_events.
func (rp *replay) keepDropped(i int32) bool {
	prevs := rp.g.g.Prev(int(i))
	for _, x := range prevs {
		if rp.computed[x] {
			return false
		}
	}
	rp.r.setRejected(i, false)
	for _, x := range prevs {
		rp.referenced[x] = true
	}
	return true
}

// afterOf returns the state after an event: known, or, for an event whose state
// record was dropped, recomputed as the resolution of the states after its
// prev_events (a dropped event is an accepted non-state event, so its state after
// is its state before), walking up through dropped ancestors to stored states. The
// states recomputed are kept; nothing is written.
func (rp *replay) afterOf(i int32) (hamtstore.NodeID, error) {
	if rp.hasAfter[i] {
		return rp.after[i], nil
	}
	stack := []int32{i}
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		if rp.hasAfter[x] {
			stack = stack[:len(stack)-1]
			continue
		}
		if !rp.dropped[x] {
			return hamtstore.NodeID{}, fmt.Errorf("prev_event %s not replayed before it", rp.g.ids[x])
		}
		prevs := rp.g.g.Prev(int(x))
		roots := make([]hamtstore.NodeID, 0, len(prevs))
		pending := false
		for _, p := range prevs {
			if rp.hasAfter[p] {
				roots = append(roots, rp.after[p])
			} else {
				stack = append(stack, p)
				pending = true
			}
		}
		if pending {
			continue
		}
		root, err := rp.r.resolveSnapshots(rp.ctx, roots)
		if err != nil {
			return hamtstore.NodeID{}, fmt.Errorf("event %s (state not kept): %w", rp.g.ids[x], err)
		}
		rp.after[x], rp.hasAfter[x] = root, true
		rp.res.Rederived++
		stack = stack[:len(stack)-1]
	}
	return rp.after[i], nil
}

// replayOrder returns the events whose prev and auth events are all present,
// parents before children, ties broken by arrival (Kahn's algorithm over
// prev_events and auth_events).
func (rp *replay) replayOrder() ([]int32, error) {
	g := rp.g
	n := len(g.ids)
	pending := make([]int32, n)
	childOff := make([]int32, n+1)
	outlier := make([]bool, n)
	var missing []int32
	parentsOf := func(i int) []int32 {
		ps := slices.Concat(g.g.Prev(i), g.g.Auth(i))
		slices.Sort(ps)
		return slices.Compact(ps)
	}
	for i := range n {
		for _, p := range parentsOf(i) {
			if p < 0 {
				missing = append(missing, int32(i))
				continue
			}
			childOff[p+1]++
		}
	}
	for i := range n {
		childOff[i+1] += childOff[i]
	}
	children := make([]int32, childOff[n])
	fill := slices.Clone(childOff[:n])
	for i := range n {
		ps := parentsOf(i)
		if len(ps) > 0 && ps[0] < 0 {
			continue // an outlier: its present parents do not wait for it
		}
		for _, p := range ps {
			children[fill[p]] = int32(i)
			fill[p]++
			pending[i]++
		}
	}
	kids := func(x int32) []int32 { return children[childOff[x]:fill[x]] }
	for _, i := range missing { // an outlier's descendants are outliers too
		stack := []int32{i}
		for len(stack) > 0 {
			x := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if !outlier[x] {
				outlier[x] = true
				stack = append(stack, kids(x)...)
			}
		}
	}
	nOut := 0
	ready := &indexHeap{}
	for i := range n {
		if outlier[i] {
			nOut++
		} else if pending[i] == 0 {
			heap.Push(ready, int32(i))
		}
	}
	order := make([]int32, 0, n-nOut)
	for ready.Len() > 0 {
		i := heap.Pop(ready).(int32)
		order = append(order, i)
		for _, c := range kids(i) {
			if pending[c]--; pending[c] == 0 && !outlier[c] {
				heap.Push(ready, c)
			}
		}
	}
	if len(order)+nOut != n {
		// What Kahn's algorithm could not reach lies on a prev/auth cycle or
		// descends from one: no topological order exists, so those events are left
		// out like outliers, and named.
		for i := range n {
			if !outlier[i] && pending[i] > 0 {
				rp.res.Cyclic = append(rp.res.Cyclic, g.ids[i])
			}
		}
	}
	return order, nil
}

// indexHeap pops the event that arrived first (the lowest index).
type indexHeap []int32

func (h indexHeap) Len() int           { return len(h) }
func (h indexHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h indexHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *indexHeap) Push(x any)        { *h = append(*h, x.(int32)) }
func (h *indexHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
