package pdu

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/matrix-org/gomatrixserverlib"
)

// Errors of the checks a PDU must pass to be a valid event at all (Matrix spec
// v1.19, Server-Server API, "Checks performed on receipt of a PDU", step 1: an
// invalid event is dropped). roomstate's import refuses such a PDU with its line and goes on.
var (
	// ErrTooLarge is returned for a PDU over 65,536 bytes as canonical JSON (Matrix
	// spec v1.19, Client-Server API, "Size limits").
	ErrTooLarge = errors.New("pdu: PDU over the 65,536-byte size limit")
	// ErrFieldTooLong is returned for a sender, room_id, state_key, type or event_id
	// over 255 bytes (Matrix spec v1.19, Client-Server API, "Size limits"; Appendices,
	// "Identifier Grammar": user, room and event IDs).
	ErrFieldTooLong = errors.New("pdu: PDU field over its size limit")
)

// MaxPDUBytes is the size limit of a PDU, in bytes of canonical JSON (Matrix spec
// v1.19, Client-Server API, "Size limits": "The complete event MUST NOT be larger
// than 65536 bytes, when formatted with the federation event format, including any
// signatures, and encoded as Canonical JSON").
const MaxPDUBytes = 65536

// MaxFieldBytes is the limit of sender, room_id, state_key, type and event_id
// (Matrix spec v1.19, Client-Server API, "Size limits"; the user, room and event ID
// grammars give 255 bytes too).
const MaxFieldBytes = 255

// CheckSize refuses a PDU over MaxPDUBytes. It runs first, on the raw bytes, before
// anything parses or hashes the PDU: raw JSON is never shorter than its canonical
// form by more than its insignificant white space and escapes, so only a PDU whose
// raw bytes exceed the limit is canonicalised to measure it exactly.
//
// The measure is linear in the input: encoding/json's Compact first (it also
// refuses nesting deeper than 10,000), and the canonical form only when the
// compact one is over the limit and holds escapes the canonical form may
// shorten. gomatrixserverlib.CanonicalJSON alone took time quadratic in the
// nesting depth: 51 s of CPU for a 200 KB line of 100,000 nested arrays.
func CheckSize(raw []byte) error {
	if len(raw) <= MaxPDUBytes {
		return nil
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return fmt.Errorf("%w: %d bytes, and not valid JSON (%v)", ErrTooLarge, len(raw), err)
	}
	if compact.Len() > MaxPDUBytes && !bytes.Contains(compact.Bytes(), []byte{'\\'}) {
		return fmt.Errorf("%w: %d bytes as canonical JSON", ErrTooLarge, compact.Len())
	}
	canon, err := gomatrixserverlib.CanonicalJSON(raw)
	if err != nil {
		return fmt.Errorf("%w: %d bytes, and not valid JSON (%v)", ErrTooLarge, len(raw), err)
	}
	if len(canon) > MaxPDUBytes {
		return fmt.Errorf("%w: %d bytes as canonical JSON", ErrTooLarge, len(canon))
	}
	return nil
}

// CheckFieldLimits refuses a PDU with a sender, room_id, state_key, type or event_id
// over MaxFieldBytes (Matrix spec v1.19, Client-Server API, "Size limits"), from its
// header.
func CheckFieldLimits(h Header) error {
	sk := ""
	if h.StateKey != nil {
		sk = *h.StateKey
	}
	for _, f := range []struct{ name, v string }{
		{"sender", h.Sender}, {"room_id", h.RoomID}, {"state_key", sk}, {"type", h.Type}, {"event_id", h.EventID},
	} {
		if len(f.v) > MaxFieldBytes {
			return fmt.Errorf("%w: %s is %d bytes (at most %d)", ErrFieldTooLong, f.name, len(f.v), MaxFieldBytes)
		}
	}
	return nil
}

// ReferenceEventID is the event ID of a room version 3+ PDU: "$" and the unpadded
// base64 (URL-safe from version 4) of the SHA-256 of its redacted form without
// signatures and unsigned, as canonical JSON (Matrix spec v1.19, Server-Server API,
// "Calculating the reference hash for an event"; room versions 3 and 4, "Event
// IDs").
func ReferenceEventID(verImpl gomatrixserverlib.IRoomVersion, raw []byte) (id string) {
	defer func() {
		if recover() != nil {
			id = ""
		}
	}()
	id, err := referenceHashID(verImpl, raw)
	if err != nil {
		return ""
	}
	return id
}
