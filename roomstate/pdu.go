package roomstate

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// Errors of PDU parsing and import. Each is returned wrapped in an *ImportError (or
// a plain error naming the event) so that errors.Is works.
var (
	// ErrMalformedPDU is returned when a line is not a PDU this module can parse for
	// its room version (bad JSON, missing fields, a panic inside gomatrixserverlib).
	ErrMalformedPDU = errors.New("roomstate: malformed PDU")
	// ErrUnknownRoomVersion is returned for an m.room.create whose room_version is not
	// one gomatrixserverlib knows.
	ErrUnknownRoomVersion = errors.New("roomstate: unknown room version")
	// ErrEventIDMismatch is returned when a v3+ PDU carries an event_id field that is
	// not its reference hash.
	ErrEventIDMismatch = errors.New("roomstate: event_id does not match the reference hash")
	// ErrMissingPrevEvent is returned when a PDU names a prev_event that is neither in
	// the store nor earlier in the input.
	ErrMissingPrevEvent = errors.New("roomstate: prev_event not found")
	// ErrMissingAuthEvent is the same for auth_events.
	ErrMissingAuthEvent = errors.New("roomstate: auth_event not found")
	// ErrNoCreateEvent is returned for a PDU of a room the store does not know, when
	// the PDU is not that room's m.room.create.
	ErrNoCreateEvent = errors.New("roomstate: room has no m.room.create yet")
	// ErrConflictingEvent is returned when a v1/v2-format PDU reuses the event ID of a
	// stored event with a different content hash.
	ErrConflictingEvent = errors.New("roomstate: event ID already stored with different content")
	// ErrUnknownRoom is returned by Store.Room for a room that was never imported.
	ErrUnknownRoom = errors.New("roomstate: unknown room")
)

// pduHeader is the part of a PDU read before the room version is known.
type pduHeader struct {
	RoomID   string          `json:"room_id"`
	Type     string          `json:"type"`
	StateKey *string         `json:"state_key"`
	EventID  string          `json:"event_id"`
	Content  json.RawMessage `json:"content"`
	Sender   string          `json:"sender"` // for the field limits (checkFieldLimits)
}

func readHeader(raw []byte) (pduHeader, error) {
	var h pduHeader
	if err := json.Unmarshal(raw, &h); err != nil {
		return h, fmt.Errorf("%w: %v", ErrMalformedPDU, err)
	}
	if h.Type == "" {
		return h, fmt.Errorf("%w: no type", ErrMalformedPDU)
	}
	return h, nil
}

// createRoomVersion reads content.room_version of an m.room.create; absent means "1"
// (Matrix spec v1.19, Client-Server API, "m.room.create").
func createRoomVersion(h pduHeader) (gomatrixserverlib.RoomVersion, error) {
	var c struct {
		RoomVersion *string `json:"room_version"`
	}
	if len(h.Content) > 0 {
		if err := json.Unmarshal(h.Content, &c); err != nil {
			return "", fmt.Errorf("%w: m.room.create content: %v", ErrMalformedPDU, err)
		}
	}
	v := "1"
	if c.RoomVersion != nil {
		v = *c.RoomVersion
	}
	rv := gomatrixserverlib.RoomVersion(v)
	if !gomatrixserverlib.KnownRoomVersion(rv) {
		return "", fmt.Errorf("%w: %q", ErrUnknownRoomVersion, v)
	}
	return rv, nil
}

// ParsePDU parses PDU JSON for a room version with gomatrixserverlib: the content
// hash is checked and a PDU whose hash fails is redacted (Matrix spec v1.19,
// Server-Server API, "Checks performed on receipt of a PDU"); signatures are not
// checked. For v3+ formats a top-level event_id is stripped and must equal the
// reference hash. Panics inside gomatrixserverlib become ErrMalformedPDU errors.
func ParsePDU(version gomatrixserverlib.RoomVersion, raw []byte) (pdu gomatrixserverlib.PDU, err error) {
	verImpl, err := gomatrixserverlib.GetRoomVersion(version)
	if err != nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownRoomVersion, version)
	}
	defer func() {
		if r := recover(); r != nil {
			pdu, err = nil, fmt.Errorf("%w: gomatrixserverlib panicked: %v", ErrMalformedPDU, r)
		}
	}()
	pdu, err = verImpl.NewEventFromUntrustedJSON(raw)
	if errors.Is(err, gomatrixserverlib.ErrCanonicalJSON) {
		// gomatrixserverlib's wording ("value is outside of safe range") is also
		// its answer for a fraction, an exponent and -0.
		return nil, fmt.Errorf("%w: a number that room version %s does not allow: PDUs of v6+ hold only integers from -(2^53)+1 to 2^53-1, without a fraction, an exponent or -0 (spec, Room Versions 6, canonical JSON)",
			ErrMalformedPDU, version)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformedPDU, err)
	}
	if verImpl.EventFormat() == gomatrixserverlib.EventFormatV1 {
		// v1/v2 events name themselves; gomatrixserverlib would accept a missing one.
		var h struct {
			EventID string `json:"event_id"`
		}
		if err := json.Unmarshal(raw, &h); err != nil || h.EventID == "" || h.EventID != pdu.EventID() {
			return nil, fmt.Errorf("%w: room version %s event without a valid event_id", ErrMalformedPDU, version)
		}
	} else {
		var h struct {
			EventID *string `json:"event_id"`
		}
		if err := json.Unmarshal(raw, &h); err == nil && h.EventID != nil && *h.EventID != pdu.EventID() {
			return nil, fmt.Errorf("%w: declared %s, computed %s", ErrEventIDMismatch, *h.EventID, pdu.EventID())
		}
	}
	// Touch the accessors that can panic on hostile input, inside the recover.
	_ = pdu.RoomID()
	_ = pdu.SenderID()
	return pdu, nil
}

// UserIDForSender maps a sender to a user ID for room versions without pseudonymous
// sender IDs (all versions this module supports): the sender is the user ID.
func UserIDForSender(_ spec.RoomID, senderID spec.SenderID) (*spec.UserID, error) {
	return spec.NewUserID(string(senderID), true)
}
