package roomrules

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/mtxdb/mtxdb/authrules"
	"github.com/mtxdb/mtxdb/resolver"
)

// ErrPanic is returned when the rules or the resolution panicked on their input; the
// error names the event or the room version.
var ErrPanic = errors.New("roomrules: panic on input")

// ErrNotState is returned by Resolve when a state holds an event without a state key.
var ErrNotState = errors.New("roomrules: not a state event")

// ErrNoEvent is returned when an event the resolution reads is not available from
// the Source.
var ErrNoEvent = errors.New("roomrules: event not available")

// Source gives Resolve and AuthorizeReceived the events they read beyond the ones
// passed in: auth chains, and in room version 12 the create event.
type Source struct {
	// Load returns the events of ids that the server has, in any order; events
	// it does not have are left out (not an error).
	Load func(ids []string) ([]gomatrixserverlib.PDU, error)
	// Rejected reports whether the server rejected an event when it received it.
	Rejected func(id string) bool
	// UserIDForSender maps a sender to its user ID; used only for room versions
	// outside 1-12 (package doc). Nil: the sender is the user ID.
	UserIDForSender spec.UserIDForSender
}

// Resolve resolves states (each a list of state events, at most one per (type,
// state_key); the last counts) by the algorithm of the room version (spec, Room
// Versions "State resolution": v1 for version 1, v2 for 2-11, v2.1 for 12) and
// returns the resolved state's events, sorted by event ID. Keys absent from some
// states are conflicted, as the spec's conflicted state set has them. No state, or
// states all equal, return without resolution. Errors: ErrNotState, ErrNoEvent
// (wrapped by the resolver's ErrResolution where the algorithm needed it), the
// resolver's errors, ErrPanic, and Source.Load's.
func Resolve(version gomatrixserverlib.RoomVersion, states [][]gomatrixserverlib.PDU, src Source) (out []gomatrixserverlib.PDU, err error) {
	defer func() {
		if rec := recover(); rec != nil {
			out, err = nil, fmt.Errorf("%w: state resolution of room version %s: %v", ErrPanic, version, rec)
		}
	}()
	es := newEventSource(src)
	maps := make([]resolver.StateMap, len(states))
	for i, st := range states {
		m := make(resolver.StateMap, len(st))
		for _, p := range st {
			if p.StateKey() == nil {
				return nil, fmt.Errorf("%w: event %s (%s) in state %d", ErrNotState, p.EventID(), p.Type(), i)
			}
			m[resolver.Key{Type: p.Type(), StateKey: *p.StateKey()}] = p.EventID()
			es.add(p)
		}
		maps[i] = m
	}
	if len(maps) == 0 {
		return nil, nil
	}
	if allEqual(maps) {
		return es.list(maps[0])
	}
	if err := es.loadAuthChains(); err != nil {
		return nil, err
	}
	if authrules.Rules(string(version)) == nil {
		return resolveOther(version, maps, es, src)
	}
	res, err := resolver.ResolveMaps(version, maps, es)
	if err != nil {
		return nil, err
	}
	return es.list(res)
}

// allEqual reports whether every map equals the first.
func allEqual(maps []resolver.StateMap) bool {
	for _, m := range maps[1:] {
		if len(m) != len(maps[0]) {
			return false
		}
		for k, v := range m {
			if maps[0][k] != v {
				return false
			}
		}
	}
	return true
}

// resolveOther resolves states of a room version mtxdb's rules do not cover with
// gomatrixserverlib's state resolution v2, split as the spec splits (package doc).
func resolveOther(version gomatrixserverlib.RoomVersion, maps []resolver.StateMap, es *eventSource, src Source) ([]gomatrixserverlib.PDU, error) {
	verImpl, err := gomatrixserverlib.GetRoomVersion(version)
	if err != nil {
		return nil, err
	}
	if verImpl.StateResAlgorithm() != gomatrixserverlib.StateResV2 {
		return nil, fmt.Errorf("roomrules: room version %s: state resolution algorithm %v is not supported", version, verImpl.StateResAlgorithm())
	}
	unconflicted, conflicted := resolver.StateMap{}, map[string]bool{}
	for k, v := range maps[0] {
		unconflicted[k] = v
	}
	for _, m := range maps {
		for k, v := range m {
			if w, ok := unconflicted[k]; ok && w != v {
				delete(unconflicted, k)
			}
		}
	}
	for k := range unconflicted {
		for _, m := range maps {
			if _, ok := m[k]; !ok {
				delete(unconflicted, k)
				break
			}
		}
	}
	for _, m := range maps {
		for k, v := range m {
			if _, ok := unconflicted[k]; !ok {
				conflicted[v] = true
			}
		}
	}
	pdus := func(ids []string) ([]gomatrixserverlib.PDU, error) {
		out := make([]gomatrixserverlib.PDU, 0, len(ids))
		for _, id := range ids {
			p, err := es.Event(id)
			if err != nil {
				return nil, err
			}
			out = append(out, p)
		}
		return out, nil
	}
	c, err := pdus(sortedKeys(conflicted))
	if err != nil {
		return nil, err
	}
	u, err := es.list(unconflicted)
	if err != nil {
		return nil, err
	}
	auth, err := pdus(sortedKeys(es.chain))
	if err != nil {
		return nil, err
	}
	return gomatrixserverlib.ResolveStateConflictsV2(c, u, auth, userIDForSender(src), es.Rejected), nil
}

// eventSource is the resolver.EventSource over a Source: the events passed in,
// then Load.
type eventSource struct {
	src    Source
	events map[string]gomatrixserverlib.PDU
	chain  map[string]bool // the auth chain events loadAuthChains found
}

var _ resolver.EventSource = (*eventSource)(nil)

func newEventSource(src Source) *eventSource {
	return &eventSource{src: src, events: map[string]gomatrixserverlib.PDU{}, chain: map[string]bool{}}
}

func (s *eventSource) add(p gomatrixserverlib.PDU) { s.events[p.EventID()] = p }

// Event returns the event, from what was passed in or loaded, else from Load.
func (s *eventSource) Event(id string) (gomatrixserverlib.PDU, error) {
	if p, ok := s.events[id]; ok {
		return p, nil
	}
	if s.src.Load != nil {
		got, err := s.src.Load([]string{id})
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrNoEvent, id, err)
		}
		for _, p := range got {
			s.add(p)
		}
		if p, ok := s.events[id]; ok {
			return p, nil
		}
	}
	return nil, fmt.Errorf("%w: %s", ErrNoEvent, id)
}

// Rejected reports the Source's rejection of an event (none without Rejected).
func (s *eventSource) Rejected(id string) bool {
	return s.src.Rejected != nil && s.src.Rejected(id)
}

// loadAuthChains loads the auth chains of the events passed in, one Load per
// level of the walk, so that the resolution reads them from memory. Events the
// Source does not have are left out: the resolution fails on one only if it
// needs it.
func (s *eventSource) loadAuthChains() error {
	var next []string
	queue := func(p gomatrixserverlib.PDU) {
		for _, a := range p.AuthEventIDs() {
			if !s.chain[a] {
				s.chain[a] = true
				next = append(next, a)
			}
		}
	}
	for _, p := range s.events {
		queue(p)
	}
	for len(next) > 0 {
		var missing []string
		for _, id := range next {
			if _, ok := s.events[id]; !ok {
				missing = append(missing, id)
			}
		}
		level := next
		next = nil
		if len(missing) > 0 && s.src.Load != nil {
			got, err := s.src.Load(missing)
			if err != nil {
				return fmt.Errorf("roomrules: loading auth events: %w", err)
			}
			for _, p := range got {
				s.add(p)
			}
		}
		for _, id := range level {
			if p, ok := s.events[id]; ok {
				queue(p)
			} else {
				delete(s.chain, id)
			}
		}
	}
	return nil
}

// list returns the events of a state map, sorted by event ID.
func (s *eventSource) list(m resolver.StateMap) ([]gomatrixserverlib.PDU, error) {
	ids := make(map[string]bool, len(m))
	for _, id := range m {
		ids[id] = true
	}
	out := make([]gomatrixserverlib.PDU, 0, len(ids))
	for _, id := range sortedKeys(ids) {
		p, err := s.Event(id)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

func sortedKeys(set map[string]bool) []string { return slices.Sorted(maps.Keys(set)) }

// userIDForSender is the Source's mapping, else the sender as the user ID.
func userIDForSender(src Source) spec.UserIDForSender {
	if src.UserIDForSender != nil {
		return src.UserIDForSender
	}
	return senderIsUserID
}

func senderIsUserID(_ spec.RoomID, senderID spec.SenderID) (*spec.UserID, error) {
	return spec.NewUserID(string(senderID), true)
}

// WithEvents returns the Source with events put before Load: ids among them are
// answered from them, the others from Load. For callers that hold auth events
// the server may not have stored yet (a remote server's answer).
func (src Source) WithEvents(events []gomatrixserverlib.PDU) Source {
	byID := make(map[string]gomatrixserverlib.PDU, len(events))
	for _, p := range events {
		byID[p.EventID()] = p
	}
	load := src.Load
	src.Load = func(ids []string) ([]gomatrixserverlib.PDU, error) {
		var out []gomatrixserverlib.PDU
		var rest []string
		for _, id := range ids {
			if p, ok := byID[id]; ok {
				out = append(out, p)
			} else {
				rest = append(rest, id)
			}
		}
		if len(rest) == 0 || load == nil {
			return out, nil
		}
		got, err := load(rest)
		return append(out, got...), err
	}
	return src
}
