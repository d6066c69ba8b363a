package pdu

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// Errors of PDU parsing.
var (
	// ErrMalformedPDU is returned when a line is not a PDU this module can parse for
	// its room version (bad JSON, missing fields, a panic inside gomatrixserverlib).
	ErrMalformedPDU = errors.New("pdu: malformed PDU")
	// ErrUnknownRoomVersion is returned for an m.room.create whose room_version is not
	// one gomatrixserverlib knows.
	ErrUnknownRoomVersion = errors.New("pdu: unknown room version")
	// ErrEventIDMismatch is returned when a v3+ PDU carries an event_id field that is
	// not its reference hash.
	ErrEventIDMismatch = errors.New("pdu: event_id does not match the reference hash")
)

// Header is the part of a PDU read before the room version is known: what the
// field limits (CheckFieldLimits) and the choice of room version need.
type Header struct {
	RoomID   string          `json:"room_id"`
	Type     string          `json:"type"`
	StateKey *string         `json:"state_key"`
	EventID  string          `json:"event_id"`
	Content  json.RawMessage `json:"content"`
	Sender   string          `json:"sender"` // for the field limits (CheckFieldLimits)
}

// ReadHeader reads a PDU's Header; bad JSON or no type is ErrMalformedPDU.
func ReadHeader(raw []byte) (Header, error) {
	var h Header
	if err := json.Unmarshal(raw, &h); err != nil {
		return h, fmt.Errorf("%w: %v", ErrMalformedPDU, err)
	}
	if h.Type == "" {
		return h, fmt.Errorf("%w: no type", ErrMalformedPDU)
	}
	return h, nil
}

// CreateRoomVersion reads content.room_version of an m.room.create; absent means "1"
// (Matrix spec v1.19, Client-Server API, "m.room.create").
func CreateRoomVersion(h Header) (gomatrixserverlib.RoomVersion, error) {
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

// Parse parses PDU JSON for a room version with gomatrixserverlib: the content
// hash is checked and a PDU whose hash fails is redacted (Matrix spec v1.19,
// Server-Server API, "Checks performed on receipt of a PDU"); signatures are not
// checked. For v3+ formats a top-level event_id is stripped and must equal the
// reference hash. Panics inside gomatrixserverlib become ErrMalformedPDU errors.
func Parse(version gomatrixserverlib.RoomVersion, raw []byte) (pdu gomatrixserverlib.PDU, err error) {
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
