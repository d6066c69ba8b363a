// Package smallroom makes random small Matrix rooms (2-60 events, 1-5 servers, room
// versions 1-12) for differential tests of state resolution: forks and merges,
// concurrent power levels changes, bans, kicks, join rule changes, membership
// changes, topics and names, events that are meant to be rejected, and odd auth
// events and timestamps. Each server builds its events from its own naive view of
// the state; what the room's state really is, the implementations under test say.
//
// A Room is a DAG of events named by index. It renders two ways: Hashed (real
// PDUs of the room version: content hashes, reference-hash event IDs from v3,
// depth; unsigned) and Fixture (the same DAG with made-up short IDs such as "$e7",
// as test vectors write them, no depth, no hashes). ParseFixture reads a Fixture
// rendering back, so a kept room is its fixture JSON lines. Drop and Splice remove
// an event, for minimising a room that shows a difference.
//
// Nothing here is safe for concurrent use on one Room; distinct Rooms are
// independent (the package keeps no state).
package smallroom

import (
	"encoding/json"
	"fmt"
	"slices"
)

// Event is one event of a Room, in the terms both renderings share.
type Event struct {
	// Name is the fixture ID without its "$" ("e7"): given at generation, kept by
	// Drop and Splice, so a minimised room names its events as the original did.
	Name     string
	Sender   string // a user ID; its server is the event's origin
	Type     string
	StateKey *string
	Content  json.RawMessage
	TS       int64 // origin_server_ts
	// Prev and Auth are the indexes of the events named in prev_events and (as
	// cited: in room version 12 without the create event the room ID implies)
	// auth_events. Both name earlier events only.
	Prev []int
	Auth []int
	// Note says what the generator meant ("bad: sender lacks power", "auth: older
	// power levels"); the fixture rendering carries it in unsigned.
	Note string
}

// IsState reports whether the event has a state key.
func (e *Event) IsState() bool { return e.StateKey != nil }

// Room is a room's events in a topological order: every event's Prev and Auth name
// earlier events, and Events[0] is the m.room.create.
type Room struct {
	Seed    int64  // the seed Generate was given (0 for a parsed room)
	Version string // room version, "1".."12"
	Events  []Event
}

// Children returns, per event, the indexes of the events naming it in prev_events.
func (r *Room) Children() [][]int {
	kids := make([][]int, len(r.Events))
	for i, e := range r.Events {
		for _, p := range e.Prev {
			kids[p] = append(kids[p], i)
		}
	}
	return kids
}

// Merges counts the events with two or more prev_events.
func (r *Room) Merges() int {
	n := 0
	for _, e := range r.Events {
		if len(e.Prev) >= 2 {
			n++
		}
	}
	return n
}

// Drop returns the room without event i and every event that names it, directly or
// through others, in prev_events or auth_events. Dropping the create event leaves
// an empty room.
func (r *Room) Drop(i int) *Room {
	gone := make([]bool, len(r.Events))
	gone[i] = true
	for j := i + 1; j < len(r.Events); j++ {
		e := &r.Events[j]
		gone[j] = slices.ContainsFunc(e.Prev, func(p int) bool { return gone[p] }) ||
			slices.ContainsFunc(e.Auth, func(a int) bool { return gone[a] })
	}
	return r.keep(gone, nil)
}

// Splice returns the room without event i: an event naming it in prev_events names
// i's prev_events instead, and one naming it in auth_events loses that entry (so
// it may then be rejected where it was not, which is what minimising wants to
// find out). Splicing the create event leaves an empty room.
func (r *Room) Splice(i int) *Room {
	if i == 0 {
		return &Room{Seed: r.Seed, Version: r.Version}
	}
	gone := make([]bool, len(r.Events))
	gone[i] = true
	return r.keep(gone, r.Events[i].Prev)
}

// keep returns the room of the events not gone, renumbered: a gone prev event
// is replaced by the events of instead (for Splice, the removed event's prev
// events), a gone auth event is left out.
func (r *Room) keep(gone []bool, instead []int) *Room {
	out := &Room{Seed: r.Seed, Version: r.Version}
	if gone[0] {
		return out
	}
	index := make([]int, len(r.Events))
	for j, e := range r.Events {
		if gone[j] {
			index[j] = -1
			continue
		}
		index[j] = len(out.Events)
		ne := e
		ne.Prev, ne.Auth = nil, nil
		for _, p := range e.Prev {
			if gone[p] {
				for _, q := range instead {
					ne.Prev = appendNew(ne.Prev, index[q])
				}
				continue
			}
			ne.Prev = appendNew(ne.Prev, index[p])
		}
		for _, a := range e.Auth {
			if !gone[a] {
				ne.Auth = append(ne.Auth, index[a])
			}
		}
		out.Events = append(out.Events, ne)
	}
	return out
}

func appendNew(s []int, x int) []int {
	if slices.Contains(s, x) {
		return s
	}
	return append(s, x)
}

// validate checks the room's shape: a create event first, edges pointing back.
func (r *Room) validate() error {
	if len(r.Events) == 0 {
		return fmt.Errorf("smallroom: room has no events")
	}
	if c := r.Events[0]; c.Type != "m.room.create" || c.StateKey == nil || *c.StateKey != "" {
		return fmt.Errorf("smallroom: first event %s is %s, not the m.room.create", c.Name, c.Type)
	}
	names := map[string]bool{}
	for i, e := range r.Events {
		if names[e.Name] {
			return fmt.Errorf("smallroom: two events named %s", e.Name)
		}
		names[e.Name] = true
		for _, x := range slices.Concat(e.Prev, e.Auth) {
			if x < 0 || x >= i {
				return fmt.Errorf("smallroom: event %s (index %d) names index %d", e.Name, i, x)
			}
		}
		if i > 0 && len(e.Prev) == 0 {
			return fmt.Errorf("smallroom: event %s has no prev_events", e.Name)
		}
	}
	return nil
}
