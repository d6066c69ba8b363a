package pdu

import (
	"bufio"
	"os"
	"path/filepath"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
)

// refHashCases are events on which canonicalRedacted either takes
// gomatrixserverlib's redaction's bytes exactly or gives up: every content
// rule of every algorithm, keys encoding/json matches in any case, repeated
// keys, escapes, numbers a float64 changes, null values and content that is
// not an object.
var refHashCases = []string{
	`{"type":"m.room.message","content":{"body":"hi \"there\"\n","msgtype":"m.text"},"room_id":"!r:x","sender":"@a:x","depth":3,"hashes":{"sha256":"abc"},"signatures":{"x":{"ed25519:1":"sig"}},"prev_events":[],"auth_events":[],"origin_server_ts":1,"origin":"x","prev_state":[],"membership":"join","unsigned":{"age":1}}`,
	`{"type":"m.room.member","state_key":"@a:x","content":{"membership":"join","displayname":"A","join_authorised_via_users_server":"@b:x"},"room_id":"!r:x","sender":"@a:x","depth":3,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.create","state_key":"","content":{"creator":"@a:x","room_version":"10","m.federate":true,"additional_creators":["@b:x"],"n":{"z":1,"a":[1,2,{"k":null}]}},"sender":"@a:x","depth":1,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.join_rules","state_key":"","content":{"join_rule":"restricted","allow":[{"type":"m.room_membership","room_id":"!o:x"}],"other":1},"room_id":"!r:x","sender":"@a:x","depth":2,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.power_levels","state_key":"","content":{"ban":50,"events":{"m.room.name":50,"a":100},"events_default":0,"invite":0,"kick":50,"notifications":{"room":50},"redact":50,"state_default":50,"users":{"@a:x":100},"users_default":0},"room_id":"!r:x","sender":"@a:x","depth":2,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.aliases","state_key":"x","content":{"aliases":["#a:x"]},"room_id":"!r:x","sender":"@a:x","depth":2,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.history_visibility","state_key":"","content":{"history_visibility":"shared","x":1},"room_id":"!r:x","sender":"@a:x","depth":2,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.redaction","redacts":"$e","content":{"redacts":"$e","reason":"spam"},"room_id":"!r:x","sender":"@a:x","depth":2,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.create","state_key":"","content":{"room_version":"11","x":1.5},"sender":"@a:x","depth":1,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.create","state_key":"","content":{"room_version":"11","x":12345678901234567},"sender":"@a:x","depth":1,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.create","state_key":"","content":{"room_version":"11","x":"<&>\u2028 é"},"sender":"@a:x","depth":1,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.create","state_key":"","content":{"room_version":"11","x":"a\\b"},"sender":"@a:x","depth":1,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.create","state_key":"","content":{"room_version":"11","x":{"k":1,"k":2}},"sender":"@a:x","depth":1,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.member","state_key":"@a:x","content":{"membership":"join","membership":"leave"},"room_id":"!r:x","sender":"@a:x","depth":3,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.member","state_key":"@a:x","content":{"membership":"join"},"Sender":"@b:x","sender":"@a:x","depth":3,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.member","state_key":"@a:x","content":{"membership":"join"},"Sender":"@b:x","depth":3,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.member","state_key":"@a:x","content":{"membership":"join"},"ſender":"@b:x","depth":3,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.member","state_key":"@a:x","content":{"membership":"join"},"sender":"@a:x","sender":"@b:x","depth":3,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.member","state_key":null,"content":{"membership":"join"},"sender":"@a:x","depth":3,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.member","content":null,"sender":"@a:x","depth":3,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.member","content":"x","sender":"@a:x","depth":3,"prev_events":[],"auth_events":[]}`,
	`{"type":7,"content":{},"sender":"@a:x","depth":3,"prev_events":[],"auth_events":[]}`,
	`{"content":{},"sender":"@a:x","depth":3,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.message","content":{},"event_id":"$x","sender":"@a:x","depth":3,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.message","content":{},"sender":"@a:x","depth":-0,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.message","content":{},"sender":"@a\u00e9:x","depth":3,"prev_events":[],"auth_events":[]}`,
	`{"type":"m.room.power_levels","state_key":"","content":{"users":{"@a:x":-0,"@b:x":-5}},"sender":"@a:x","depth":3,"prev_events":[],"auth_events":[]}`,
}

// TestCanonicalRedacted: for every room version, canonicalReferenceHashID
// gives gomatrixserverlib's reference hash (referenceHashID) on the cases
// above and on every event of the rooms in ../testrooms, and canonicalRedacted
// takes the fast way for the plain ones (the messages and state events of the
// real rooms) instead of giving up on all.
func TestCanonicalRedacted(t *testing.T) {
	events := append([]string(nil), refHashCases...)
	files, _ := filepath.Glob("../testrooms/*/*/events.jsonl")
	if len(files) == 0 {
		t.Fatal("no rooms in ../testrooms")
	}
	for _, f := range files {
		events = append(events, readLines(t, f)...)
	}
	for _, v := range gomatrixserverlib.RoomVersions() {
		verImpl := v
		fast := 0
		for _, ev := range events {
			canon, err := gomatrixserverlib.CanonicalJSON([]byte(ev))
			if err != nil {
				continue
			}
			want, werr := referenceHashID(verImpl, canon)
			got, gerr := canonicalReferenceHashID(verImpl, canon)
			if got != want || (werr == nil) != (gerr == nil) {
				t.Fatalf("room version %s: %s\ngot %q (%v), want %q (%v)", v.Version(), canon, got, gerr, want, werr)
			}
			if _, ok := canonicalRedacted(v.Version(), canon, nil); ok {
				fast++
			}
		}
		if _, listed := redactions[v.Version()]; listed && fast < len(events)*9/10 {
			t.Errorf("room version %s: %d of %d events redacted by canonicalRedacted, want 90%%", v.Version(), fast, len(events))
		}
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 4*MaxPDUBytes)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// BenchmarkReferenceHash compares canonicalReferenceHashID with
// gomatrixserverlib's redaction (referenceHashID) on a message event.
func BenchmarkReferenceHash(b *testing.B) {
	verImpl := gomatrixserverlib.MustGetRoomVersion(gomatrixserverlib.RoomVersionV12)
	canon, err := gomatrixserverlib.CanonicalJSON([]byte(refHashCases[0]))
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		f    func(gomatrixserverlib.IRoomVersion, []byte) (string, error)
	}{{"canonical", canonicalReferenceHashID}, {"gomatrixserverlib", referenceHashID}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(canon)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.f(verImpl, canon); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
