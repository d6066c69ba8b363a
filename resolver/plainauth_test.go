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

	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/testrooms"
	"github.com/mtxdb/mtxdb/testrooms/gen"
)

// TestPlainOutcomeShared checks the premise of Cache.allowedOnce: the
// authorization rules decide a plain event (not a state event, not a redaction)
// from its room, type, sender and auth events alone. For every plain event of the
// real rooms and of a generated v12 room (bans, kicks, power-level changes and
// rejections included), checked against its own auth events, and for variants of
// it with other content (empty, another msgtype, membership-like fields, a large
// body), gomatrixserverlib's outcome with no cache must equal the cached outcome
// of the first event with the same four.
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
			cached := cache.AllowedOnce(p, auth) == nil
			variants := []gomatrixserverlib.PDU{p}
			for i, c := range contents {
				variants = append(variants, withContent(t, p, c, i))
			}
			for _, v := range variants {
				if got := resolver.AllowedList(v, auth) == nil; got != cached {
					t.Fatalf("%s: event %s (content %s): allowed %v, the cached outcome for its room, type, sender and auth events %v",
						dir, p.EventID(), v.Content(), got, cached)
				}
				checked++
			}
			if cached {
				allowed++
			} else {
				rejected++
			}
		}
	}
	t.Logf("%d checks: %d plain events allowed, %d not", checked, allowed, rejected)
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

// withContent returns p with its content replaced (a new event ID).
func withContent(t *testing.T, p gomatrixserverlib.PDU, content string, i int) gomatrixserverlib.PDU {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(p.JSON(), &m))
	m["content"] = json.RawMessage(content)
	b, err := json.Marshal(m)
	require.NoError(t, err)
	verImpl, err := gomatrixserverlib.GetRoomVersion(p.Version())
	require.NoError(t, err)
	v, err := verImpl.NewEventFromTrustedJSONWithEventID(fmt.Sprintf("%s-variant%d", p.EventID(), i), b, false)
	require.NoError(t, err)
	return v
}
