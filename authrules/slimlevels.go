package authrules

import (
	"encoding/json"
	"slices"
	"strconv"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/mtxdb/mtxdb/internal/jsonstr"
)

// allowedLevels is gomatrixserverlib's own parse of a power levels event's
// content (NewPowerLevelContentFromEvent, the parse its Allowed makes), kept in
// the ruleMemo: its users map, and the rest encoded as a JSON object without its
// closing brace. ok is false when that parse failed.
type allowedLevels struct {
	users map[string]int64
	rest  []byte
	ok    bool
}

// slimLevels is a power levels event as one check by gomatrixserverlib's Allowed
// reads it: the event itself, with a content that holds every level of the
// event's but, of its users map, only the users the check reads. A pointer, so
// that Allowed's comparisons of auth events stay comparisons of identity.
type slimLevels struct {
	gomatrixserverlib.PDU
	content []byte
}

// Content returns the slimmed content: every level, and the users the check reads.
func (s *slimLevels) Content() []byte { return s.content }

// forAllowed returns the auth events list to hand gomatrixserverlib's Allowed
// for p: list itself, or a copy whose power levels event (the last one, which
// NewAuthEvents keeps) is a slimLevels. Allowed parses the power levels event on
// every call (in a large room a users map of thousands of entries, for an event
// that reads one or two of them); of the users map, a check of any event but a
// power levels event reads only the sender's level, the state_key's (the target
// of a membership change) and a restricted join's join_authorised_via_users_server
// (userPowerLevel and UserLevel in gomatrixserverlib's eventauth.go at the pinned
// version, https://github.com/matrix-org/gomatrixserverlib/blob/6697d93cbcba/eventauth.go),
// so with the others left out Allowed decides the same. A power levels event is checked
// against the full content (it compares old and new levels of every user), as is
// any check where gomatrixserverlib's own parse of the content fails. The memo
// keeps gomatrixserverlib's parse per power levels event; nil memo: list.
func (m *ruleMemo) forAllowed(p gomatrixserverlib.PDU, list []gomatrixserverlib.PDU) []gomatrixserverlib.PDU {
	if m == nil || p.Type() == spec.MRoomPowerLevels {
		return list
	}
	i := -1
	for j, e := range list {
		if e.Type() == spec.MRoomPowerLevels && e.StateKeyEquals("") {
			i = j
		}
	}
	if i < 0 {
		return list
	}
	al := m.allowedLevels(list[i])
	if !al.ok {
		return list
	}
	read := []string{string(p.SenderID())}
	if sk := p.StateKey(); sk != nil {
		read = append(read, *sk)
	}
	if p.Type() == spec.MRoomMember {
		if via := memberContent(p).Via; via != "" {
			read = append(read, via)
		}
	}
	b := append(make([]byte, 0, len(al.rest)+64*len(read)), al.rest...)
	b = append(b, `,"users":{`...)
	n := 0
	for j, u := range read {
		l, ok := al.users[u]
		if !ok || slices.Contains(read[:j], u) {
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = jsonstr.Append(b, u)
		b = append(b, ':')
		b = strconv.AppendInt(b, l, 10)
	}
	b = append(b, "}}"...)
	out := slices.Clone(list)
	out[i] = &slimLevels{PDU: list[i], content: b}
	return out
}

// allowedLevels returns gomatrixserverlib's parse of pe's content, kept by room
// and event ID.
func (m *ruleMemo) allowedLevels(pe gomatrixserverlib.PDU) allowedLevels {
	k := pe.RoomID().String() + "\x00" + pe.EventID()
	if al, ok := m.allowed.Get(k); ok {
		return al
	}
	c, err := gomatrixserverlib.NewPowerLevelContentFromEvent(pe)
	al := allowedLevels{users: c.Users, ok: err == nil}
	c.Users = nil
	if al.ok {
		rest, err := json.Marshal(struct {
			gomatrixserverlib.PowerLevelContent
			Users *struct{} `json:"users,omitempty"`
		}{PowerLevelContent: c})
		al.rest, al.ok = rest, err == nil && len(rest) > 2
		if al.ok {
			al.rest = rest[:len(rest)-1]
		}
	}
	m.allowed.Add(k, al)
	return al
}
