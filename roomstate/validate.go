package roomstate

import (
	"errors"
	"fmt"

	"github.com/mtxdb/mtxdb/pdu"

	"github.com/matrix-org/gomatrixserverlib"
)

// ErrOtherRoom is returned for a PDU whose auth_events name an event of another
// room (Matrix spec v1.19, "Authorisation rules": rule 2.5 in room versions 1-11,
// 3.4 in 12).
var ErrOtherRoom = errors.New("roomstate: auth event of another room")

// roomOf returns a room other than not that holds event id: one this import
// touched, or else one in the store; "" if none does. It runs only when a PDU is
// about to be refused for an auth event its room does not hold (not with AnyOrder,
// where such a PDU is stored and left an outlier by replay), so the store's rooms
// are listed once per import and read only on that path (one metadata lookup per
// room).
func (imp *importer) roomOf(id, not string) string {
	for rid, pr := range imp.rooms {
		if rid == not || pr == nil {
			continue
		}
		if _, ok := pr.known[id]; ok {
			return rid
		}
	}
	if imp.stored == nil {
		rooms, err := imp.s.Rooms(imp.ctx)
		if err != nil {
			return ""
		}
		imp.stored = rooms
	}
	for _, r := range imp.stored {
		if _, touched := imp.rooms[r.ID()]; touched || r.ID() == not {
			continue
		}
		if _, err := r.Meta(id); err == nil {
			return r.ID()
		}
	}
	return ""
}

// otherRoomError is the refusal of a PDU citing auth event id of room other: the
// authorization rule "if any event in auth_events has a room_id which does not match
// that of the event being authorised, reject" (rule 2.5 in room versions 1-11, 3.4
// in version 12, as the Matrix spec v1.19 pages number them).
func otherRoomError(version gomatrixserverlib.RoomVersion, id, other string) error {
	rule := "2.5"
	if version == gomatrixserverlib.RoomVersionV12 {
		rule = "3.4"
	}
	return fmt.Errorf("%w: auth event %s is an event of room %s (authorization rule %s of room version %s)",
		ErrOtherRoom, id, other, rule, version)
}

// refusedEventID names a PDU refused before it was parsed, or because it did not
// parse: its event_id field (room versions 1 and 2 carry one; exports of later
// versions often do), read from the header or, when the header or the JSON is
// malformed, by scanning the raw bytes for a top-level "event_id" string; or else
// its reference hash, computed here without the checks it failed (an oversized PDU
// is still named); "" if none works.
func (imp *importer) refusedEventID(h pdu.Header, raw []byte) string {
	if h.EventID != "" {
		return h.EventID
	}
	var ids idScanner
	if ids.feed(raw); ids.eventID != "" {
		return ids.eventID
	}
	v := gomatrixserverlib.RoomVersion(imp.opts.RoomVersion)
	if pr, ok := imp.rooms[h.RoomID]; ok && pr != nil {
		v = gomatrixserverlib.RoomVersion(pr.head.RoomVersion)
	} else if cv, err := pdu.CreateRoomVersion(h); err == nil && h.Type == "m.room.create" {
		v = cv
	}
	verImpl, err := gomatrixserverlib.GetRoomVersion(v)
	if err != nil || verImpl.EventIDFormat() == gomatrixserverlib.EventIDFormatV1 {
		return ""
	}
	return pdu.ReferenceEventID(verImpl, raw)
}
