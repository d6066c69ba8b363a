package pdu

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

// TestParseDeclaredEventID: every top-level event_id of a v3+ PDU must be its
// reference hash (a repeated key is checked each time, and one that is not a
// string is malformed); v1 PDUs must name themselves. The PDU is room001's
// m.room.create (testrooms/real/room001, room version 10).
func TestParseDeclaredEventID(t *testing.T) {
	f, err := os.Open("../testrooms/real/room001/events.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, MaxPDUBytes*4)
	if !sc.Scan() {
		t.Fatal("room001 has no events")
	}
	line := sc.Text()
	const id = "$4bUIsZ8qauc8y4KPSNNyS9FmPZ7pI8ueD4KhxXQLZyM"
	if !strings.Contains(line, `"event_id":"`+id+`"`) {
		t.Fatalf("room001's first event is not %s: %.100s", id, line)
	}
	without := strings.Replace(line, `"event_id":"`+id+`",`, "", 1)
	for _, c := range []struct {
		name    string
		version string
		raw     string
		want    error
	}{
		{"declared", "10", line, nil},
		{"not declared", "10", without, nil},
		{"wrong", "10", strings.Replace(line, id, "$wrong", 1), ErrEventIDMismatch},
		// The key twice in one object: refused before any decoder picks one.
		{"right then wrong", "10", strings.Replace(line, `{`, `{"event_id":"$wrong",`, 1), ErrMalformedPDU},
		{"escaped key, wrong", "10", strings.Replace(without, `{`, `{"event\u005fid":"$wrong",`, 1), ErrEventIDMismatch},
		// gomatrixserverlib's decoder matches keys in any case and takes such
		// a key for the event ID; Parse computes the reference hash.
		{"case-variant key", "10", strings.Replace(without, `{`, `{"event_iD":"$forged",`, 1), nil},
		{"not a string", "10", strings.Replace(without, `{`, `{"event_id":7,`, 1), ErrMalformedPDU},
		{"v1 without event_id", "1", strings.Replace(without, `"room_version":"10"`, `"room_version":"1"`, 1), ErrMalformedPDU},
	} {
		pd, err := Parse(gomatrixserverlib.RoomVersion(c.version), []byte(c.raw))
		switch {
		case c.want == nil && (err != nil || pd.EventID() != id):
			t.Errorf("%s: %v", c.name, err)
		case c.want != nil && !errors.Is(err, c.want):
			t.Errorf("%s: error %v, want %v", c.name, err, c.want)
		}
	}
}

// readHeaderJSON is ReadHeader by encoding/json: the reference FuzzReadHeader
// compares it with.
func readHeaderJSON(raw []byte) (Header, error) {
	var h Header
	if err := json.Unmarshal(raw, &h); err != nil {
		return h, err
	}
	if h.Type == "" {
		return h, errors.New("no type")
	}
	return h, nil
}

// FuzzReadHeader: ReadHeader agrees with encoding/json on whether a PDU has a
// header and on its fields, for input that is valid UTF-8 and names the fields
// in their own case (encoding/json also matches "Type" to type; ReadHeader
// does not).
func FuzzReadHeader(f *testing.F) {
	for _, s := range []string{
		`{"type":"m.room.member","state_key":"@a:b","room_id":"!r:b","sender":"@a:b","content":{"membership":"join"}}`,
		`{"type":"t","state_key":null,"event_id":"$e","content":null}`,
		`{"type":"t","type":"u","sender":"@\u0061:b"}`,
		`{"type":5}`, `["type"]`, `{"type":"t","state_key":7}`, `{"type":"t"`, `{}`, `{"type":"t","content":[1,2]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !utf8.Valid(raw) || caseVariantKey(raw, "room_id", "type", "state_key", "event_id", "content", "sender") {
			return
		}
		got, err := ReadHeader(raw)
		want, werr := readHeaderJSON(raw)
		if (err == nil) != (werr == nil) {
			t.Fatalf("%q: ReadHeader error %v, encoding/json %v", raw, err, werr)
		}
		if err != nil {
			if !errors.Is(err, ErrMalformedPDU) {
				t.Fatalf("%q: %v is not ErrMalformedPDU", raw, err)
			}
			return
		}
		sk := func(h Header) string {
			if h.StateKey == nil {
				return "<nil>"
			}
			return "=" + *h.StateKey
		}
		if got.RoomID != want.RoomID || got.Type != want.Type || got.EventID != want.EventID || got.Sender != want.Sender ||
			sk(got) != sk(want) || !bytes.Equal(bytes.TrimSpace(got.Content), bytes.TrimSpace(want.Content)) {
			t.Fatalf("%q:\n ReadHeader %+v %s\n json       %+v %s", raw, got, sk(got), want, sk(want))
		}
	})
}

// caseVariantKey reports whether a top-level key of raw matches one of keys
// only case-insensitively.
func caseVariantKey(raw []byte, keys ...string) bool {
	found := false
	gjson.ParseBytes(raw).ForEach(func(k, _ gjson.Result) bool {
		for _, f := range keys {
			if strings.EqualFold(k.String(), f) && k.String() != f {
				found = true
			}
		}
		return !found
	})
	return found
}

// roomEvents returns the PDU lines and room version of every room directory
// under testrooms/real (events.jsonl and meta.json's room_version).
func roomEvents(t testing.TB) map[string][][]byte {
	dirs, err := filepath.Glob("../testrooms/real/*/events.jsonl")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no rooms under testrooms/real: %v", err)
	}
	out := map[string][][]byte{}
	for _, p := range dirs {
		meta, err := os.ReadFile(filepath.Join(filepath.Dir(p), "meta.json"))
		if err != nil {
			t.Fatal(err)
		}
		v := gjson.GetBytes(meta, "room_version").String()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range bytes.Split(b, []byte("\n")) {
			if len(bytes.TrimSpace(line)) > 0 {
				out[v] = append(out[v], line)
			}
		}
	}
	return out
}

// gomatrixserverlibEventID is the event ID gomatrixserverlib computes itself
// for raw ("" when it refuses or panics).
func gomatrixserverlibEventID(version string, raw []byte) (id string) {
	defer func() {
		if recover() != nil {
			id = ""
		}
	}()
	pd, err := gomatrixserverlib.MustGetRoomVersion(gomatrixserverlib.RoomVersion(version)).NewEventFromUntrustedJSON(raw)
	if err != nil {
		return ""
	}
	return pd.EventID()
}

// TestReferenceHashMatchesGomatrixserverlib: Parse's event ID is the one
// gomatrixserverlib computes (and Parse's and ParseTrusted's room ID and
// membership gomatrixserverlib's), for every event of the 190 real rooms (room
// versions 1, 5, 6, 9, 10, 11) and for each of them redacted, in every room
// version of the same event format.
func TestReferenceHashMatchesGomatrixserverlib(t *testing.T) {
	n := 0
	for version, lines := range roomEvents(t) {
		for _, raw := range lines {
			pd, err := Parse(gomatrixserverlib.RoomVersion(version), raw)
			if err != nil {
				t.Fatalf("room version %s: %v\n%s", version, err, raw)
			}
			if want := gomatrixserverlibEventID(version, raw); pd.EventID() != want {
				t.Fatalf("room version %s: event ID %s, gomatrixserverlib %s\n%s", version, pd.EventID(), want, raw)
			}
			sameAccessors(t, version, pd, raw)
			tr, err := ParseTrusted(gomatrixserverlib.RoomVersion(version), pd.EventID(), raw)
			if err != nil {
				t.Fatalf("room version %s: ParseTrusted: %v\n%s", version, err, raw)
			}
			sameAccessors(t, version, tr, raw)
			n++
			if version == "1" {
				continue
			}
			for _, other := range []string{"3", "4", "5", "6", "7", "8", "9", "10", "11"} {
				verImpl := gomatrixserverlib.MustGetRoomVersion(gomatrixserverlib.RoomVersion(other))
				red, err := verImpl.RedactEventJSON(pd.JSON())
				if err != nil {
					t.Fatal(err)
				}
				pd2, err := Parse(gomatrixserverlib.RoomVersion(other), red)
				if want := gomatrixserverlibEventID(other, red); (err == nil) != (want != "") || (err == nil && pd2.EventID() != want) {
					t.Fatalf("room version %s, redacted: %v %v, gomatrixserverlib %q\n%s", other, pd2, err, want, red)
				}
				n++
			}
		}
	}
	t.Logf("%d event IDs", n)
}

// FuzzReferenceHash: for any JSON gomatrixserverlib accepts as a v4 or v11
// event, Parse gives the event ID gomatrixserverlib computes, and its room ID
// and membership.
func FuzzReferenceHash(f *testing.F) {
	for _, lines := range roomEvents(f) {
		for _, raw := range lines[:min(3, len(lines))] {
			f.Add(raw, true)
			f.Add(raw, false)
		}
	}
	f.Fuzz(func(t *testing.T, raw []byte, v11 bool) {
		version := "4"
		if v11 {
			version = "11"
		}
		want := gomatrixserverlibEventID(version, raw)
		if want == "" || caseVariantKey(raw, "event_id", "type", "state_key", "content", "room_id", "sender", "hashes", "signatures",
			"depth", "prev_events", "auth_events", "origin", "origin_server_ts", "membership", "prev_state", "unsigned", "redacts") {
			return // gomatrixserverlib decodes keys in any case: "event_iD" is its event ID
		}
		pd, err := Parse(gomatrixserverlib.RoomVersion(version), raw)
		if err != nil {
			if errors.Is(err, ErrEventIDMismatch) || (errors.Is(err, ErrMalformedPDU) && !strings.Contains(err.Error(), "malformed PDU: reference hash")) {
				return // an event_id field, or what Parse checks beyond gomatrixserverlib
			}
			t.Fatalf("%v\n%s", err, raw)
		}
		if pd.EventID() != want {
			t.Fatalf("event ID %s, gomatrixserverlib %s\n%s", pd.EventID(), want, raw)
		}
		sameAccessors(t, version, pd, raw)
	})
}

// sameAccessors fails t unless the room ID and membership of pd, which Parse
// or ParseTrusted returned for raw, are gomatrixserverlib's own PDU's.
func sameAccessors(t testing.TB, version string, pd gomatrixserverlib.PDU, raw []byte) {
	t.Helper()
	gp, err := gomatrixserverlib.MustGetRoomVersion(gomatrixserverlib.RoomVersion(version)).NewEventFromUntrustedJSON(raw)
	if err != nil {
		t.Fatalf("gomatrixserverlib refuses what Parse took: %v\n%s", err, raw)
	}
	if pd.RoomID().String() != gp.RoomID().String() {
		t.Fatalf("room ID %s, gomatrixserverlib %s\n%s", pd.RoomID().String(), gp.RoomID().String(), raw)
	}
	m, merr := pd.Membership()
	gm, gerr := gp.Membership()
	if m != gm || (merr == nil) != (gerr == nil) {
		t.Fatalf("membership %q (%v), gomatrixserverlib %q (%v)\n%s", m, merr, gm, gerr, raw)
	}
}

// TestParseRequiresEdgeLists: a v1-format PDU (room003, room version 1) whose
// auth_events is null or absent, or whose prev_events is null, is
// ErrMalformedPDU (gomatrixserverlib's v1 decoder takes either as an empty
// list; its v3+ decoder refuses them itself); the line as it is parses.
func TestParseRequiresEdgeLists(t *testing.T) {
	b, err := os.ReadFile("../testrooms/real/room003/events.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	line := []byte(strings.Split(string(b), "\n")[5])
	if _, err := Parse("1", line); err != nil {
		t.Fatalf("line as it is: %v", err)
	}
	null, _ := sjson.SetRawBytes(slices.Clone(line), "auth_events", []byte("null"))
	absent, _ := sjson.DeleteBytes(slices.Clone(line), "auth_events")
	prevNull, _ := sjson.SetRawBytes(slices.Clone(line), "prev_events", []byte("null"))
	for name, raw := range map[string][]byte{"auth_events null": null, "auth_events absent": absent, "prev_events null": prevNull} {
		if !gjson.ValidBytes(raw) {
			t.Fatalf("%s: not JSON", name)
		}
		if _, err := Parse("1", raw); !errors.Is(err, ErrMalformedPDU) || !strings.Contains(err.Error(), "not an array") {
			t.Errorf("%s: error %v, want ErrMalformedPDU naming the list", name, err)
		}
	}
}

// TestCreateRoomVersion: content.room_version absent is "1"; a string names the
// version (an unknown one is ErrUnknownRoomVersion); null or another type is
// ErrMalformedPDU, not "1".
func TestCreateRoomVersion(t *testing.T) {
	for _, c := range []struct {
		content string
		want    gomatrixserverlib.RoomVersion
		err     error
	}{
		{``, "1", nil},
		{`{}`, "1", nil},
		{`{"room_version":"10"}`, "10", nil},
		{`{"room_version":"99"}`, "", ErrUnknownRoomVersion},
		{`{"room_version":null}`, "", ErrMalformedPDU},
		{`{"room_version":10}`, "", ErrMalformedPDU},
		{`{"room_version":["10"]}`, "", ErrMalformedPDU},
		{`[]`, "", ErrMalformedPDU},
	} {
		got, err := CreateRoomVersion(Header{Content: []byte(c.content)})
		if got != c.want || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("content %s: %q, %v; want %q, %v", c.content, got, err, c.want, c.err)
		}
	}
}

// TestCheckUnicode: JSON that is not UTF-8, or escapes a lone UTF-16
// surrogate, is refused before any decoder stores U+FFFD in its place; valid
// escapes, pairs and escaped backslashes are not.
func TestCheckUnicode(t *testing.T) {
	for _, c := range []struct {
		raw string
		ok  bool
	}{
		{`{"a":"x"}`, true},
		{`{"a":"é \u00e9 \ud83d\ude00 \uD83D\uDE00"}`, true},
		{`{"a":"\\ud800"}`, true}, // an escaped backslash, then "ud800"
		{`{"a":"\"\ud800"}`, false},
		{`{"a":"x\ud800y"}`, false},
		{`{"a":"x\udc00y"}`, false},
		{`{"a":"\ud800\u0041"}`, false},
		{`{"a":"\ud800`, false},
		{"{\"a\":\"x\xffy\"}", false},
		{"{\"x\xfe\":1}", false},
	} {
		err := checkUnicode([]byte(c.raw))
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrMalformedPDU)) {
			t.Errorf("checkUnicode(%q) = %v, want ok %v", c.raw, err, c.ok)
		}
	}
}

// TestParseRefusesInvalidUnicode: Parse refuses a real PDU with an invalid
// UTF-8 byte or a lone surrogate escape in a string, whatever its hashes say.
func TestParseRefusesInvalidUnicode(t *testing.T) {
	raw := []byte(`{"auth_events":[],"content":{"topic":"x"},"depth":1,"hashes":{"sha256":"AAAA"},"origin_server_ts":1,"prev_events":[],"room_id":"!r:x","sender":"@a:x","signatures":{},"state_key":"KEY","type":"m.room.topic"}`)
	for _, key := range []string{"x\xffy", `x\ud800y`} {
		_, err := Parse(gomatrixserverlib.RoomVersionV10, bytes.Replace(raw, []byte("KEY"), []byte(key), 1))
		if !errors.Is(err, ErrMalformedPDU) || !strings.Contains(err.Error(), "UTF") {
			t.Errorf("state_key %q: %v, want a malformed-PDU error naming UTF", key, err)
		}
	}
}

// TestParseRefusesRepeatedKeys: a key twice in one object, at the top or
// nested, is refused (the decoders keep different copies); the same key in
// different objects is not.
func TestParseRefusesRepeatedKeys(t *testing.T) {
	for _, c := range []struct {
		raw string
		dup bool
	}{
		{`{"a":1,"b":{"a":2},"c":[{"a":3},{"a":4}]}`, false},
		{`{"type":"x","a":1,"type":"y"}`, true},
		{`{"content":{"topic":"a","topic":"b"}}`, true},
		{`{"c":[{"k":1,"k":2}]}`, true},
		{`{"a\u0062":1,"ab":2}`, true},
	} {
		if _, dup := repeatedKey(gjson.Parse(c.raw), 0); dup != c.dup {
			t.Errorf("repeatedKey(%s) = %v, want %v", c.raw, dup, c.dup)
		}
	}
	raw := `{"auth_events":[],"content":{"topic":"x"},"depth":1,"hashes":{"sha256":"AAAA"},"origin_server_ts":1,"prev_events":[],"room_id":"!r:x","sender":"@a:x","signatures":{},"state_key":"","type":"m.room.name","type":"m.room.topic"}`
	if _, err := Parse(gomatrixserverlib.RoomVersionV10, []byte(raw)); !errors.Is(err, ErrMalformedPDU) || !strings.Contains(err.Error(), `"type" appears twice`) {
		t.Errorf("a repeated type: %v, want a malformed-PDU error naming it", err)
	}
}
