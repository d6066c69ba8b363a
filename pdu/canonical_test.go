package pdu

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/tidwall/sjson"
)

// variants are ways to change a canonical event's JSON, each of which
// parseCanonical must either see through to gomatrixserverlib's result or
// leave to it.
var variants = []struct {
	name string
	f    func([]byte) []byte
}{
	{"as is", func(b []byte) []byte { return b }},
	{"space", func(b []byte) []byte { return append([]byte(" "), b...) }},
	{"space inside", func(b []byte) []byte { return bytes.Replace(b, []byte(`":`), []byte(`": `), 1) }},
	{"unsorted", func(b []byte) []byte { return append([]byte(`{"zz":1,`), b[1:]...) }},
	{"repeated key", func(b []byte) []byte { return append([]byte(`{"auth_events":[],`), b[1:]...) }},
	{"headered", func(b []byte) []byte { return append([]byte(`{"_room_version":"10",`), b[1:]...) }},
	{"unsigned", func(b []byte) []byte { out, _ := sjson.SetBytes(b, "unsigned", map[string]int{"age": 5}); return out }},
	{"no event_id", func(b []byte) []byte { out, _ := sjson.DeleteBytes(b, "event_id"); return out }},
	{"age_ts first", func(b []byte) []byte { return append([]byte(`{"age_ts":1,`), b[1:]...) }},
	{"tampered", func(b []byte) []byte { out, _ := sjson.SetBytes(b, "content.zzz", "x"); return out }},
	{"no hashes", func(b []byte) []byte { out, _ := sjson.DeleteBytes(b, "hashes"); return out }},
	{"slash escape", func(b []byte) []byte { return bytes.Replace(b, []byte(`:"`), []byte(`:"\/`), 1) }},
	{"unicode escape", func(b []byte) []byte { return bytes.Replace(b, []byte(`:"`), []byte(`:"\u0041`), 1) }},
	{"control escape", func(b []byte) []byte { return bytes.Replace(b, []byte(`:"`), []byte(`:"\u000b\n`), 1) }},
	{"minus zero", func(b []byte) []byte { return bytes.Replace(b, []byte(`"depth":`), []byte(`"depth":-0,"deptha":`), 1) }},
	{"exponent", func(b []byte) []byte {
		return bytes.Replace(b, []byte(`"depth":`), []byte(`"depth":1e-05,"deptha":`), 1)
	}},
	{"fraction", func(b []byte) []byte { return bytes.Replace(b, []byte(`"depth":`), []byte(`"depth":1.5,"deptha":`), 1) }},
	{"big number", func(b []byte) []byte {
		return bytes.Replace(b, []byte(`"depth":`), []byte(`"depth":90071992547409910,"deptha":`), 1)
	}},
	{"truncated", func(b []byte) []byte { return b[:len(b)-1] }},
	{"trailing", func(b []byte) []byte { return append(append([]byte(nil), b...), '1') }},
	{"long sender", func(b []byte) []byte {
		out, _ := sjson.SetBytes(b, "sender", "@"+strings.Repeat("a", 300)+":x")
		return out
	}},
	{"null prev_events", func(b []byte) []byte { out, _ := sjson.SetRawBytes(b, "prev_events", []byte("null")); return out }},
}

// TestParseCanonical: parseCanonical gives the PDU NewEventFromUntrustedJSON
// gives, for every v3+ room version, on the events of ../testrooms/real and
// variants of them, and leaves to it what it cannot vouch for; and it parses
// the plain events itself (isCanonical without escapes to fear), most of
// those rooms.
func TestParseCanonical(t *testing.T) {
	files, _ := filepath.Glob("../testrooms/real/room0[0-4]*/events.jsonl")
	if len(files) == 0 {
		t.Fatal("no rooms in ../testrooms/real")
	}
	var events []string
	for _, f := range files {
		events = append(events, readLines(t, f)...)
	}
	for _, v := range gomatrixserverlib.RoomVersions() {
		if v.EventFormat() == gomatrixserverlib.EventFormatV1 {
			continue
		}
		fast, tried := 0, 0
		for i, ev := range events {
			for _, vr := range variants {
				if vr.name != "as is" && i%7 != 0 {
					continue
				}
				raw := vr.f([]byte(ev))
				if !strings.Contains("tampered no hashes truncated trailing", vr.name) {
					raw = rehash(raw)
				}
				name := fmt.Sprintf("version %s, event %d, %s", v.Version(), i, vr.name)
				if vr.name == "as is" {
					tried++
				}
				if checkParseCanonical(t, v, raw, name) && vr.name == "as is" {
					fast++
				}
			}
		}
		if fast < tried/2 {
			t.Errorf("version %s: parseCanonical parsed %d of %d events, want half", v.Version(), fast, tried)
		}
	}
}

// checkParseCanonical compares parseCanonical with NewEventFromUntrustedJSON
// on raw and reports whether parseCanonical parsed it.
func checkParseCanonical(t *testing.T, v gomatrixserverlib.IRoomVersion, raw []byte, name string) bool {
	t.Helper()
	var slow gomatrixserverlib.PDU
	var serr error
	func() {
		defer func() {
			if r := recover(); r != nil {
				serr = fmt.Errorf("panic: %v", r)
			}
		}()
		slow, serr = v.NewEventFromUntrustedJSON(bytes.Clone(raw))
	}()
	in := bytes.Clone(raw)
	got, ok := parseCanonical(v, in)
	if !bytes.Equal(in, raw) {
		t.Fatalf("%s: parseCanonical changed its input", name)
	}
	if !ok {
		return false
	}
	if serr != nil {
		t.Fatalf("%s: parseCanonical parsed %s, NewEventFromUntrustedJSON says %v", name, raw, serr)
	}
	if !reflect.DeepEqual(got, slow) {
		t.Fatalf("%s: parseCanonical gives\n%s\nNewEventFromUntrustedJSON\n%s", name, got.JSON(), slow.JSON())
	}
	if strings.Contains(name, "tampered") || strings.Contains(name, "no hashes") {
		t.Fatalf("%s: parsed an event whose content hash does not match", name)
	}
	return true
}

// rehash sets the content hash of the event JSON b to the one
// gomatrixserverlib computes, so that a variant is refused or parsed for
// itself and not for its hash; JSON gomatrixserverlib cannot edit is
// returned as it is.
func rehash(b []byte) []byte {
	h := bytes.Clone(b)
	for _, key := range []string{"outlier", "destinations", "age_ts", "unsigned", "event_id", "signatures", "hashes"} {
		var err error
		if h, err = sjson.DeleteBytes(h, key); err != nil {
			return b
		}
	}
	sum := sha256.Sum256(gomatrixserverlib.CanonicalJSONAssumeValid(h))
	out, err := sjson.SetBytes(b, "hashes.sha256", base64.RawStdEncoding.EncodeToString(sum[:]))
	if err != nil {
		return b
	}
	return out
}

// TestIsCanonical: isCanonical is true exactly where CanonicalJSONAssumeValid
// changes nothing, on JSON it accepts, and false on JSON that is not valid.
func TestIsCanonical(t *testing.T) {
	for _, c := range []struct {
		in   string
		want bool
		ints bool // isCanonical with ints true: the same, but false for numbers CheckCanonicalJSON refuses
	}{
		{`{}`, true, true},
		{`{"a":[],"b":{},"c":[1,-2,0.5,"x",true,false,null,{"d":"\"\\\b\f\n\r\t\u0000\u001f\u000b"}]}`, true, false},
		{`{"a":[],"b":{},"c":[1,-2,5,"0.5",true,false,null,{"d":"\"\\\b\f\n\r\t\u0000\u001f\u000b"}]}`, true, true},
		{`{"a":9007199254740991,"b":-900719925474099,"c":0}`, true, true},
		{`{"a":9007199254740992}`, true, false},
		{`{"a":10000000000000000}`, true, false},
		{`{"a":-9007199254740991}`, true, false},
		{`{"a":0.0}`, true, false},
		{`{"a":1,"a":2}`, false, false},
		{`{"b":1,"a":2}`, false, false},
		{`{"a":"\u0041"}`, false, false},
		{`{"a":"\u000a"}`, false, false},
		{`{"a":"\u001F"}`, false, false},
		{`{"a":"\/"}`, false, false},
		{`{"a":-0}`, false, false},
		{`{"a":-0.5}`, false, false},
		{`{"a":1e5}`, false, false},
		{`{"a":01}`, false, false},
		{`{"a":1 }`, false, false},
		{`{"a":1}x`, false, false},
		{`{"a":1`, false, false},
		{`{"a":"x`, false, false},
		{`{"a":"x\`, false, false},
		{`{"a":"x\u00`, false, false},
		{`{"a":tru}`, false, false},
		{`{"a":truex}`, false, false},
		{`{"a":[1,]}`, false, false},
		{`{"a":1,}`, false, false},
		{`{"é":1}`, false, false},
		{`{"a\"b":1}`, false, false},
		{`{"a":"é\u0001"}`, true, true},
		{"{\"a\":\"\x01\"}", false, false},
		{`[1]`, false, false},
		{`{"a":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, false, false},
	} {
		if got := isCanonical([]byte(c.in), false); got != c.want {
			t.Errorf("isCanonical(%s, false) = %v, want %v", c.in, got, c.want)
		}
		if got := isCanonical([]byte(c.in), true); got != (c.want && c.ints) {
			t.Errorf("isCanonical(%s, true) = %v, want %v", c.in, got, c.want && c.ints)
		}
		if c.ints && gomatrixserverlib.MustGetRoomVersion(gomatrixserverlib.RoomVersionV12).CheckCanonicalJSON([]byte(c.in)) != nil {
			t.Errorf("CheckCanonicalJSON refuses %s", c.in)
		}
		if c.want {
			if out := gomatrixserverlib.CanonicalJSONAssumeValid([]byte(c.in)); !bytes.Equal(out, []byte(c.in)) {
				t.Errorf("%s canonicalises to %s", c.in, out)
			}
		}
	}
}

// FuzzIsCanonical: whatever isCanonical accepts is JSON that
// CanonicalJSONAssumeValid leaves unchanged, and with ints JSON that
// CheckCanonicalJSON accepts.
func FuzzIsCanonical(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":[1,"x\n",{"b":null}]}`, `{"a":-1.5}`, `{"a":"\u0001"}`, `{"a":9007199254740991}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !isCanonical(b, false) {
			return
		}
		if isCanonical(b, true) && gomatrixserverlib.MustGetRoomVersion(gomatrixserverlib.RoomVersionV12).CheckCanonicalJSON(b) != nil {
			t.Fatalf("isCanonical(%q, true), but CheckCanonicalJSON refuses it", b)
		}
		if out := gomatrixserverlib.CanonicalJSONAssumeValid(b); !bytes.Equal(out, b) {
			t.Fatalf("isCanonical(%q), but it canonicalises to %q", b, out)
		}
	})
}
