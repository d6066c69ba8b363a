package resolver_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/authrules"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/testrooms"
	"github.com/mtxdb/mtxdb/testrooms/gen"
)

// TestPlainOutcomeShared checks Cache.allowedOnce against the rules without a
// cache: they decide a plain event (not a state event, not a redaction) from its
// room, type, sender and auth events alone, and the cache's key holds all four.
// Every plain event of the real rooms and of a generated v12 room (bans, kicks,
// power-level changes and rejections included) is checked against its own auth
// events, with variants of other content (empty, another msgtype,
// membership-like fields, a large body: the same key), of another sender and of
// another type (other keys), through one cache per room.
func TestPlainOutcomeShared(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join(testrooms.Dir(), "real", "room*"))
	require.NoError(t, err)
	genDir := t.TempDir()
	opts := gen.DefaultOptions()
	opts.Seed, opts.Events, opts.Servers, opts.RoomVersion = 3, 3000, 4, "12"
	_, err = gen.Generate(opts, genDir, nil)
	require.NoError(t, err)
	dirs = append(dirs, genDir)
	contents := []string{`{}`, `{"msgtype":"m.notice","body":"x"}`, `{"membership":"ban","users":{"@a:b":100}}`,
		`{"msgtype":"m.text","body":"` + strings.Repeat("a", 4000) + `"}`}
	checked, allowed, rejected := 0, 0, 0
	for _, dir := range dirs {
		events := loadPDUs(t, dir)
		cache := resolver.NewCache()
		for _, p := range events.order {
			if p.StateKey() != nil || p.Type() == spec.MRoomRedaction {
				continue
			}
			var auth []gomatrixserverlib.PDU
			for _, a := range p.AuthEventIDs() {
				if ae, ok := events.byID[a]; ok {
					auth = append(auth, ae)
				}
			}
			variants := []gomatrixserverlib.PDU{p}
			for i, c := range contents {
				variants = append(variants, withField(t, p, "content", c, i))
			}
			// Another sender and another type: other keys, which must not share
			// the outcome of this event's.
			variants = append(variants, withField(t, p, "sender", `"@stranger:elsewhere.test"`, 10),
				withField(t, p, "type", `"org.example.custom"`, 11),
				withField(t, p, "type", `"m.room.name"`, 12), // 50 in the default power levels
				withField(t, p, "type", `"m.room.power_levels"`, 13))
			for _, v := range variants {
				want := authrules.Authorize(v, auth) == nil
				if got := cache.AllowedOnce(v, auth) == nil; got != want {
					t.Fatalf("%s: event %s (%s %s, content %s): cached outcome %v, the rules say %v",
						dir, p.EventID(), v.Type(), v.SenderID(), v.Content(), got, want)
				}
				checked++
				if want {
					allowed++
				} else {
					rejected++
				}
			}
		}
	}
	t.Logf("%d checks: %d allowed, %d not", checked, allowed, rejected)
	require.Positive(t, allowed)
	require.Positive(t, rejected, "no plain event was refused: the comparison tests half the rules")
}

type pduSet struct {
	order []gomatrixserverlib.PDU
	byID  map[string]gomatrixserverlib.PDU
}

func loadPDUs(t *testing.T, dir string) pduSet {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "events.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	set := pduSet{byID: map[string]gomatrixserverlib.PDU{}}
	var verImpl gomatrixserverlib.IRoomVersion
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		if verImpl == nil {
			var c struct {
				Content struct {
					RoomVersion string `json:"room_version"`
				} `json:"content"`
			}
			require.NoError(t, json.Unmarshal(sc.Bytes(), &c))
			if c.Content.RoomVersion == "" {
				c.Content.RoomVersion = "1"
			}
			verImpl, err = gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersion(c.Content.RoomVersion))
			require.NoError(t, err)
		}
		p, err := verImpl.NewEventFromUntrustedJSON(append([]byte(nil), sc.Bytes()...))
		require.NoError(t, err, dir)
		set.order = append(set.order, p)
		set.byID[p.EventID()] = p
	}
	require.NoError(t, sc.Err())
	return set
}

// withField returns p with one top-level field replaced (a new event ID).
func withField(t *testing.T, p gomatrixserverlib.PDU, field, value string, i int) gomatrixserverlib.PDU {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(p.JSON(), &m))
	m[field] = json.RawMessage(value)
	b, err := json.Marshal(m)
	require.NoError(t, err)
	verImpl, err := gomatrixserverlib.GetRoomVersion(p.Version())
	require.NoError(t, err)
	v, err := verImpl.NewEventFromTrustedJSONWithEventID(fmt.Sprintf("%s-variant%d", p.EventID(), i), b, false)
	require.NoError(t, err)
	return v
}
