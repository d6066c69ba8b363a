package pdu

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestCheckSize: a PDU is measured as canonical JSON only past the limit;
// white space and escapes the canonical form drops do not count, and deep
// nesting over the limit is refused as too large from its compact form (the
// canonical encoder's cost grows with the square of the depth).
func TestCheckSize(t *testing.T) {
	pad := func(n int) string { return strings.Repeat("a", n) }
	for _, c := range []struct {
		name    string
		raw     []byte
		tooBig  bool
		errPart string
	}{
		{name: "small", raw: []byte(`{"a":"` + pad(100) + `"}`)},
		{name: "spaces over, canonical under", raw: []byte(`{"a":` + strings.Repeat(" ", MaxPDUBytes) + `"b"}`)},
		{name: "escapes over, canonical under", raw: []byte(`{"a":"` + strings.Repeat(`\u0061`, MaxPDUBytes/6+100) + `"}`)},
		{name: "flat over", raw: []byte(`{"a":"` + pad(MaxPDUBytes) + `"}`), tooBig: true, errPart: "canonical JSON"},
		{name: "escapes over, canonical over", raw: []byte(`{"a":"` + strings.Repeat(`\u00e9`, MaxPDUBytes/2+100) + `"}`), tooBig: true, errPart: "canonical JSON"},
		{name: "deep nesting over", raw: []byte(`{"a":` + strings.Repeat("[", 5000) + strings.Repeat(" ", MaxPDUBytes) + strings.Repeat("]", 5000) + `}`), tooBig: false},
		{name: "very deep nesting over", raw: append(append([]byte(`{"a":`), bytes.Repeat([]byte("["), 100_000)...), append(bytes.Repeat([]byte("]"), 100_000), '}')...), tooBig: true, errPart: "not valid JSON"},
		{name: "not JSON over", raw: []byte(`{"a":"` + pad(MaxPDUBytes)), tooBig: true, errPart: "not valid JSON"},
	} {
		err := CheckSize(c.raw)
		if c.tooBig != (err != nil) || (err != nil && (!errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), c.errPart))) {
			t.Errorf("%s (%d bytes): %v (too large expected: %v, containing %q)", c.name, len(c.raw), err, c.tooBig, c.errPart)
		}
	}
}
