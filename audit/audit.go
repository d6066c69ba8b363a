// Package audit says what a difference between the state a homeserver recorded
// for a room and the state the spec gives for the same events means: the state
// the spec gives is mtxdb's replay (package resolver: state resolution and the
// authorization rules of the room's version), the recorded one is what the
// server's database holds (package recorded); each difference recorded.Compare
// reports is classified as a Kind.
//
// The kinds follow what admins ask after a state reset (the spec's room version
// 12 notes, https://spec.matrix.org/v1.16/rooms/v12/, and MSC4297,
// https://github.com/matrix-org/matrix-spec-proposals/pull/4297): an entry the
// server lost or reverted (a ban undone, power levels or join rules reverted to
// an earlier event, a member removed), an entry the server has that the spec does
// not, and an event the server accepted that the authorization rules reject, or
// the reverse.
package audit

import (
	"fmt"
	"strings"

	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/roomrecord"
	"github.com/mtxdb/mtxdb/roomstate"
)

// Kind is what one difference means. Ours is the spec's entry for the key, the
// recorded one the server's.
type Kind string

// The kinds, tried in this order: the first that holds is the finding's.
const (
	// AcceptedRejected: the server's entry is an event the authorization rules
	// reject (the spec's replay rejected it).
	AcceptedRejected Kind = "accepted_rejected"
	// RejectedAccepted: the spec's entry is an event the server did not apply
	// to its own state after it (the server rejected or soft-failed an event the
	// rules accept), at that event and at every later difference it causes.
	RejectedAccepted Kind = "rejected_accepted"
	// BanUndone: the spec has the member banned, the server does not.
	BanUndone Kind = "ban_undone"
	// MemberRemoved: the spec has a membership for the user, the server none.
	MemberRemoved Kind = "member_removed"
	// PowerLevelsReverted, JoinRulesReverted: the server's m.room.power_levels
	// or m.room.join_rules is an event that arrived before the spec's.
	PowerLevelsReverted Kind = "power_levels_reverted"
	JoinRulesReverted   Kind = "join_rules_reverted"
	// Reverted: as above for any other key.
	Reverted Kind = "reverted"
	// Lost: the spec has an entry for the key, the server none.
	Lost Kind = "lost"
	// Extra: the server has an entry for the key, the spec none.
	Extra Kind = "extra"
	// Differs: both have an entry; the server's arrived after the spec's.
	Differs Kind = "differs"
)

// Kinds lists every Kind in classification order.
var Kinds = []Kind{AcceptedRejected, RejectedAccepted, BanUndone, MemberRemoved, PowerLevelsReverted,
	JoinRulesReverted, Reverted, Lost, Extra, Differs}

// Finding is one classified difference.
type Finding struct {
	recorded.Mismatch
	Kind Kind
}

// String gives the finding on one line: "finding room=R event=E key=K kind=KIND
// ours=ID recorded=ID", "(none)" for a side without an entry.
func (f Finding) String() string {
	return fmt.Sprintf("finding room=%s event=%s key=%s kind=%s ours=%s recorded=%s",
		f.Room, f.Event, f.Key, f.Kind, orNone(f.Ours), orNone(f.Recorded))
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// Events is what Classify reads of the room's replayed events; RoomEvents
// gives it for a roomstate.Room.
type Events interface {
	Meta(eventID string) (roomrecord.EventMeta, error)
	EventState(eventID string) (roomrecord.EventState, bool, error)
	// Membership is a member event's content.membership.
	Membership(eventID string) (string, error)
}

// RoomEvents is Events over a replayed room of the store.
type RoomEvents struct{ *roomstate.Room }

// Membership reads the event's PDU and returns its content.membership.
func (r RoomEvents) Membership(eventID string) (string, error) {
	ev, err := r.Event(eventID)
	if err != nil {
		return "", err
	}
	return ev.Membership()
}

// Classifier classifies the differences of one room, given in the order
// recorded.Compare reports them (the recorded events' order, then the current
// state). Not safe for concurrent use.
type Classifier struct {
	ev Events
	// serverRejected: events the server did not apply to its state after them.
	serverRejected map[string]bool
}

// NewClassifier returns a Classifier over a room's replayed events.
func NewClassifier(ev Events) *Classifier {
	return &Classifier{ev: ev, serverRejected: map[string]bool{}}
}

// Classify returns the finding of one difference. Errors: an event of the
// difference that the store lacks or cannot read, named.
func (c *Classifier) Classify(m recorded.Mismatch) (Finding, error) {
	f := Finding{Mismatch: m}
	var err error
	f.Kind, err = c.kind(m)
	if err != nil {
		return f, fmt.Errorf("audit: room %s, event %s, key %s: %w", m.Room, m.Event, m.Key, err)
	}
	return f, nil
}

func (c *Classifier) kind(m recorded.Mismatch) (Kind, error) {
	if m.Recorded != "" {
		st, ok, err := c.ev.EventState(m.Recorded)
		if err != nil {
			return "", fmt.Errorf("recorded event %s: %w", m.Recorded, err)
		}
		if ok && st.Rejected {
			return AcceptedRejected, nil
		}
	}
	if m.Ours != "" && (m.Ours == m.Event || c.serverRejected[m.Ours]) {
		c.serverRejected[m.Ours] = true
		return RejectedAccepted, nil
	}
	evType, _, _ := strings.Cut(m.Key, "|")
	if evType == spec.MRoomMember && m.Ours != "" {
		ours, err := c.membership(m.Ours)
		if err != nil {
			return "", err
		}
		rec := ""
		if m.Recorded != "" {
			if rec, err = c.membership(m.Recorded); err != nil {
				return "", err
			}
		}
		switch {
		case ours == spec.Ban && rec != spec.Ban:
			return BanUndone, nil
		case m.Recorded == "":
			return MemberRemoved, nil
		}
	}
	switch {
	case m.Recorded == "":
		return Lost, nil
	case m.Ours == "":
		return Extra, nil
	}
	ours, err := c.ev.Meta(m.Ours)
	if err != nil {
		return "", fmt.Errorf("event %s: %w", m.Ours, err)
	}
	rec, err := c.ev.Meta(m.Recorded)
	if err != nil {
		return "", fmt.Errorf("recorded event %s: %w", m.Recorded, err)
	}
	if rec.Seq > ours.Seq {
		return Differs, nil
	}
	switch evType {
	case spec.MRoomPowerLevels:
		return PowerLevelsReverted, nil
	case spec.MRoomJoinRules:
		return JoinRulesReverted, nil
	}
	return Reverted, nil
}

// membership is the content.membership of a member event.
func (c *Classifier) membership(eventID string) (string, error) {
	m, err := c.ev.Membership(eventID)
	if err != nil {
		return "", fmt.Errorf("event %s: membership: %w", eventID, err)
	}
	return m, nil
}
