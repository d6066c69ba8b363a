package gen

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"

	"github.com/matrix-org/gomatrixserverlib"
)

// buildEvent builds, hashes and signs an event as gomatrixserverlib's
// EventBuilder.Build does, byte for byte (TestBuildEventMatchesGMSL), without its
// JSON round trips: the canonical JSON is written directly (the fields sorted),
// the content hash taken over it, the redacted form (gomatrixserverlib's
// RedactEventJSON, canonicalised) signed and hashed once for both the signature
// and the event ID, and the result parsed once with that ID. It serves room
// versions 10-12 for events with a room ID (not the v12 create event).
func (r *room) buildEvent(proto *gomatrixserverlib.ProtoEvent, ts int64, origin string, key ed25519.PrivateKey) (gomatrixserverlib.PDU, error) {
	content, err := gomatrixserverlib.CanonicalJSON(proto.Content)
	if err != nil {
		return nil, err
	}
	head := make([]byte, 0, 1024)
	head = append(head, `{"auth_events":`...)
	head = appendStrings(head, proto.AuthEvents.([]string))
	head = append(head, `,"content":`...)
	head = append(head, content...)
	head = append(head, `,"depth":`...)
	head = strconv.AppendInt(head, proto.Depth, 10)
	// tail: the fields after "hashes", up to and excluding "signatures"; rest: after.
	tail := make([]byte, 0, 512)
	tail = append(tail, `,"origin":`...)
	tail = appendCanonicalString(tail, origin)
	tail = append(tail, `,"origin_server_ts":`...)
	tail = strconv.AppendInt(tail, ts, 10)
	tail = append(tail, `,"prev_events":`...)
	tail = appendStrings(tail, proto.PrevEvents.([]string))
	if proto.StateKey != nil {
		tail = append(tail, `,"prev_state":[]`...)
	}
	if proto.Redacts != "" {
		tail = append(tail, `,"redacts":`...)
		tail = appendCanonicalString(tail, proto.Redacts)
	}
	tail = append(tail, `,"room_id":`...)
	tail = appendCanonicalString(tail, proto.RoomID)
	tail = append(tail, `,"sender":`...)
	tail = appendCanonicalString(tail, proto.SenderID)
	rest := make([]byte, 0, 128)
	if proto.StateKey != nil {
		rest = append(rest, `,"state_key":`...)
		rest = appendCanonicalString(rest, *proto.StateKey)
	}
	rest = append(rest, `,"type":`...)
	rest = appendCanonicalString(rest, proto.Type)
	rest = append(rest, '}')

	unhashed := make([]byte, 0, len(head)+len(tail)+len(rest))
	unhashed = append(append(append(unhashed, head...), tail...), rest...)
	contentHash := sha256.Sum256(unhashed)
	full := make([]byte, 0, len(unhashed)+200)
	full = append(full, head...)
	full = append(full, `,"hashes":{"sha256":"`...)
	full = base64.RawStdEncoding.AppendEncode(full, contentHash[:])
	full = append(full, `"}`...)
	full = append(full, tail...)
	signAt := len(full)
	full = append(full, rest...)

	redacted, err := r.ver.RedactEventJSON(full)
	if err != nil {
		return nil, err
	}
	if redacted, err = gomatrixserverlib.CanonicalJSON(redacted); err != nil {
		return nil, err
	}
	sig := ed25519.Sign(key, redacted)
	ref := sha256.Sum256(redacted)
	eventID := "$" + base64.RawURLEncoding.EncodeToString(ref[:])

	out := make([]byte, 0, len(full)+160)
	out = append(out, full[:signAt]...)
	out = append(out, `,"signatures":{`...)
	out = appendCanonicalString(out, origin)
	out = append(out, `:{`...)
	out = appendCanonicalString(out, string(keyID))
	out = append(out, `:"`...)
	out = base64.RawStdEncoding.AppendEncode(out, sig)
	out = append(out, `"}}`...)
	out = append(out, full[signAt:]...)
	pdu, err := r.ver.NewEventFromTrustedJSONWithEventID(eventID, out, false)
	if err != nil {
		return nil, fmt.Errorf("gen: parse built event: %w", err)
	}
	return pdu, nil
}

func appendStrings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendCanonicalString(b, s)
	}
	return append(b, ']')
}

// appendCanonicalString appends s as canonical JSON encodes it.
func appendCanonicalString(b []byte, s string) []byte {
	j := appendJSONString(nil, s)
	if len(j) != len(s)+2 {
		// Escaped by json.Marshal's rules (which also escape <, > and &): let
		// gomatrixserverlib write the canonical form.
		if c, err := gomatrixserverlib.CanonicalJSON(j); err == nil {
			j = c
		}
	}
	return append(b, j...)
}
