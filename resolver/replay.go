package resolver

import (
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
	if err := gomatrixserverlib.Allowed(pdu, ae, roomstate.UserIDForSender); err != nil {
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
	if err := gomatrixserverlib.Allowed(pdu, se, roomstate.UserIDForSender); err != nil {
		return fmt.Errorf("%w: event %s: against the state before it: %v", ErrRejected, pdu.EventID(), err)
	}
	return nil
}

// ReplayOptions tune Replay.
type ReplayOptions struct {
	// Force recomputes every event; by default an event whose state record exists
	// and whose prev_events were not recomputed keeps its stored state.
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
	Events             int // events walked
	Computed           int // events whose state was computed and written this run
	Rejected           int
	Resolutions        int // state resolutions with two or more distinct input states
	ConflictedKeys     int
	AuthDifference     int // events in auth differences, summed over resolutions
	FullConflicted     int // events in full conflicted sets, summed over resolutions
	ForwardExtremities []string
	CurrentState       hamtstore.NodeID
}

// Replay computes the state before and after every event of a room in arrival order
// (a topological order: import accepts an event only after its prev_events), rejects
// what fails authorization, stores a state record per event, and sets the room's
// forward extremities (the non-rejected events no non-rejected event points at) and
// current state (the resolution of the states after them).
//
// Replay is incremental: an event that already has a state record keeps it unless
// one of its prev_events was computed in this run (or opts.Force is set), so running
// it after an import computes only the new events, and running it twice writes
// nothing the second time.
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
	for i, id := range ids {
		m, err := r.meta(id)
		if err != nil {
			return res, err
		}
		if i%readerResetEvery == readerResetEvery-1 {
			r.rd.Reset() // bound the decoded nodes kept; later reads go to the store
		}
		if !opts.Force {
			kept, err := keepStored(r, m, after, computed, referenced)
			if err != nil {
				return res, err
			}
			if kept {
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
			root, ok := after[p]
			if !ok {
				return res, fmt.Errorf("resolver: room %s: event %s: prev_event %s not replayed before it", room.ID(), id, p)
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
	for _, id := range ids {
		if !r.rejected[id] && !referenced[id] {
			fwd = append(fwd, id)
		}
	}
	sort.Strings(fwd)
	for _, id := range fwd {
		fwdRoots = append(fwdRoots, after[id])
	}
	cur, err := r.Resolve(fwdRoots)
	if err != nil {
		return res, fmt.Errorf("current state: %w", err)
	}
	h := room.Head()
	h.ForwardExtremities, h.CurrentState, h.Replayed = fwd, cur, true
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
