package pdu

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
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

// ReadHeader reads a PDU's Header from its top-level keys (a key given twice:
// the last); bad JSON, a field of the wrong JSON type or no type is
// ErrMalformedPDU. A null field is as if absent.
func ReadHeader(raw []byte) (Header, error) {
	var h Header
	if !gjson.ValidBytes(raw) {
		err := json.Unmarshal(raw, &h) // for its description of what is wrong
		if err == nil {
			err = errors.New("not valid JSON")
		}
		return Header{}, fmt.Errorf("%w: %v", ErrMalformedPDU, err)
	}
	root := gjson.ParseBytes(raw)
	if !root.IsObject() {
		return h, fmt.Errorf("%w: not a JSON object", ErrMalformedPDU)
	}
	var err error
	root.ForEach(func(k, v gjson.Result) bool {
		key := k.String()
		switch key {
		case "room_id":
			err = headerString(&h.RoomID, key, v)
		case "type":
			err = headerString(&h.Type, key, v)
		case "event_id":
			err = headerString(&h.EventID, key, v)
		case "sender":
			err = headerString(&h.Sender, key, v)
		case "state_key":
			h.StateKey = nil
			if v.Type != gjson.Null {
				var sk string
				err, h.StateKey = headerString(&sk, key, v), &sk
			}
		case "content":
			h.Content = json.RawMessage(v.Raw)
		}
		return err == nil
	})
	if err != nil {
		return h, err
	}
	if h.Type == "" {
		return h, fmt.Errorf("%w: no type", ErrMalformedPDU)
	}
	return h, nil
}

// headerString sets *dst to a header field's string (to "" for null).
func headerString(dst *string, key string, v gjson.Result) error {
	switch v.Type {
	case gjson.String:
		*dst = v.String()
	case gjson.Null:
		*dst = ""
	default:
		return fmt.Errorf("%w: %s is not a string", ErrMalformedPDU, key)
	}
	return nil
}

// CreateRoomVersion reads content.room_version of an m.room.create; absent means "1"
// (Matrix spec v1.19, Client-Server API, "m.room.create"). A room_version that is
// present but not a string (null included) is ErrMalformedPDU.
func CreateRoomVersion(h Header) (gomatrixserverlib.RoomVersion, error) {
	var c struct {
		RoomVersion json.RawMessage `json:"room_version"`
	}
	if len(h.Content) > 0 {
		if err := json.Unmarshal(h.Content, &c); err != nil {
			return "", fmt.Errorf("%w: m.room.create content: %v", ErrMalformedPDU, err)
		}
	}
	v := "1"
	if c.RoomVersion != nil {
		if err := json.Unmarshal(c.RoomVersion, &v); err != nil || string(c.RoomVersion) == "null" {
			return "", fmt.Errorf("%w: m.room.create content: room_version is %s, not a string", ErrMalformedPDU, c.RoomVersion)
		}
	}
	rv := gomatrixserverlib.RoomVersion(v)
	if !gomatrixserverlib.KnownRoomVersion(rv) {
		return "", fmt.Errorf("%w: %q", ErrUnknownRoomVersion, v)
	}
	return rv, nil
}

// Parse parses PDU JSON for a room version with gomatrixserverlib (a v3+ PDU
// that is canonical JSON already by parseCanonical, with the same result): the content
// hash is checked and a PDU whose hash fails is redacted (Matrix spec v1.19,
// Server-Server API, "Checks performed on receipt of a PDU"); signatures are not
// checked. For v3+ formats a top-level event_id is stripped and must equal the
// reference hash. JSON that is not UTF-8 or escapes a lone UTF-16 surrogate is
// ErrMalformedPDU (RFC 8259 sections 8.1 and 8.2: the decoders would store U+FFFD
// where the reference hash covers other bytes, so two PDUs could share an event
// ID or a state key). Panics inside gomatrixserverlib become ErrMalformedPDU errors.
func Parse(version gomatrixserverlib.RoomVersion, raw []byte) (pdu gomatrixserverlib.PDU, err error) {
	verImpl, err := versionImpl(version)
	if err != nil {
		return nil, err
	}
	defer recoverMalformed(&pdu, &err)
	if err := checkUnicode(raw); err != nil {
		return nil, err
	}
	pdu, ok := parseCanonical(verImpl, raw)
	if !ok {
		// Canonical JSON has no repeated key; other JSON is checked here.
		if key, dup := repeatedKey(gjson.ParseBytes(raw), 0); dup {
			return nil, fmt.Errorf("%w: the key %q appears twice in one object (decoders disagree on which value counts)", ErrMalformedPDU, key)
		}
		pdu, err = verImpl.NewEventFromUntrustedJSON(raw)
	}
	if errors.Is(err, gomatrixserverlib.ErrCanonicalJSON) {
		// gomatrixserverlib's wording ("value is outside of safe range") is also
		// its answer for a fraction, an exponent and -0.
		return nil, fmt.Errorf("%w: a number that room version %s does not allow: PDUs of v6+ hold only integers from -(2^53)+1 to 2^53-1, without a fraction, an exponent or -0 (spec, Room Versions 6, canonical JSON)",
			ErrMalformedPDU, version)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformedPDU, err)
	}
	if verImpl.EventFormat() != gomatrixserverlib.EventFormatV1 {
		id, err := canonicalReferenceHashID(verImpl, pdu.JSON())
		if err != nil {
			return nil, fmt.Errorf("%w: reference hash: %v", ErrMalformedPDU, err)
		}
		pdu = identified{PDU: pdu, id: id}
	}
	declared, err := declaredEventIDs(raw)
	if err != nil {
		return nil, err
	}
	if verImpl.EventFormat() == gomatrixserverlib.EventFormatV1 {
		// v1/v2 events name themselves; gomatrixserverlib would accept a missing one.
		if len(declared) == 0 || declared[len(declared)-1] == "" || declared[len(declared)-1] != pdu.EventID() {
			return nil, fmt.Errorf("%w: room version %s event without a valid event_id", ErrMalformedPDU, version)
		}
	} else {
		for _, id := range declared {
			if id != pdu.EventID() {
				return nil, fmt.Errorf("%w: declared %s, computed %s", ErrEventIDMismatch, id, pdu.EventID())
			}
		}
	}
	// Touch the accessors that can panic on hostile input, inside the recover;
	// a v3+ PDU keeps its room ID (gomatrixserverlib parses it with a regular
	// expression on every call).
	if p, ok := pdu.(identified); ok {
		pdu = identify(p.PDU, p.id)
	} else {
		_ = pdu.RoomID()
	}
	_ = pdu.SenderID()
	return pdu, nil
}

// ParseTrusted parses PDU JSON that an earlier Parse accepted (a stored event
// whose content hash passed) under its known event ID, without recomputing the
// reference and content hashes: gomatrixserverlib's
// NewEventFromTrustedJSONWithEventID, with a v3+ PDU's room ID parsed once.
// Errors wrap ErrUnknownRoomVersion or ErrMalformedPDU (a panic in
// gomatrixserverlib among them).
func ParseTrusted(version gomatrixserverlib.RoomVersion, eventID string, raw []byte) (pdu gomatrixserverlib.PDU, err error) {
	verImpl, err := versionImpl(version)
	if err != nil {
		return nil, err
	}
	defer recoverMalformed(&pdu, &err)
	if pdu, err = verImpl.NewEventFromTrustedJSONWithEventID(eventID, raw, false); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformedPDU, err)
	}
	if verImpl.EventFormat() != gomatrixserverlib.EventFormatV1 {
		pdu = identify(pdu, eventID)
	}
	return pdu, nil
}

// versionImpl is gomatrixserverlib's implementation of a room version, or an
// error wrapping ErrUnknownRoomVersion.
func versionImpl(version gomatrixserverlib.RoomVersion) (gomatrixserverlib.IRoomVersion, error) {
	verImpl, err := gomatrixserverlib.GetRoomVersion(version)
	if err != nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownRoomVersion, version)
	}
	return verImpl, nil
}

// recoverMalformed, deferred, turns a panic inside gomatrixserverlib into an
// ErrMalformedPDU error and no PDU.
func recoverMalformed(pdu *gomatrixserverlib.PDU, err *error) {
	if r := recover(); r != nil {
		*pdu, *err = nil, fmt.Errorf("%w: gomatrixserverlib panicked: %v", ErrMalformedPDU, r)
	}
}

// UserIDForSender maps a sender to a user ID for room versions without pseudonymous
// sender IDs (all versions this module supports): the sender is the user ID.
func UserIDForSender(_ spec.RoomID, senderID spec.SenderID) (*spec.UserID, error) {
	return spec.NewUserID(string(senderID), true)
}

// declaredEventIDs returns the values of every top-level "event_id" key of the
// PDU JSON raw, in order (a key repeated is checked each time); a value that
// is not a string is ErrMalformedPDU. So is a PDU whose auth_events or
// prev_events (the last of each, as gomatrixserverlib reads them) is missing or
// not an array: gomatrixserverlib takes either as an empty list (Matrix spec
// v1.19, Server-Server API, "PDUs": both are required).
func declaredEventIDs(raw []byte) ([]string, error) {
	var ids []string
	var err error
	lists := map[string]bool{"auth_events": false, "prev_events": false}
	gjson.ParseBytes(raw).ForEach(func(k, v gjson.Result) bool {
		key := k.String()
		if _, ok := lists[key]; ok {
			lists[key] = v.IsArray()
			return true
		}
		if key != "event_id" {
			return true
		}
		if v.Type != gjson.String {
			err = fmt.Errorf("%w: event_id is not a string", ErrMalformedPDU)
			return false
		}
		ids = append(ids, v.String())
		return true
	})
	for _, key := range []string{"auth_events", "prev_events"} {
		if err == nil && !lists[key] {
			err = fmt.Errorf("%w: %s is missing or not an array", ErrMalformedPDU, key)
		}
	}
	return ids, err
}

// identified is a v3+ PDU with its event ID computed by Parse (the event ID
// gomatrixserverlib's PDU would compute on first use, at about half its cost),
// and its room ID and, for an m.room.member event, its membership read once:
// gomatrixserverlib parses the room ID with a regular expression and decodes
// the content's JSON for the membership on every call.
type identified struct {
	gomatrixserverlib.PDU
	id         string
	roomID     spec.RoomID
	membership string
	memberErr  error
}

// identify wraps a v3+ PDU whose event ID is id. It calls RoomID and, for an
// m.room.member event, Membership, which can panic on hostile input: callers
// recover.
func identify(p gomatrixserverlib.PDU, id string) identified {
	ip := identified{PDU: p, id: id, roomID: p.RoomID()}
	if p.Type() == spec.MRoomMember {
		ip.membership, ip.memberErr = p.Membership()
	}
	return ip
}

// Membership is the content's membership of an m.room.member event, as
// gomatrixserverlib reads it (an error without a state key or when the content
// does not decode); for other events, gomatrixserverlib's answer.
func (p identified) Membership() (string, error) {
	if p.PDU.Type() != spec.MRoomMember {
		return p.PDU.Membership()
	}
	return p.membership, p.memberErr
}

// EventID is the PDU's reference hash event ID.
func (p identified) EventID() string { return p.id }

// RoomID is the PDU's room ID, as gomatrixserverlib parses it (for a v12
// create event, derived from the event ID).
func (p identified) RoomID() spec.RoomID { return p.roomID }

// referenceHashID is the event ID of a v3+ PDU: "$" and the unpadded base64
// (URL-safe from room version 4) of the SHA-256 of the event redacted for its
// room version (gomatrixserverlib's redaction), without signatures, unsigned
// and event_id, as canonical JSON (Matrix spec v1.19, Server-Server API,
// "Calculating the reference hash for an event"). It is gomatrixserverlib's
// computation without its decoding of the redacted event into a map and
// encoding it back.
func referenceHashID(verImpl gomatrixserverlib.IRoomVersion, eventJSON []byte) (string, error) {
	red, err := verImpl.RedactEventJSON(eventJSON)
	if err != nil {
		return "", err
	}
	// The redacted form has no unsigned (no room version's redaction keeps
	// it). It holds event_id when the input did (a v1 or v2 event, or a raw
	// PDU: ReferenceEventID), or when gomatrixserverlib's decoder, which
	// matches keys in any case, took a key like "event_iD" for it.
	if red, err = sjson.DeleteBytes(red, "signatures"); err != nil {
		return "", err
	}
	if gjson.GetBytes(red, "event_id").Exists() {
		if red, err = sjson.DeleteBytes(red, "event_id"); err != nil {
			return "", err
		}
	}
	// json.Marshal wrote red: valid JSON, not yet canonical (it escapes <, >
	// and &, for one).
	return hashID(verImpl, gomatrixserverlib.CanonicalJSONAssumeValid(red)), nil
}

// canonicalReferenceHashID is referenceHashID for the canonical JSON of a
// parsed PDU: canonicalRedacted's filtering of its bytes where that gives
// gomatrixserverlib's redaction, referenceHashID's otherwise.
func canonicalReferenceHashID(verImpl gomatrixserverlib.IRoomVersion, canon []byte) (string, error) {
	var buf [2048]byte
	if red, ok := canonicalRedacted(verImpl.Version(), canon, buf[:0]); ok {
		return hashID(verImpl, red), nil
	}
	return referenceHashID(verImpl, canon)
}

// hashID is the event ID of the redacted canonical JSON red: "$" and its
// SHA-256 in the room version's base64.
func hashID(verImpl gomatrixserverlib.IRoomVersion, red []byte) string {
	sum := sha256.Sum256(red)
	if verImpl.EventIDFormat() == gomatrixserverlib.EventIDFormatV2 {
		return "$" + base64.RawStdEncoding.EncodeToString(sum[:])
	}
	return "$" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// checkUnicode refuses raw unless it is UTF-8 and every \u escape of a UTF-16
// surrogate is half of a pair (a high surrogate escape followed by a low one).
func checkUnicode(raw []byte) error {
	if !utf8.Valid(raw) {
		return fmt.Errorf("%w: the JSON is not valid UTF-8", ErrMalformedPDU)
	}
	if !bytes.Contains(raw, []byte(`\u`)) {
		return nil
	}
	inString := false
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case c == '"':
			inString = !inString
		case c == '\\' && inString && i+1 < len(raw):
			if raw[i+1] != 'u' {
				i++ // an escaped character, perhaps a quote
				continue
			}
			r, ok := escapedUnit(raw[i:])
			if !ok || !utf16.IsSurrogate(r) {
				i += 5
				continue
			}
			lo, ok := escapedUnit(raw[min(i+6, len(raw)):])
			if r >= 0xdc00 || !ok || lo < 0xdc00 || lo > 0xdfff {
				return fmt.Errorf("%w: a string escapes a lone UTF-16 surrogate (\\u%04x)", ErrMalformedPDU, r)
			}
			i += 11
		}
	}
	return nil
}

// escapedUnit decodes the \uXXXX escape at the start of b.
func escapedUnit(b []byte) (rune, bool) {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return 0, false
	}
	var r rune
	for _, c := range b[2:6] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// maxKeyDepth bounds the nesting repeatedKey follows (gomatrixserverlib
// refuses deeper JSON).
const maxKeyDepth = 100

// repeatedKey returns a key that appears twice in one object of v, at any
// depth up to maxKeyDepth.
func repeatedKey(v gjson.Result, depth int) (string, bool) {
	if depth > maxKeyDepth || !(v.IsObject() || v.IsArray()) {
		return "", false
	}
	var seen map[string]bool
	if v.IsObject() {
		seen = map[string]bool{}
	}
	key, dup := "", false
	v.ForEach(func(k, e gjson.Result) bool {
		if seen != nil {
			if seen[k.String()] {
				key, dup = k.String(), true
				return false
			}
			seen[k.String()] = true
		}
		key, dup = repeatedKey(e, depth+1)
		return !dup
	})
	return key, dup
}
