package gen

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/mtxdb/mtxdb/internal/jsonstr"
)

// buildEvent builds, hashes and signs an event as gomatrixserverlib's
// EventBuilder.Build does, byte for byte (TestBuildEventMatchesGMSL), without its
// JSON round trips: the canonical JSON is written directly (the fields sorted),
// the content hash taken over it, the redacted form (gomatrixserverlib's
// RedactEventJSON, canonicalised) hashed for the event ID and signed (later, by the
// signer: the event ID does not cover signatures), and the event parsed once with
// that ID. It serves room
// versions 10-12 for events with a room ID (not the v12 create event).
func (r *room) buildEvent(proto *gomatrixserverlib.ProtoEvent, ts int64, origin string, key ed25519.PrivateKey) (gomatrixserverlib.PDU, *signing, error) {
	content, err := gomatrixserverlib.CanonicalJSON(proto.Content)
	if err != nil {
		return nil, nil, err
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

	var redacted []byte
	if proto.StateKey == nil && proto.Type != spec.MRoomRedaction {
		// A plain event's redacted form is itself with empty content, and (room
		// versions 11 and up) without "origin": written directly, already canonical.
		// (Redactions keep content.redacts from version 11.)
		redacted = make([]byte, 0, len(full))
		redacted = append(redacted, `{"auth_events":`...)
		redacted = appendStrings(redacted, proto.AuthEvents.([]string))
		redacted = append(redacted, `,"content":{},"depth":`...)
		redacted = strconv.AppendInt(redacted, proto.Depth, 10)
		redacted = append(redacted, full[len(head):len(head)+len(full)-len(unhashed)]...) // ,"hashes":{...}
		t := tail
		if !r.redactionKeepsOrigin() {
			t = t[len(`,"origin":`)+len(appendCanonicalString(nil, origin)):]
		}
		redacted = append(redacted, t...)
		redacted = append(redacted, rest...)
	} else {
		if redacted, err = r.ver.RedactEventJSON(full); err != nil {
			return nil, nil, err
		}
		if redacted, err = gomatrixserverlib.CanonicalJSON(redacted); err != nil {
			return nil, nil, err
		}
	}
	ref := sha256.Sum256(redacted)
	eventID := "$" + base64.RawURLEncoding.EncodeToString(ref[:])
	// The simulation needs the event (and its ID, the reference hash) now, the
	// signature only when the line is written: the signer computes it meanwhile.
	pdu, err := r.ver.NewEventFromTrustedJSONWithEventID(eventID, full, false)
	if err != nil {
		return nil, nil, fmt.Errorf("gen: parse built event: %w", err)
	}
	return pdu, &signing{unsigned: full, idAt: len(head), id: eventID, at: signAt, redacted: redacted, origin: origin, key: key, done: make(chan struct{})}, nil
}

// redactionKeepsOrigin reports whether the room version's redaction algorithm keeps
// the top-level "origin" key (room versions up to 10; Matrix spec v1.19, room
// version 11, "Redactions"), as gomatrixserverlib's RedactEventJSON does it (asked
// once per room).
func (r *room) redactionKeepsOrigin() bool {
	if r.keepsOrigin == 0 {
		r.keepsOrigin = -1
		out, err := r.ver.RedactEventJSON([]byte(`{"content":{},"origin":"a","type":"m.room.message"}`))
		if err == nil && bytes.Contains(out, []byte(`"origin"`)) {
			r.keepsOrigin = 1
		}
	}
	return r.keepsOrigin == 1
}

// signing is an event's signature in the making: unsigned is its JSON without
// "signatures", which go at offset at. Once signed, line is its events.jsonl line
// and done is closed.
type signing struct {
	unsigned []byte
	idAt     int    // where the line's "event_id" goes (after "depth")
	id       string // the event ID
	at       int
	redacted []byte // what is signed
	origin   string
	key      ed25519.PrivateKey
	line     []byte
	done     chan struct{}
}

// sign signs the event and writes its events.jsonl line: the JSON with the
// signature and the convenience top-level "event_id", in canonical key order
// ("depth" < "event_id" < "hashes"; "sender" < "signatures" < "state_key").
func (g *signing) sign() {
	sig := ed25519.Sign(g.key, g.redacted)
	out := make([]byte, 0, len(g.unsigned)+len(g.id)+180)
	out = append(out, g.unsigned[:g.idAt]...)
	out = append(out, `,"event_id":`...)
	out = appendCanonicalString(out, g.id)
	out = append(out, g.unsigned[g.idAt:g.at]...)
	out = append(out, `,"signatures":{`...)
	out = appendCanonicalString(out, g.origin)
	out = append(out, `:{`...)
	out = appendCanonicalString(out, string(keyID))
	out = append(out, `:"`...)
	out = base64.RawStdEncoding.AppendEncode(out, sig)
	out = append(out, `"}}`...)
	g.line = append(out, g.unsigned[g.at:]...)
	g.unsigned, g.redacted = nil, nil
}

// signer signs events on another goroutine while the simulation goes on.
type signer struct {
	jobs chan *signing
	done chan struct{}
}

func startSigner() *signer {
	s := &signer{jobs: make(chan *signing, 4096), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for g := range s.jobs {
			g.sign()
			close(g.done)
		}
	}()
	return s
}

// finish waits for every signature submitted so far.
func (s *signer) finish() {
	close(s.jobs)
	<-s.done
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
	j := jsonstr.Append(nil, s)
	if len(j) != len(s)+2 {
		// Escaped by json.Marshal's rules (which also escape <, > and &): let
		// gomatrixserverlib write the canonical form.
		if c, err := gomatrixserverlib.CanonicalJSON(j); err == nil {
			j = c
		}
	}
	return append(b, j...)
}
