package resolver

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// The membership an authorisation check needs of an m.room.member event, kept per
// event for the room (Resolver.memb: one byte per event, no pointers), so that a
// member event the PDU cache no longer holds is not parsed again to be an auth
// event or part of the state before an event. In a 1M-event room with 100,000
// members, authorisation asked again for 530,000 member events the 20,000-entry
// cache had let go, each read from the store and decoded from JSON (issue 14:
// "replay does not parse a PDU twice").
//
// What the authorization rules read of a member event that is not the event being
// authorised (spec, Room Versions, "Authorization rules": the sender's, the
// target's and the join_authorised_via_users_server user's current membership) is
// its key and its content's membership; gomatrixserverlib reads it through
// Membership() or NewMemberContentFromEvent. A member event whose content holds
// anything else the rules could read (third_party_invite,
// join_authorised_via_users_server, mxid_mapping), or a membership outside the
// five the spec names, is not kept: it is parsed again when asked for.
const (
	membUnknown uint8 = iota
	membJoin
	membLeave
	membInvite
	membBan
	membKnock
)

var membershipNames = [...]string{membJoin: spec.Join, membLeave: spec.Leave, membInvite: spec.Invite, membBan: spec.Ban, membKnock: spec.Knock}

// memberContents are the contents memberAuth answers, by membership code.
var memberContents = func() [][]byte {
	out := make([][]byte, len(membershipNames))
	for i, m := range membershipNames {
		if m != "" {
			out[i], _ = json.Marshal(map[string]string{"membership": m})
		}
	}
	return out
}()

// membershipCode returns the code of a parsed member event's membership, or
// membUnknown when the event is not one memberAuth can stand for.
func membershipCode(p gomatrixserverlib.PDU) uint8 {
	if p.Type() != spec.MRoomMember || p.StateKey() == nil {
		return membUnknown
	}
	// As gomatrixserverlib reads it: the whole content must parse, so that the
	// stand-in's content parses to the same membership in every reader.
	var c gomatrixserverlib.MemberContent
	if json.Unmarshal(p.Content(), &c) != nil || c.ThirdPartyInvite != nil || c.AuthorisedVia != "" || c.MXIDMapping != nil {
		return membUnknown
	}
	for code, m := range membershipNames {
		if m != "" && m == c.Membership {
			return uint8(code)
		}
	}
	return membUnknown
}

// learn keeps what authorisation needs of a parsed PDU of the room.
func (r *Resolver) learn(p gomatrixserverlib.PDU) {
	if r.memb == nil || p.Type() != spec.MRoomMember {
		return
	}
	if i, ok := r.g.index.find(r.g.ids, p.EventID()); ok && r.memb[i] == membUnknown {
		r.memb[i] = membershipCode(p)
	}
}

// authEvent returns an event of the room to use as an auth event of an event being
// authorised (Authorize): the cached PDU, else a memberAuth for a member event
// whose membership is kept, else the PDU read and parsed.
func (r *Resolver) authEvent(eventID string) (gomatrixserverlib.PDU, error) {
	if r.cur != nil && r.cur.EventID() == eventID {
		return r.cur, nil
	}
	if p, ok := r.pdus.Get(eventID); ok {
		if r.touched != nil {
			r.touched[eventID] = true
		}
		return p, nil
	}
	if r.memb != nil && r.roomID != nil {
		if i, ok := r.g.index.find(r.g.ids, eventID); ok && r.memb[i] != membUnknown {
			if k := r.g.keyOf(i); k >= 0 && r.g.keys[k].Type == spec.MRoomMember {
				if r.touched != nil {
					r.touched[eventID] = true
				}
				return &memberAuth{id: r.g.ids[i], stateKey: r.g.keys[k].StateKey, memb: r.memb[i],
					room: *r.roomID, version: gomatrixserverlib.RoomVersion(r.room.Version())}, nil
			}
		}
	}
	return r.pdu(eventID)
}

// AuthEvent implements authEventSource (authEvent).
func (r *Resolver) AuthEvent(eventID string) (gomatrixserverlib.PDU, error) {
	return r.authEvent(eventID)
}

// memberAuth is an m.room.member event as an auth event: its ID, key and
// membership (see membUnknown). It implements gomatrixserverlib.PDU for the
// authorization rules; what they never read of such an event answers empty
// (sender, timestamps, edges) or an error (JSON forms, signing).
type memberAuth struct {
	id, stateKey string
	memb         uint8
	room         spec.RoomID
	version      gomatrixserverlib.RoomVersion
}

var errMemberAuth = errors.New("resolver: a member event kept for authorisation only has no JSON form")

func (m *memberAuth) EventID() string                        { return m.id }
func (m *memberAuth) StateKey() *string                      { return &m.stateKey }
func (m *memberAuth) StateKeyEquals(s string) bool           { return m.stateKey == s }
func (m *memberAuth) Type() string                           { return spec.MRoomMember }
func (m *memberAuth) Content() []byte                        { return memberContents[m.memb] }
func (m *memberAuth) JoinRule() (string, error)              { return "", errMemberAuth }
func (m *memberAuth) Membership() (string, error)            { return membershipNames[m.memb], nil }
func (m *memberAuth) Version() gomatrixserverlib.RoomVersion { return m.version }
func (m *memberAuth) RoomID() spec.RoomID                    { return m.room }
func (m *memberAuth) Redacts() string                        { return "" }
func (m *memberAuth) Redacted() bool                         { return false }
func (m *memberAuth) PrevEventIDs() []string                 { return nil }
func (m *memberAuth) OriginServerTS() spec.Timestamp         { return 0 }
func (m *memberAuth) Redact()                                {}
func (m *memberAuth) SenderID() spec.SenderID                { return "" }
func (m *memberAuth) Unsigned() []byte                       { return nil }
func (m *memberAuth) Depth() int64                           { return 0 }
func (m *memberAuth) JSON() []byte                           { return nil }
func (m *memberAuth) AuthEventIDs() []string                 { return nil }
func (m *memberAuth) ToHeaderedJSON() ([]byte, error)        { return nil, errMemberAuth }

func (m *memberAuth) HistoryVisibility() (gomatrixserverlib.HistoryVisibility, error) {
	return "", errMemberAuth
}

func (m *memberAuth) PowerLevels() (*gomatrixserverlib.PowerLevelContent, error) {
	return nil, errMemberAuth
}

func (m *memberAuth) SetUnsigned(any) (gomatrixserverlib.PDU, error) { return nil, errMemberAuth }
func (m *memberAuth) SetUnsignedField(string, any) error             { return errMemberAuth }

func (m *memberAuth) Sign(string, gomatrixserverlib.KeyID, ed25519.PrivateKey) gomatrixserverlib.PDU {
	return m
}
