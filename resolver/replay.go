package resolver

import (
	"container/heap"
	"errors"
	"fmt"
	"sort"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/roomstate"
)

// ErrRejected is wrapped by the reason an event fails authorization.
var ErrRejected = errors.New("resolver: event rejected")

// Authorize checks a PDU the way a server does on receipt (spec, Server-Server API
// "Checks performed on receipt of a PDU", steps 4 and 5): against the events named in
// its auth_events (none of which may be rejected), then against the state before it.
// It returns nil when the event is allowed and an error wrapping ErrRejected that
// says why when it is not. Panics inside gomatrixserverlib become rejections naming
// the event.
func (r *Resolver) Authorize(pdu gomatrixserverlib.PDU, before hamtstore.NodeID) (err error) {
	defer func() {
		if rec := recover(); rec != nil {
			err = fmt.Errorf("%w: event %s: gomatrixserverlib panicked: %v", ErrRejected, pdu.EventID(), rec)
		}
	}()
	var authPDUs []gomatrixserverlib.PDU
	for _, id := range pdu.AuthEventIDs() {
		if r.rejected[id] {
			return fmt.Errorf("%w: event %s: auth event %s was rejected", ErrRejected, pdu.EventID(), id)
		}
		p, err := r.pdu(id)
		if err != nil {
			return err
		}
		if p.StateKey() == nil {
			return fmt.Errorf("%w: event %s: auth event %s is not a state event", ErrRejected, pdu.EventID(), id)
		}
		authPDUs = append(authPDUs, p)
	}
	ae, err := gomatrixserverlib.NewAuthEvents(authPDUs)
	if err != nil {
		return fmt.Errorf("%w: event %s: auth events: %v", ErrRejected, pdu.EventID(), err)
	}
	err = gomatrixserverlib.Allowed(pdu, ae, roomstate.UserIDForSender)
	r.cache.note(pdu, authPDUs, err == nil)
	if err != nil {
		return fmt.Errorf("%w: event %s: against its auth events: %v", ErrRejected, pdu.EventID(), err)
	}

	var statePDUs []gomatrixserverlib.PDU
	for _, t := range gomatrixserverlib.StateNeededForAuth([]gomatrixserverlib.PDU{pdu}).Tuples() {
		id, ok, err := r.room.Lookup(r.rd, before, t.EventType, t.StateKey)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		p, err := r.pdu(id)
		if err != nil {
			return err
		}
		statePDUs = append(statePDUs, p)
	}
	se, err := gomatrixserverlib.NewAuthEvents(statePDUs)
	if err != nil {
		return fmt.Errorf("%w: event %s: state before: %v", ErrRejected, pdu.EventID(), err)
	}
	err = gomatrixserverlib.Allowed(pdu, se, roomstate.UserIDForSender)
	r.cache.note(pdu, statePDUs, err == nil)
	if err != nil {
		return fmt.Errorf("%w: event %s: against the state before it: %v", ErrRejected, pdu.EventID(), err)
	}
	return nil
}

// ReplayOptions tune Replay.
type ReplayOptions struct {
	// Force recomputes every event and writes every state record, including those an
	// every-k repack dropped, and clears the room head's keep rule (Head.StateEvery):
	// the room is all-snapshots again until the next every-k repack. By default an
	// event whose state record exists and whose prev_events were not recomputed keeps
	// its stored state.
	Force bool
	// BatchSize is the number of state records written per batch (default 1000).
	BatchSize int
	// Progress, if set, is called after each event with (done, total).
	Progress func(done, total int)
	// OnResolve, if set, receives the cost of every resolution (Resolver.OnResolve).
	OnResolve func(ResolutionStats)
}

// ReplayResult counts what Replay did.
type ReplayResult struct {
	Events   int // events walked
	Computed int // events whose state was computed and written this run
	Outliers int // events left out: a prev or auth event (or theirs) never arrived
	// NotKept counts events whose state record an every-k repack dropped: they keep
	// having none. Rederived counts those whose state after was recomputed in memory
	// because a computed event names them in prev_events.
	NotKept, Rederived int
	Rejected           int
	Resolutions        int // state resolutions with two or more distinct input states
	ConflictedKeys     int
	AuthDifference     int // events in auth differences, summed over resolutions
	FullConflicted     int // events in full conflicted sets, summed over resolutions
	ForwardExtremities []string
	CurrentState       hamtstore.NodeID
}

// Replay computes the state before and after every event of a room in topological
// order over prev_events (ties by arrival, so an import in arrival order replays in
// that order; events imported with AnyOrder are sorted), leaves out as outliers the
// events whose prev or auth events are missing (and their descendants), rejects
// what fails authorization, stores a state record per event, and sets the room's
// forward extremities (the non-rejected events no non-rejected event points at) and
// current state (the resolution of the states after them).
//
// Replay is incremental: an event that already has a state record keeps it unless
// one of its prev_events was computed in this run (or opts.Force is set), so running
// it after an import computes only the new events, and running it twice writes
// nothing the second time.
//
// On a room after an every-k repack (roomstate.Head.KeepsState), an event whose state
// record the rule let the repack drop is taken as replayed and accepted (the repack
// keeps rejected events' records) and gets no record. New events usually need only
// the states after the forward extremities, which the rule keeps; when a new event
// names a dropped event in prev_events, Replay recomputes that state in memory from
// the nearest ancestors whose states are stored (their resolution, as the first
// replay computed it) and does not write it. With opts.Force the whole room is
// replayed again and every record is written (see ReplayOptions.Force).
func Replay(room *roomstate.Room, opts ReplayOptions) (ReplayResult, error) {
	if opts.BatchSize <= 0 {
		opts.BatchSize = 1000
	}
	r, err := New(room)
	if err != nil {
		return ReplayResult{}, err
	}
	r.OnResolve = opts.OnResolve
	ids, err := room.EventIDs()
	if err != nil {
		return ReplayResult{}, err
	}
	// Build the auth index (metadata of every event, auth children) up front, so its
	// one pass over the room is not charged to the first resolution.
	if _, err := r.AuthChildren(""); err != nil {
		return ReplayResult{}, err
	}
	r.replayed = make(map[string]bool, len(ids))
	after := make(map[string]hamtstore.NodeID, len(ids))
	computed := map[string]bool{}
	referenced := map[string]bool{}
	var res ReplayResult
	var batchIDs []string
	var batch []roomstate.EventState
	flush := func() error {
		if len(batchIDs) == 0 {
			return nil
		}
		err := room.PutEventStates(batchIDs, batch)
		batchIDs, batch = batchIDs[:0], batch[:0]
		return err
	}
	order, err := r.replayOrder(ids)
	if err != nil {
		return res, err
	}
	res.Outliers = len(ids) - len(order)
	h0 := room.Head()
	dropped := map[string]bool{} // state record dropped by the keep rule
	late := map[string]bool{}    // arrived after the keep rule was set, or descends from such an event
	afterOf := func(id string) (hamtstore.NodeID, error) {
		return rederive(r, id, after, dropped, &res)
	}
	for i, id := range order {
		m, err := r.meta(id)
		if err != nil {
			return res, err
		}
		if i%readerResetEvery == readerResetEvery-1 {
			r.rd.Reset() // bound the decoded nodes kept; later reads go to the store
		}
		if h0.StateEvery > 0 {
			late[id] = m.Seq >= h0.StateKeptBelow
			for _, p := range m.PrevEvents {
				late[id] = late[id] || late[p]
			}
			for _, a := range m.AuthEvents {
				late[id] = late[id] || late[a]
			}
		}
		if !opts.Force {
			kept, err := keepStored(r, m, after, computed, referenced)
			if err == nil && !kept && h0.StateEvery > 0 && !late[id] && !h0.KeepsState(m) {
				kept, err = keepDropped(r, m, computed, referenced)
				if kept {
					dropped[id] = true
					res.NotKept++
				}
			}
			if err != nil {
				return res, err
			}
			if kept {
				r.replayed[id] = true
				res.Events++
				if r.rejected[id] {
					res.Rejected++
				}
				if opts.Progress != nil {
					opts.Progress(i+1, len(ids))
				}
				continue
			}
		}
		computed[id] = true
		res.Computed++
		prevRoots := make([]hamtstore.NodeID, 0, len(m.PrevEvents))
		for _, p := range m.PrevEvents {
			root, err := afterOf(p)
			if err != nil {
				return res, fmt.Errorf("resolver: room %s: event %s: %w", room.ID(), id, err)
			}
			prevRoots = append(prevRoots, root)
		}
		before, err := r.Resolve(prevRoots)
		if err != nil {
			return res, fmt.Errorf("event %s: %w", id, err)
		}
		pdu, err := r.pdu(id)
		if err != nil {
			return res, err
		}
		st := roomstate.EventState{Before: before, After: before}
		if aerr := r.Authorize(pdu, before); aerr != nil {
			if !errors.Is(aerr, ErrRejected) {
				return res, aerr
			}
			st.Rejected, st.Reason = true, aerr.Error()
			r.rejected[id] = true
			res.Rejected++
		} else {
			for _, p := range m.PrevEvents {
				referenced[p] = true
			}
			if m.IsState {
				st.After, err = hamtstore.Set(room.Nodes(), r.rd, before, roomstate.StateKey(m.Type, m.StateKey),
					hamtstore.Value(roomstate.EventRecordID(id)))
				if err != nil {
					return res, fmt.Errorf("resolver: room %s: event %s: write state: %w", room.ID(), id, err)
				}
			}
		}
		after[id] = st.After
		r.replayed[id] = true
		batchIDs = append(batchIDs, id)
		batch = append(batch, st)
		if len(batchIDs) >= opts.BatchSize {
			if err := flush(); err != nil {
				return res, err
			}
		}
		res.Events++
		if opts.Progress != nil {
			opts.Progress(i+1, len(ids))
		}
	}
	if err := flush(); err != nil {
		return res, err
	}

	if res.Computed == 0 && room.Head().Replayed {
		h := room.Head()
		res.ForwardExtremities, res.CurrentState = h.ForwardExtremities, h.CurrentState
		return res, nil // nothing new: the stored head stands
	}
	var fwd []string
	var fwdRoots []hamtstore.NodeID
	for _, id := range order {
		if !r.rejected[id] && !referenced[id] {
			fwd = append(fwd, id)
		}
	}
	sort.Strings(fwd)
	for _, id := range fwd {
		root, err := afterOf(id)
		if err != nil {
			return res, fmt.Errorf("resolver: room %s: forward extremity: %w", room.ID(), err)
		}
		fwdRoots = append(fwdRoots, root)
	}
	cur, err := r.Resolve(fwdRoots)
	if err != nil {
		return res, fmt.Errorf("current state: %w", err)
	}
	h := room.Head()
	h.ForwardExtremities, h.CurrentState, h.Replayed = fwd, cur, true
	if opts.Force {
		h.StateEvery, h.StateKeptBelow = 0, 0 // every state record was written again
	}
	if err := room.SetHead(h); err != nil {
		return res, err
	}
	if err := room.Sync(); err != nil {
		return res, err
	}
	res.Resolutions, res.ConflictedKeys = r.Resolutions, r.ConflictedKeys
	res.AuthDifference, res.FullConflicted = r.AuthDifference, r.FullConflicted
	res.ForwardExtremities, res.CurrentState = fwd, cur
	return res, nil
}

// readerResetEvery bounds the HAMT nodes a replay keeps decoded: the reader is reset
// every so many events (the nodes a later event needs are read again from the store).
const readerResetEvery = 4096

// keepStored uses an event's stored state record when it has one and none of its
// prev_events was computed in this run; it records what Replay tracks per event.
func keepStored(r *Resolver, m roomstate.EventMeta, after map[string]hamtstore.NodeID,
	computed, referenced map[string]bool) (bool, error) {
	for _, p := range m.PrevEvents {
		if computed[p] {
			return false, nil
		}
	}
	st, ok, err := r.room.EventState(m.EventID)
	if err != nil || !ok {
		return false, err
	}
	after[m.EventID] = st.After
	r.rejected[m.EventID] = st.Rejected
	if !st.Rejected {
		for _, p := range m.PrevEvents {
			referenced[p] = true
		}
	}
	return true, nil
}

// keepDropped takes as replayed an event whose state record the room's keep rule let
// an every-k repack drop, unless one of its prev_events was computed in this run (then
// it is computed and its record written again). Such an event was accepted (the
// repack keeps rejected events' records), so it references its prev_events.
func keepDropped(r *Resolver, m roomstate.EventMeta, computed, referenced map[string]bool) (bool, error) {
	for _, p := range m.PrevEvents {
		if computed[p] {
			return false, nil
		}
	}
	r.rejected[m.EventID] = false
	for _, p := range m.PrevEvents {
		referenced[p] = true
	}
	return true, nil
}

// rederive returns the state after an event: from after, or, for an event whose
// state record was dropped, recomputed as the resolution of the states after its
// prev_events (a dropped event is an accepted non-state event, so its state after
// is its state before), walking up through dropped ancestors to stored states. The
// states recomputed are cached in after; nothing is written.
func rederive(r *Resolver, id string, after map[string]hamtstore.NodeID, dropped map[string]bool, res *ReplayResult) (hamtstore.NodeID, error) {
	if root, ok := after[id]; ok {
		return root, nil
	}
	stack := []string{id}
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		if _, ok := after[x]; ok {
			stack = stack[:len(stack)-1]
			continue
		}
		if !dropped[x] {
			return hamtstore.NodeID{}, fmt.Errorf("prev_event %s not replayed before it", x)
		}
		m, err := r.meta(x)
		if err != nil {
			return hamtstore.NodeID{}, err
		}
		roots := make([]hamtstore.NodeID, 0, len(m.PrevEvents))
		pending := false
		for _, p := range m.PrevEvents {
			if root, ok := after[p]; ok {
				roots = append(roots, root)
			} else {
				stack = append(stack, p)
				pending = true
			}
		}
		if pending {
			continue
		}
		root, err := r.Resolve(roots)
		if err != nil {
			return hamtstore.NodeID{}, fmt.Errorf("event %s (state not kept): %w", x, err)
		}
		after[x] = root
		res.Rederived++
		stack = stack[:len(stack)-1]
	}
	return after[id], nil
}

// replayOrder returns the events whose prev and auth events are all present,
// parents before children, ties broken by arrival (Kahn's algorithm over
// prev_events and auth_events).
func (r *Resolver) replayOrder(ids []string) ([]string, error) {
	present := make(map[string]bool, len(ids))
	for _, id := range ids {
		present[id] = true
	}
	pending := make(map[string]int, len(ids))
	children := make(map[string][]string, len(ids))
	seq := make(map[string]uint32, len(ids))
	var missing []string
	for _, id := range ids {
		m, err := r.meta(id)
		if err != nil {
			return nil, err
		}
		seq[id] = m.Seq
		parents := map[string]bool{}
		for _, p := range append(append([]string(nil), m.PrevEvents...), m.AuthEvents...) {
			if !present[p] {
				missing = append(missing, id)
				break
			}
			parents[p] = true
		}
		for p := range parents {
			pending[id]++
			children[p] = append(children[p], id)
		}
	}
	outlier := map[string]bool{}
	for _, id := range missing { // an outlier's descendants are outliers too
		stack := []string{id}
		for len(stack) > 0 {
			x := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if !outlier[x] {
				outlier[x] = true
				stack = append(stack, children[x]...)
			}
		}
	}
	ready := &seqHeap{seq: seq}
	for _, id := range ids {
		if pending[id] == 0 && !outlier[id] {
			heap.Push(ready, id)
		}
	}
	order := make([]string, 0, len(ids)-len(outlier))
	for ready.Len() > 0 {
		id := heap.Pop(ready).(string)
		order = append(order, id)
		for _, c := range children[id] {
			if pending[c]--; pending[c] == 0 && !outlier[c] {
				heap.Push(ready, c)
			}
		}
	}
	if len(order)+len(outlier) != len(ids) {
		return nil, fmt.Errorf("resolver: room %s: prev/auth events form a cycle among %d events",
			r.room.ID(), len(ids)-len(order)-len(outlier))
	}
	return order, nil
}

// seqHeap pops the event that arrived first.
type seqHeap struct {
	ids []string
	seq map[string]uint32
}

func (h *seqHeap) Len() int           { return len(h.ids) }
func (h *seqHeap) Less(i, j int) bool { return h.seq[h.ids[i]] < h.seq[h.ids[j]] }
func (h *seqHeap) Swap(i, j int)      { h.ids[i], h.ids[j] = h.ids[j], h.ids[i] }
func (h *seqHeap) Push(x any)         { h.ids = append(h.ids, x.(string)) }
func (h *seqHeap) Pop() any {
	x := h.ids[len(h.ids)-1]
	h.ids = h.ids[:len(h.ids)-1]
	return x
}
