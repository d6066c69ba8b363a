package pdu

import (
	"bytes"
	"crypto/sha256"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/tidwall/gjson"
)

// parseCanonical is gomatrixserverlib's NewEventFromUntrustedJSON for a v3+
// PDU whose JSON is canonical already and whose content hash matches, the
// usual case, without the steps that then change nothing: it drops the keys
// gomatrixserverlib drops (outlier, destinations, age_ts, unsigned, event_id)
// and checks the content hash in one pass over the top-level keys, in place
// of a rewrite of the JSON per key dropped and of canonicalising it again,
// and then decodes it as gomatrixserverlib does (NewEventFromTrustedJSON,
// then CheckFields). It reports false, and the caller takes
// NewEventFromUntrustedJSON, for every other PDU: a v1/v2 one, JSON that is
// not canonical (isCanonical; for a version whose CheckCanonicalJSON refuses
// numbers that are not integers of at most 53 bits, one with such a number,
// which is all that check refuses), a top-level key starting with "_" (a
// headered event), a content hash that does not match, and any error.
func parseCanonical(verImpl gomatrixserverlib.IRoomVersion, raw []byte) (gomatrixserverlib.PDU, bool) {
	if verImpl.EventFormat() == gomatrixserverlib.EventFormatV1 || !isCanonical(raw, enforcesIntegers(verImpl)) {
		return nil, false
	}
	stripped := make([]byte, 1, len(raw))
	stripped[0] = '{'
	var hashable []byte
	hash, ok := "", true
	gjson.ParseBytes(raw).ForEach(func(k, v gjson.Result) bool {
		name := k.Raw[1 : len(k.Raw)-1] // a plain key (isCanonical)
		switch {
		case name == "" || name[0] == '_':
			ok = false
			return false
		case name == "outlier" || name == "destinations" || name == "age_ts" || name == "unsigned" || name == "event_id":
			return true
		}
		stripped = appendEntry(stripped, k.Raw, v.Raw)
		switch name {
		case "hashes":
			h := v.Get("sha256")
			ok, hash = v.IsObject() && h.Type == gjson.String, h.Str
		case "signatures":
		default:
			if hashable == nil {
				hashable = make([]byte, 1, len(raw))
				hashable[0] = '{'
			}
			hashable = appendEntry(hashable, k.Raw, v.Raw)
		}
		return ok
	})
	if !ok || hash == "" {
		return nil, false
	}
	stripped = closeObject(stripped)
	if hashable == nil {
		hashable = []byte{'{'}
	}
	hashable = closeObject(hashable)
	var want spec.Base64Bytes
	if err := want.Decode(hash); err != nil {
		return nil, false
	}
	if sum := sha256.Sum256(hashable); !bytes.Equal(sum[:], want) {
		return nil, false
	}
	pd, err := verImpl.NewEventFromTrustedJSON(stripped, false)
	if err != nil || gomatrixserverlib.CheckFields(pd) != nil {
		return nil, false
	}
	return pd, true
}

// appendEntry appends "key":value to the object begun in obj, after a comma
// unless it is the first.
func appendEntry(obj []byte, key, value string) []byte {
	if len(obj) > 1 {
		obj = append(obj, ',')
	}
	obj = append(obj, key...)
	obj = append(obj, ':')
	return append(obj, value...)
}

func closeObject(obj []byte) []byte { return append(obj, '}') }

// enforcesIntegers reports whether the room version's CheckCanonicalJSON
// refuses numbers other than integers of at most 53 bits (room version 6 on;
// gomatrixserverlib's other versions check nothing).
func enforcesIntegers(verImpl gomatrixserverlib.IRoomVersion) bool {
	return verImpl.CheckCanonicalJSON([]byte(`{"a":0.5}`)) != nil
}

// isCanonical reports whether b is one JSON object that gomatrixserverlib's
// CanonicalJSONAssumeValid leaves unchanged, and which canonicalJSON
// checks strictly: no white space; object keys in strictly increasing byte
// order (none repeated), each made of printable ASCII without escapes;
// strings whose escapes are the ones CompactJSON writes (\" \\ \b \f \n \r
// \t, and \u00xx in lower-case hex for the other control characters) and
// without raw control characters; numbers without a minus before a 0
// (CompactJSON drops it) and without an exponent, and with ints only
// integers from -(2^53)+1 to 2^53-1 without a fraction; and nothing after
// the object. Anything else, valid JSON or not, is false.
func isCanonical(b []byte, ints bool) bool {
	if len(b) == 0 || b[0] != '{' {
		return false
	}
	sc := canonicalScan{b: b, ints: ints}
	end, ok := sc.value(0, 0)
	return ok && end == len(b)
}

// canonicalScan is isCanonical's pass over b.
type canonicalScan struct {
	b    []byte
	ints bool // numbers must be integers of at most 53 bits
}

// maxCanonicalDepth bounds the nesting isCanonical follows (deeper: false).
const maxCanonicalDepth = 64

// value checks the value at b[i:] and returns the index after it.
func (sc *canonicalScan) value(i, depth int) (int, bool) {
	b := sc.b
	if i >= len(b) || depth > maxCanonicalDepth {
		return i, false
	}
	switch c := b[i]; {
	case c == '{':
		return sc.object(i+1, depth+1)
	case c == '[':
		return sc.array(i+1, depth+1)
	case c == '"':
		return sc.string(i + 1)
	case c == '-' || (c >= '0' && c <= '9'):
		return sc.number(i)
	}
	for _, lit := range []string{"true", "false", "null"} {
		if bytes.HasPrefix(b[i:], []byte(lit)) {
			return i + len(lit), true
		}
	}
	return i, false
}

// object checks an object's members after its '{' at b[i-1].
func (sc *canonicalScan) object(i, depth int) (int, bool) {
	b := sc.b
	if i < len(b) && b[i] == '}' {
		return i + 1, true
	}
	var prev []byte
	for n := 0; ; n++ {
		if i >= len(b) || b[i] != '"' {
			return i, false
		}
		start := i + 1
		for i = start; i < len(b) && b[i] != '"'; i++ {
			if b[i] < 0x20 || b[i] > 0x7e || b[i] == '\\' {
				return i, false
			}
		}
		if i+1 >= len(b) || b[i+1] != ':' {
			return i, false
		}
		key := b[start:i]
		if n > 0 && bytes.Compare(prev, key) >= 0 {
			return i, false
		}
		prev = key
		var ok bool
		if i, ok = sc.value(i+2, depth); !ok || i >= len(b) {
			return i, false
		}
		switch b[i] {
		case ',':
			i++
		case '}':
			return i + 1, true
		default:
			return i, false
		}
	}
}

// array checks an array's elements after its '[' at b[i-1].
func (sc *canonicalScan) array(i, depth int) (int, bool) {
	b := sc.b
	if i < len(b) && b[i] == ']' {
		return i + 1, true
	}
	for {
		var ok bool
		if i, ok = sc.value(i, depth); !ok || i >= len(b) {
			return i, false
		}
		switch b[i] {
		case ',':
			i++
		case ']':
			return i + 1, true
		default:
			return i, false
		}
	}
}

// string checks a string's characters after its '"' at b[i-1].
func (sc *canonicalScan) string(i int) (int, bool) {
	b := sc.b
	const hex = "0123456789abcdef"
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			return i + 1, true
		case c < 0x20:
			return i, false
		case c != '\\':
			i++
			continue
		}
		if i+1 >= len(b) {
			return i, false
		}
		switch b[i+1] {
		case '"', '\\', 'b', 'f', 'n', 'r', 't':
			i += 2
			continue
		case 'u':
		default:
			return i, false
		}
		// \u00xx: a control character without a short escape.
		if i+5 >= len(b) || b[i+2] != '0' || b[i+3] != '0' || (b[i+4] != '0' && b[i+4] != '1') {
			return i, false
		}
		x := bytes.IndexByte([]byte(hex), b[i+5])
		if x < 0 {
			return i, false
		}
		switch c := (b[i+4]-'0')<<4 | byte(x); c {
		case '\b', '\t', '\n', '\f', '\r':
			return i, false
		}
		i += 6
	}
	return i, false
}

// number checks a JSON number at b[i:]: no minus before a 0, no
// exponent, and with ints an integer of at most 53 bits.
func (sc *canonicalScan) number(i int) (int, bool) {
	b := sc.b
	start := i
	if b[i] == '-' {
		i++
		if i >= len(b) || b[i] < '1' || b[i] > '9' {
			return i, false
		}
	}
	digits := func() int {
		n := 0
		for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			n++
		}
		return n
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else if digits() == 0 {
		return i, false
	}
	if sc.ints && (i-start > 16 || (i-start == 16 && string(b[start:i]) > "9007199254740991")) {
		return i, false // over 2^53-1; a minus counts as a digit, and "-" < "9"
	}
	if i < len(b) && b[i] == '.' {
		if sc.ints {
			return i, false
		}
		i++
		if digits() == 0 {
			return i, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		return i, false // CompactJSON drops the minus of an exponent like e-05
	}
	return i, i > start
}
