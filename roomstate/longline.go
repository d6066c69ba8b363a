package roomstate

import (
	"bufio"
	"bytes"
	"fmt"

	"github.com/mtxdb/mtxdb/pdu"
)

// longLine is what readLine keeps of a line over maxLineBytes: its length, its
// head and, when the line is a JSON object with a top-level "event_id" string (a
// PDU of room versions 1 and 2), that event ID.
type longLine struct {
	bytes   int
	head    []byte // the first lineHeadBytes bytes
	eventID string
}

// lineHeadBytes is how much of an over-long line readLine keeps: enough to read
// the first member name of the object it opens.
const lineHeadBytes = 256

// readLine reads the next line (up to and including '\n'). A line over
// maxLineBytes is read to its end and dropped: line is then nil and long says
// what was seen of it. err is io.EOF at the end of the input (with the last line,
// if any) or the read error.
func readLine(br *bufio.Reader) (line []byte, long *longLine, err error) {
	var b []byte
	var ids *idScanner
	n := 0
	for {
		chunk, err := br.ReadSlice('\n')
		n += len(chunk)
		switch {
		case n <= maxLineBytes:
			b = append(b, chunk...)
		case ids == nil: // the line has just gone over: scan what was read of it
			ids = &idScanner{}
			ids.feed(b)
			ids.feed(chunk)
			b = append(b, chunk[:min(len(chunk), lineHeadBytes)]...)
			b = b[:min(len(b), lineHeadBytes):min(len(b), lineHeadBytes)]
		default:
			ids.feed(chunk)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if ids != nil {
			return nil, &longLine{bytes: n, head: b, eventID: ids.eventID}, err
		}
		return b, nil, err
	}
}

// err is the refusal of the line: ErrTooLarge, saying whether the line opens a
// PDU (its first member name is a PDU field) or a JSON object wrapping an array
// of events under its first member name, with the command that takes them out.
func (l *longLine) err() error {
	err := fmt.Errorf("%w: a line of %d bytes, over the %d bytes a line may hold (not read whole)", pdu.ErrTooLarge, l.bytes, maxLineBytes)
	key, isArray := firstMemberOfHead(l.head)
	switch {
	case pduFields[key]:
		return fmt.Errorf("%w; its first member, %q, is a PDU field: a PDU over the size limit", err, key)
	case key != "" && isArray:
		return fmt.Errorf("%w; it opens a JSON object holding an array under %q, not a PDU: import the array itself (jq -c '.%s[]' gives its PDUs as lines)", err, key, key)
	}
	return err
}

// pduFields are the top-level fields of a PDU (Matrix spec v1.19, Server-Server
// API, "PDUs"): an object opening with one of them is taken for a PDU, whatever
// its value. Canonical JSON sorts "auth_events" first, and its value is an array,
// as a wrapper's is.
var pduFields = map[string]bool{
	"auth_events": true, "prev_events": true, "content": true, "depth": true,
	"event_id": true, "hashes": true, "origin": true, "origin_server_ts": true,
	"room_id": true, "sender": true, "signatures": true, "state_key": true,
	"type": true, "unsigned": true, "redacts": true,
}

// firstMemberOfHead returns the name of the first member of the JSON object head,
// the start of a line, opens, and whether its value opens an array ({"chunk": [
// ...); "" when head opens no object or the name is not whole in it.
func firstMemberOfHead(head []byte) (key string, isArray bool) {
	h := bytes.TrimLeft(head, " \t\r\n")
	if !bytes.HasPrefix(h, []byte("{")) {
		return "", false
	}
	h = bytes.TrimLeft(h[1:], " \t\r\n")
	if !bytes.HasPrefix(h, []byte(`"`)) {
		return "", false
	}
	end := bytes.IndexByte(h[1:], '"')
	if end < 0 {
		return "", false
	}
	key = string(h[1 : 1+end])
	rest := bytes.TrimLeft(h[2+end:], " \t\r\n")
	if !bytes.HasPrefix(rest, []byte(":")) {
		return "", false
	}
	return key, bytes.HasPrefix(bytes.TrimLeft(rest[1:], " \t\r\n"), []byte("["))
}

// idScanner finds the string value of the top-level member "event_id" of a JSON
// object fed to it in pieces, holding no more than that value: an over-long PDU
// of room versions 1 and 2 is refused under its event ID, so that the refusals of
// the events naming it follow from it. It does not validate the JSON; a name or
// value with an escape is not matched; a value is kept up to pdu.MaxFieldBytes.
type idScanner struct {
	depth    int  // objects and arrays open
	inString bool // inside a string
	escape   bool // the byte before was a backslash inside a string
	wantName bool // at depth 1, the next string is a member name
	inName   bool // reading a depth-1 member name into name
	name     []byte
	inID     bool // reading the value of "event_id" into id
	id       []byte
	eventID  string // the first "event_id" read whole
}

func (s *idScanner) feed(p []byte) {
	for _, c := range p {
		if s.inString {
			s.string(c)
			continue
		}
		switch c {
		case '"':
			s.inString = true
			switch {
			case s.depth == 1 && s.wantName:
				s.inName, s.wantName, s.name = true, false, s.name[:0]
			case s.depth == 1 && string(s.name) == "event_id" && s.eventID == "":
				s.inID, s.id = true, s.id[:0]
			}
		case '{', '[':
			s.depth++
			s.wantName = s.depth == 1 && c == '{'
		case '}', ']':
			s.depth--
		case ',':
			s.wantName = s.depth == 1
		}
	}
}

// string takes c, a byte inside a string.
func (s *idScanner) string(c byte) {
	switch {
	case s.escape:
		s.escape = false
	case c == '\\':
		s.escape = true
		s.inID = false                    // an escaped event ID is not matched
		s.name = append(s.name[:0], '\\') // nor an escaped name
	case c == '"':
		s.inString, s.inName = false, false
		if s.inID {
			s.inID, s.eventID = false, string(s.id)
		}
	case s.inName && len(s.name) <= len("event_id"):
		s.name = append(s.name, c)
	case s.inID:
		if len(s.id) == pdu.MaxFieldBytes {
			s.inID = false
		} else {
			s.id = append(s.id, c)
		}
	}
}
