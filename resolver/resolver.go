// Package resolver computes room state from stored snapshots: the state before an
// event is the resolution of the states after its prev_events (spec, "Room Versions",
// state resolution of each version), and each event is authorised against it.
//
// This is the walking-skeleton resolver. The conflicted keys come from the HAMT N-way
// diff of the snapshots (so only conflicted events are loaded to find them), the split
// follows the spec of the room version (v1: a key is conflicted when the states give it
// two or more different events; v2 and v2.1: when it is not the same in every state,
// which includes being absent from some), and the ordering and authorisation steps are
// gomatrixserverlib's (ResolveStateConflicts for v1, ResolveStateConflictsV2 for v2,
// ResolveConflictsNew for v2.1). Its known departures from the spec are listed in
// ../notes and are the subject of a later issue; the real rooms in testrooms/ replay
// without a mismatch.
package resolver

import (
	"errors"
	"fmt"
	"sort"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomstate"
)

// ErrResolution is returned (wrapped, naming the room and events) when state
// resolution cannot run: a snapshot names an event that cannot be loaded, or
// gomatrixserverlib panicked or returned nothing.
var ErrResolution = errors.New("resolver: state resolution failed")

// Resolver resolves and authorises events of one room. It caches parsed PDUs and
// metadata for its lifetime. Not safe for concurrent use.
type Resolver struct {
	room     *roomstate.Room
	rd       *hamtstore.Reader
	algo     gomatrixserverlib.StateResAlgorithm
	pdus     map[string]gomatrixserverlib.PDU
	metas    map[string]roomstate.EventMeta
	rejected map[string]bool

	// Resolutions counts calls that had two or more distinct snapshots to resolve.
	Resolutions int
	// ConflictedKeys counts conflicted keys seen over all resolutions.
	ConflictedKeys int
}

// New returns a resolver for room. It fails for a room version gomatrixserverlib does
// not know.
func New(room *roomstate.Room) (*Resolver, error) {
	verImpl, err := gomatrixserverlib.GetRoomVersion(room.Version())
	if err != nil {
		return nil, fmt.Errorf("%w: room %s: %q", roomstate.ErrUnknownRoomVersion, room.ID(), room.Version())
	}
	return &Resolver{
		room:     room,
		rd:       room.NewReader(),
		algo:     verImpl.StateResAlgorithm(),
		pdus:     map[string]gomatrixserverlib.PDU{},
		metas:    map[string]roomstate.EventMeta{},
		rejected: map[string]bool{},
	}, nil
}

// Reader returns the resolver's HAMT reader (its decoded nodes are shared).
func (r *Resolver) Reader() *hamtstore.Reader { return r.rd }

func (r *Resolver) pdu(eventID string) (gomatrixserverlib.PDU, error) {
	if p, ok := r.pdus[eventID]; ok {
		return p, nil
	}
	p, err := r.room.Event(eventID)
	if err != nil {
		return nil, err
	}
	r.pdus[eventID] = p
	return p, nil
}

func (r *Resolver) meta(eventID string) (roomstate.EventMeta, error) {
	if m, ok := r.metas[eventID]; ok {
		return m, nil
	}
	m, err := r.room.Meta(eventID)
	if err != nil {
		return m, err
	}
	r.metas[eventID] = m
	return m, nil
}

func (r *Resolver) eventIDOf(v hamtstore.Value) (string, error) {
	m, err := r.room.MetaByRecord(packstore.ID(v))
	if err != nil {
		return "", err
	}
	r.metas[m.EventID] = m
	return m.EventID, nil
}

// isRejected reports whether a replayed event was rejected.
func (r *Resolver) isRejected(eventID string) bool { return r.rejected[eventID] }

// authChain returns the auth chain of the given events (their auth_events,
// transitively), read from metadata records, not PDUs.
func (r *Resolver) authChain(eventIDs []string) ([]string, error) {
	seen := map[string]bool{}
	stack := append([]string(nil), eventIDs...)
	var out []string
	for len(stack) > 0 {
		id := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		m, err := r.meta(id)
		if err != nil {
			return nil, err
		}
		for _, a := range m.AuthEvents {
			if !seen[a] {
				seen[a] = true
				out = append(out, a)
				stack = append(stack, a)
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// authTypes are the state types the authorization rules read.
var authTypes = map[string]bool{
	spec.MRoomCreate:           true,
	spec.MRoomPowerLevels:      true,
	spec.MRoomJoinRules:        true,
	spec.MRoomMember:           true,
	spec.MRoomThirdPartyInvite: true,
}

// Resolve returns the snapshot that resolves the given snapshots for this room's
// version; equal inputs short-circuit without reading anything. The result is
// written to the room's node store.
func (r *Resolver) Resolve(roots []hamtstore.NodeID) (hamtstore.NodeID, error) {
	uniq := uniqueRoots(roots)
	switch len(uniq) {
	case 0:
		return hamtstore.EmptyRoot, nil
	case 1:
		return uniq[0], nil
	}
	r.Resolutions++

	// Conflicted keys and, per key, the distinct events the states give it.
	type conflict struct {
		key    []byte
		events []string // distinct, sorted
		absent bool     // some state lacks the key
	}
	var conflicts []conflict
	err := r.rd.DiffN(uniq, func(key []byte, vals []*hamtstore.Value) error {
		c := conflict{key: append([]byte(nil), key...)}
		seen := map[hamtstore.Value]bool{}
		for _, v := range vals {
			if v == nil {
				c.absent = true
				continue
			}
			if !seen[*v] {
				seen[*v] = true
				id, err := r.eventIDOf(*v)
				if err != nil {
					return err
				}
				c.events = append(c.events, id)
			}
		}
		sort.Strings(c.events)
		conflicts = append(conflicts, c)
		return nil
	})
	if err != nil {
		return hamtstore.NodeID{}, fmt.Errorf("%w: room %s: diff of %d states: %v", ErrResolution, r.room.ID(), len(uniq), err)
	}
	r.ConflictedKeys += len(conflicts)

	conflictedKey := map[string]bool{}
	var changes []hamtstore.Change
	var conflicted []gomatrixserverlib.PDU
	for _, c := range conflicts {
		if r.algo == gomatrixserverlib.StateResV1 && len(c.events) == 1 {
			// v1: a key given one event by every state that has it is unconflicted,
			// and the union keeps it.
			changes = append(changes, hamtstore.Change{Key: c.key, Value: hamtstore.Value(roomstate.EventRecordID(c.events[0]))})
			continue
		}
		conflictedKey[string(c.key)] = true
		for _, id := range c.events {
			p, err := r.pdu(id)
			if err != nil {
				return hamtstore.NodeID{}, fmt.Errorf("%w: room %s: %v", ErrResolution, r.room.ID(), err)
			}
			conflicted = append(conflicted, p)
		}
	}

	if len(conflictedKey) > 0 {
		resolved, err := r.resolveConflicted(uniq, conflicted, conflictedKey)
		if err != nil {
			return hamtstore.NodeID{}, err
		}
		for _, c := range conflicts {
			if !conflictedKey[string(c.key)] {
				continue
			}
			if id, ok := resolved[string(c.key)]; ok {
				changes = append(changes, hamtstore.Change{Key: c.key, Value: hamtstore.Value(roomstate.EventRecordID(id))})
			} else {
				changes = append(changes, hamtstore.Change{Key: c.key, Delete: true})
			}
		}
	}
	// Start from any input state: its unconflicted entries are those of every state.
	root, err := hamtstore.Apply(r.room.Nodes(), r.rd, uniq[0], changes)
	if err != nil {
		return hamtstore.NodeID{}, fmt.Errorf("resolver: room %s: write resolved state: %w", r.room.ID(), err)
	}
	return root, nil
}

// resolveConflicted runs gomatrixserverlib's algorithm for the room version over the
// conflicted events and returns the chosen event per conflicted key.
func (r *Resolver) resolveConflicted(roots []hamtstore.NodeID, conflicted []gomatrixserverlib.PDU,
	conflictedKey map[string]bool) (out map[string]string, err error) {

	// The unconflicted entries the authorization rules can read, from one state.
	var unconflicted []gomatrixserverlib.PDU
	var fullStates [][]gomatrixserverlib.PDU
	if r.algo == gomatrixserverlib.StateResV2_1 {
		for _, root := range roots {
			st, err := r.statePDUs(root, nil, false)
			if err != nil {
				return nil, err
			}
			fullStates = append(fullStates, st)
		}
	} else if unconflicted, err = r.statePDUs(roots[0], conflictedKey, true); err != nil {
		return nil, err
	}

	ids := make([]string, len(conflicted))
	for i, p := range conflicted {
		ids[i] = p.EventID()
	}
	chainIDs, err := r.authChain(ids)
	if err != nil {
		return nil, fmt.Errorf("%w: room %s: auth chain: %v", ErrResolution, r.room.ID(), err)
	}
	chain := make([]gomatrixserverlib.PDU, 0, len(chainIDs))
	for _, id := range chainIDs {
		p, err := r.pdu(id)
		if err != nil {
			return nil, fmt.Errorf("%w: room %s: auth chain: %v", ErrResolution, r.room.ID(), err)
		}
		chain = append(chain, p)
	}

	defer func() {
		if rec := recover(); rec != nil {
			out, err = nil, fmt.Errorf("%w: room %s: gomatrixserverlib panicked resolving %d conflicted events: %v",
				ErrResolution, r.room.ID(), len(conflicted), rec)
		}
	}()
	var result []gomatrixserverlib.PDU
	switch r.algo {
	case gomatrixserverlib.StateResV1:
		result = gomatrixserverlib.ResolveStateConflicts(conflicted, append(chain, unconflicted...), roomstate.UserIDForSender)
	case gomatrixserverlib.StateResV2:
		result = gomatrixserverlib.ResolveStateConflictsV2(conflicted, unconflicted, chain, roomstate.UserIDForSender, r.isRejected)
		if result == nil {
			return nil, fmt.Errorf("%w: room %s: no m.room.create among %d auth events", ErrResolution, r.room.ID(), len(chain))
		}
	case gomatrixserverlib.StateResV2_1:
		result, err = gomatrixserverlib.ResolveConflictsNew(r.room.Version(), fullStates, chain, roomstate.UserIDForSender, r.isRejected)
		if err != nil {
			return nil, fmt.Errorf("%w: room %s: %v", ErrResolution, r.room.ID(), err)
		}
	default:
		return nil, fmt.Errorf("%w: room %s: unsupported algorithm %v", ErrResolution, r.room.ID(), r.algo)
	}
	out = map[string]string{}
	for _, p := range result {
		if p.StateKey() == nil {
			continue
		}
		k := string(roomstate.StateKey(p.Type(), *p.StateKey()))
		if conflictedKey[k] {
			out[k] = p.EventID()
		}
	}
	return out, nil
}

// statePDUs loads the events of a snapshot, leaving out the keys in skip and, when
// authOnly is set, every type the authorization rules never read.
func (r *Resolver) statePDUs(root hamtstore.NodeID, skip map[string]bool, authOnly bool) ([]gomatrixserverlib.PDU, error) {
	var ids []string
	err := r.rd.Iterate(root, func(k []byte, v hamtstore.Value) error {
		if skip[string(k)] {
			return nil
		}
		if authOnly {
			t, _, err := roomstate.SplitStateKey(k)
			if err != nil {
				return err
			}
			if !authTypes[t] {
				return nil
			}
		}
		id, err := r.eventIDOf(v)
		if err != nil {
			return err
		}
		ids = append(ids, id)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: room %s: read state: %v", ErrResolution, r.room.ID(), err)
	}
	out := make([]gomatrixserverlib.PDU, 0, len(ids))
	for _, id := range ids {
		p, err := r.pdu(id)
		if err != nil {
			return nil, fmt.Errorf("%w: room %s: %v", ErrResolution, r.room.ID(), err)
		}
		out = append(out, p)
	}
	return out, nil
}

func uniqueRoots(roots []hamtstore.NodeID) []hamtstore.NodeID {
	var out []hamtstore.NodeID
	seen := map[hamtstore.NodeID]bool{}
	for _, x := range roots {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
