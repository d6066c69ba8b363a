package integration

import (
	"bufio"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mtxdb/mtxdb/pdu"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/authrules"
	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/roomstate/roomstatetest"
	"github.com/mtxdb/mtxdb/testrooms/gen"
)

// importKeepGoing imports in (a file's content) into st as a homeserver would:
// invalid PDUs refused and reported, the rest stored.
func importKeepGoing(t *testing.T, st *roomstate.Store, in, source string) roomstate.ImportResult {
	ctx := t.Context()
	t.Helper()
	res, err := st.Import(ctx, strings.NewReader(in), source, roomstate.ImportOptions{KeepGoing: true})
	require.NoError(t, err, source)
	return res
}

// TestRecipeRooms replays the two recipe rooms (testdata/recipes, source note in its
// README): the state after every event equals the expected one, and every event has
// the verdict names.tsv gives it: accepted, rejected by an authorization rule named
// in its reason, or refused at import with its line and event ID. Importing again
// stores nothing new and refuses the same PDUs.
func TestRecipeRooms(t *testing.T) {
	ctx := t.Context()
	for _, name := range []string{"dup-auth-events", "oversized-mid-history"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata", "recipes", name)
			raw, err := os.ReadFile(filepath.Join(dir, "events.jsonl"))
			require.NoError(t, err)
			_, st := roomstatetest.Open(t, t.TempDir())
			res := importKeepGoing(t, st, string(raw), name)
			rooms, err := st.Rooms(ctx)
			require.NoError(t, err)
			require.Len(t, rooms, 1)
			r := rooms[0]
			_, err = resolver.Replay(ctx, r, resolver.ReplayOptions{})
			require.NoError(t, err)
			exp, err := recorded.Load(dir)
			require.NoError(t, err)
			cmp, err := recorded.Compare(ctx, r, exp, func(m recorded.Mismatch) { t.Error(m) })
			require.NoError(t, err)
			require.Zero(t, cmp.Mismatches)

			refused := map[string]*roomstate.ImportError{}
			for _, ie := range res.Refused {
				refused[ie.EventID] = ie
			}
			f, err := os.Open(filepath.Join(dir, "names.tsv"))
			require.NoError(t, err)
			defer f.Close()
			sc := bufio.NewScanner(f)
			nRefused := 0
			for sc.Scan() {
				cols := strings.Split(sc.Text(), "\t")
				id, verdict := cols[1], cols[3]
				st, ok, err := r.EventState(id)
				switch {
				case strings.HasPrefix(verdict, "invalid"):
					nRefused++
					ie := refused[id]
					require.NotNil(t, ie, "%s %s: not refused", cols[0], id)
					require.Positive(t, ie.Line)
					require.Contains(t, ie.Error(), "line ")
					require.Contains(t, ie.Error(), id)
					_, err := r.Meta(id)
					require.Error(t, err, "%s: a refused PDU is not stored", cols[0])
				case verdict == "reject":
					require.NoError(t, err)
					require.True(t, ok && st.Rejected, "%s: not rejected", cols[0])
					require.Contains(t, st.Reason, "authorization rule ")
				default:
					require.NoError(t, err)
					require.True(t, ok && !st.Rejected, "%s: %s", cols[0], st.Reason)
				}
			}
			require.Len(t, res.Refused, nRefused)

			again := importKeepGoing(t, st, string(raw), name)
			require.Zero(t, again.Imported, "re-import stores nothing new")
			require.Equal(t, res.Imported, again.Skipped)
			require.Len(t, again.Refused, nRefused)
		})
	}
}

// chain builds a room history as one server would: each event's prev_events are
// the last accepted event, its auth_events the auth events selection over the
// state so far (v12: without the create event).
type chain struct {
	t      *testing.T
	ver    gomatrixserverlib.IRoomVersion
	v12    bool
	key    ed25519.PrivateKey
	roomID string
	ts     int64
	create gomatrixserverlib.PDU
	state  map[[2]string]gomatrixserverlib.PDU
	last   string
	lines  []string
}

const (
	alice = "@alice:a.test"
	bob   = "@bob:b.test"
)

func newChain(t *testing.T, version, roomID string) *chain {
	ver, err := gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersion(version))
	require.NoError(t, err)
	seed := sha256.Sum256([]byte("recipes " + roomID))
	c := &chain{t: t, ver: ver, v12: version == "12", key: ed25519.NewKeyFromSeed(seed[:]), roomID: roomID,
		ts: 1700000000000 + int64(seed[0])<<20, state: map[[2]string]gomatrixserverlib.PDU{}}
	cc := map[string]any{"room_version": version}
	if !c.v12 && version != "11" {
		cc["creator"] = alice
	}
	c.create = c.add(alice, spec.MRoomCreate, ptr(""), cc, nil)
	if c.v12 {
		c.roomID = "!" + strings.TrimPrefix(c.create.EventID(), "$")
	}
	c.add(alice, spec.MRoomMember, ptr(alice), map[string]any{"membership": "join"}, nil)
	users := map[string]any{alice: 100}
	if c.v12 {
		users = map[string]any{} // v12: the creator may not be listed (rule 10.4)
	}
	c.add(alice, spec.MRoomPowerLevels, ptr(""), map[string]any{"users": users}, nil)
	c.add(alice, spec.MRoomJoinRules, ptr(""), map[string]any{"join_rule": "public"}, nil)
	c.add(bob, spec.MRoomMember, ptr(bob), map[string]any{"membership": "join"}, nil)
	return c
}

func ptr(s string) *string { return &s }

// add builds an event, appends its line and, unless mod marks it as not to be
// built upon (returns false), makes it the last event and puts it in the state.
func (c *chain) add(sender, typ string, sk *string, content any, mod func(*gomatrixserverlib.ProtoEvent) bool) gomatrixserverlib.PDU {
	c.t.Helper()
	raw, err := json.Marshal(content)
	require.NoError(c.t, err)
	proto := gomatrixserverlib.ProtoEvent{SenderID: sender, RoomID: c.roomID, Type: typ, StateKey: sk, Content: raw,
		PrevEvents: []string{}, AuthEvents: []string{}, Depth: int64(len(c.lines) + 1)}
	if typ == spec.MRoomCreate && c.v12 {
		proto.RoomID = ""
	}
	if c.last != "" {
		proto.PrevEvents = []string{c.last}
		needed, err := gomatrixserverlib.StateNeededForProtoEvent(&proto)
		require.NoError(c.t, err)
		for _, tu := range needed.Tuples() {
			if tu.EventType == spec.MRoomCreate && c.v12 {
				continue
			}
			if e, ok := c.state[[2]string{tu.EventType, tu.StateKey}]; ok {
				proto.AuthEvents = append(proto.AuthEvents.([]string), e.EventID())
			}
		}
	}
	keep := true
	if mod != nil {
		keep = mod(&proto)
	}
	c.ts++
	origin := spec.ServerName(strings.SplitN(sender, ":", 2)[1])
	p, err := c.ver.NewEventBuilderFromProtoEvent(&proto).Build(time.UnixMilli(c.ts), origin, "ed25519:1", c.key)
	require.NoError(c.t, err)
	c.lines = append(c.lines, string(p.JSON()))
	if keep {
		c.last = p.EventID()
		if sk != nil {
			c.state[[2]string{typ, *sk}] = p
		}
	}
	return p
}

// cite replaces an event's auth_events (and marks it as not built upon).
func cite(ids ...string) func(*gomatrixserverlib.ProtoEvent) bool {
	return func(p *gomatrixserverlib.ProtoEvent) bool {
		p.AuthEvents = ids
		return false
	}
}

func (c *chain) id(typ, sk string) string { return c.state[[2]string{typ, sk}].EventID() }

// createCite is the create event for citing: none in v12 (its room ID implies it).
func (c *chain) createCite() []string {
	if c.v12 {
		return nil
	}
	return []string{c.create.EventID()}
}

// TestAuthEventsFaultKinds: events whose auth_events the rules forbid, in room
// versions 10 and 12, each followed by a valid event that must still be accepted:
// one (type, state_key) cited twice by two different events, an entry the selection
// does not name (join rules for a topic), a rejected entry, no create event (v10),
// the create event cited (v12), and an auth event of another room, which import
// refuses end to end with the rule's number.
func TestAuthEventsFaultKinds(t *testing.T) {
	ctx := t.Context()
	for _, version := range []string{"10", "12"} {
		t.Run("v"+version, func(t *testing.T) {
			other := newChain(t, version, "!other:a.test")
			c := newChain(t, version, "!faults:a.test")
			type want struct {
				id, rule string // rule: "" accepted
			}
			var wants []want
			bad := func(p gomatrixserverlib.PDU, rule string) { wants = append(wants, want{p.EventID(), rule}) }
			good := func(p gomatrixserverlib.PDU) { wants = append(wants, want{p.EventID(), ""}) }
			aliceJoin := c.id(spec.MRoomMember, alice)
			pl := c.id(spec.MRoomPowerLevels, "")
			msg := map[string]any{"body": "hi", "msgtype": "m.text"}

			// Two events of one key: alice's join and her later display name.
			good(c.add(alice, spec.MRoomMember, ptr(alice), map[string]any{"membership": "join", "displayname": "A"}, nil))
			bad(c.add(alice, "m.room.message", nil, msg, cite(append(c.createCite(), aliceJoin, c.id(spec.MRoomMember, alice), pl)...)),
				"auth_events.duplicate")
			good(c.add(alice, "m.room.message", nil, msg, nil))
			// A topic citing the join rules.
			bad(c.add(alice, "m.room.topic", ptr(""), map[string]any{"topic": "t"},
				cite(append(c.createCite(), c.id(spec.MRoomMember, alice), pl, c.id(spec.MRoomJoinRules, ""))...)), "auth_events.selection")
			good(c.add(alice, "m.room.topic", ptr(""), map[string]any{"topic": "t2"}, nil))
			// bob's power levels are rejected (level 0); a message citing them is too.
			bobPL := c.add(bob, spec.MRoomPowerLevels, ptr(""), map[string]any{"users": map[string]any{bob: 100}}, func(*gomatrixserverlib.ProtoEvent) bool { return false })
			bad(bobPL, "required_level")
			bad(c.add(alice, "m.room.message", nil, msg, cite(append(c.createCite(), c.id(spec.MRoomMember, alice), bobPL.EventID())...)),
				"auth_events.rejected")
			if version == "12" {
				bad(c.add(alice, "m.room.message", nil, msg, cite(c.create.EventID(), c.id(spec.MRoomMember, alice), pl)), "auth_events.selection")
			} else {
				bad(c.add(alice, "m.room.message", nil, msg, cite(c.id(spec.MRoomMember, alice), pl)), "auth_events.no_create")
			}
			good(c.add(bob, "m.room.message", nil, msg, nil))
			// Another room's member event for alice: refused at import.
			otherRoom := c.add(alice, "m.room.message", nil, msg, cite(append(c.createCite(), other.id(spec.MRoomMember, alice), pl)...))
			last := c.add(alice, "m.room.name", ptr(""), map[string]any{"name": "after"}, nil)
			good(last)

			_, st := roomstatetest.Open(t, t.TempDir())
			importKeepGoing(t, st, strings.Join(other.lines, "\n"), "other")
			res := importKeepGoing(t, st, strings.Join(c.lines, "\n"), "faults")
			require.Len(t, res.Refused, 1, "%v", res.Refused)
			ie := res.Refused[0]
			require.ErrorIs(t, ie, roomstate.ErrOtherRoom)
			require.Equal(t, otherRoom.EventID(), ie.EventID)
			require.Equal(t, len(c.lines)-1, ie.Line)
			rule := "2.5"
			if version == "12" {
				rule = "3.4"
			}
			require.Contains(t, ie.Error(), "authorization rule "+rule+" of room version "+version)

			r, err := st.Room(ctx, c.roomID)
			require.NoError(t, err)
			rep, err := resolver.Replay(ctx, r, resolver.ReplayOptions{})
			require.NoError(t, err)
			for _, w := range wants {
				es, ok, err := r.EventState(w.id)
				require.NoError(t, err)
				require.True(t, ok, w.id)
				if w.rule == "" {
					require.False(t, es.Rejected, "%s: %s", w.id, es.Reason)
					continue
				}
				require.True(t, es.Rejected, "%s should be rejected by %s", w.id, w.rule)
				var num string
				for _, ar := range authrules.Rules(version) {
					if ar.ID == w.rule {
						num = ar.Num
					}
				}
				require.Contains(t, es.Reason, "authorization rule "+num+" of room version "+version+" ("+w.rule+":")
			}
			require.Equal(t, 5, rep.Rejected)
			name, ok, err := r.Lookup(r.NewReader(), r.Head().CurrentState, "m.room.name", "")
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, last.EventID(), name)
		})
	}
}

// TestInvalidPDUKinds: invalid PDUs in the middle of a history (v10), each refused
// with its line, event ID where it has one and reason, and none stops the import:
// every valid event after them is stored and accepted. Kinds: over 65,536 bytes
// (a PDU padded with white space past the limit but under it as canonical JSON is
// valid), a field over 255 bytes, malformed JSON, a wrong event_id, an unknown
// prev event, integers out of range (depth, content), an unknown room. The same history as a JSON array cut short keeps
// every element before the cut.
func TestInvalidPDUKinds(t *testing.T) {
	ctx := t.Context()
	c := newChain(t, "10", "!invalid:a.test")
	type refusal struct {
		line int
		err  error
	}
	var refusals []refusal
	refuse := func(line string, err error) {
		c.lines = append(c.lines, line)
		refusals = append(refusals, refusal{len(c.lines), err})
	}
	msg := func(body string) map[string]any { return map[string]any{"body": body, "msgtype": "m.text"} }
	notBuilt := func(*gomatrixserverlib.ProtoEvent) bool { return false }

	big := c.add(alice, "m.room.message", nil, msg("BIG"), notBuilt)
	c.lines = c.lines[:len(c.lines)-1]
	bigLine := strings.Replace(string(big.JSON()), `"BIG"`, `"`+strings.Repeat("x", 66000)+`"`, 1)
	refuse(bigLine, pdu.ErrTooLarge)
	padded := c.add(alice, "m.room.message", nil, msg(strings.Repeat("y", 60000)), nil)
	c.lines[len(c.lines)-1] = strings.Replace(c.lines[len(c.lines)-1], `{"auth_events"`, `{`+strings.Repeat(" ", 6000)+`"auth_events"`, 1)
	require.Greater(t, len(c.lines[len(c.lines)-1]), pdu.MaxPDUBytes)
	long := c.add(alice, "x.note", ptr("KEY"), map[string]any{}, notBuilt)
	c.lines = c.lines[:len(c.lines)-1]
	refuse(strings.Replace(string(long.JSON()), `"KEY"`, `"`+strings.Repeat("k", 300)+`"`, 1), pdu.ErrFieldTooLong)
	refuse(`{"type":"m.room.message","content":{`, pdu.ErrMalformedPDU)
	named := c.add(alice, "m.room.message", nil, msg("named"), notBuilt)
	c.lines = c.lines[:len(c.lines)-1]
	refuse(strings.Replace(string(named.JSON()), `{"auth_events"`, `{"event_id":"$wrong","auth_events"`, 1), pdu.ErrEventIDMismatch)
	orphan := c.add(alice, "m.room.message", nil, msg("orphan"), func(p *gomatrixserverlib.ProtoEvent) bool {
		p.PrevEvents = []string{"$neverseen"}
		return false
	})
	c.lines = c.lines[:len(c.lines)-1]
	refuse(string(orphan.JSON()), roomstate.ErrMissingPrevEvent)
	// Integers outside canonical JSON's range (room versions 6 and up): a depth and
	// a content value of 2^53+1 (gomatrixserverlib's parser refuses them).
	deep := c.add(alice, "m.room.message", nil, msg("deep"), notBuilt)
	c.lines = c.lines[:len(c.lines)-1]
	refuse(strings.Replace(string(deep.JSON()), fmt.Sprintf(`"depth":%d`, deep.Depth()), `"depth":9007199254740993`, 1), pdu.ErrMalformedPDU)
	huge := c.add(alice, "m.room.message", nil, map[string]any{"body": "n", "n": 7}, notBuilt)
	c.lines = c.lines[:len(c.lines)-1]
	refuse(strings.Replace(string(huge.JSON()), `"n":7`, `"n":9007199254740993`, 1), pdu.ErrMalformedPDU)
	stray := newChain(t, "10", "!stray:a.test").add(alice, "m.room.message", nil, msg("stray"), nil)
	refuse(string(stray.JSON()), roomstate.ErrNoCreateEvent)
	after := c.add(alice, "m.room.name", ptr(""), map[string]any{"name": "after"}, nil)
	c.add(bob, "m.room.message", nil, msg("still here"), nil)

	_, st := roomstatetest.Open(t, t.TempDir())
	res := importKeepGoing(t, st, strings.Join(c.lines, "\n"), "invalid.jsonl")
	require.Len(t, res.Refused, len(refusals), "%v", res.Refused)
	for i, want := range refusals {
		got := res.Refused[i]
		require.Equal(t, want.line, got.Line, "%v", got)
		require.True(t, errors.Is(got, want.err), "line %d: got %v, want %v", want.line, got, want.err)
		require.Contains(t, got.Error(), "invalid.jsonl line ")
	}
	bigPDU, err := gomatrixserverlib.MustGetRoomVersion("10").NewEventFromTrustedJSON([]byte(bigLine), false)
	if err == nil { // gomatrixserverlib may refuse to parse it at all: then only the prefix is checked
		require.Equal(t, bigPDU.EventID(), res.Refused[0].EventID, "an oversized PDU is named by its event ID")
	}
	require.True(t, strings.HasPrefix(res.Refused[0].EventID, "$") && len(res.Refused[0].EventID) == 44, res.Refused[0].EventID)
	require.Equal(t, len(c.lines)-len(refusals), res.Imported)

	r, err := st.Room(ctx, c.roomID)
	require.NoError(t, err)
	rep, err := resolver.Replay(ctx, r, resolver.ReplayOptions{})
	require.NoError(t, err)
	require.Zero(t, rep.Rejected)
	for _, id := range []string{padded.EventID(), after.EventID()} {
		es, ok, err := r.EventState(id)
		require.NoError(t, err)
		require.True(t, ok && !es.Rejected, id)
	}
	again := importKeepGoing(t, st, strings.Join(c.lines, "\n"), "invalid.jsonl")
	require.Zero(t, again.Imported)
	require.Len(t, again.Refused, len(refusals))

	// As a JSON array cut inside its last element: the elements before are kept.
	var valid []string
	for i, l := range c.lines {
		if !strings.HasPrefix(l, `{"type":"m.room.message","content":{`) && i < len(c.lines)-1 {
			valid = append(valid, l)
		}
	}
	arr := "[" + strings.Join(valid, ",") + "," + c.lines[len(c.lines)-1][:40]
	_, st2 := roomstatetest.Open(t, t.TempDir())
	res2 := importKeepGoing(t, st2, arr, "cut.json")
	require.Len(t, res2.Refused, len(refusals)-1+1, "%v", res2.Refused) // all but the malformed line, plus the cut
	require.ErrorIs(t, res2.Refused[len(res2.Refused)-1], pdu.ErrMalformedPDU)
	require.True(t, res2.Refused[len(res2.Refused)-1].Element)
	require.Equal(t, len(valid)-(len(refusals)-1), res2.Imported)
}

// TestSignaturesWithKeys: with the servers' keys, import refuses PDUs without valid
// signatures and keeps the rest. A generated room (v10 and v12, keys from
// gen.KeyRing) imports whole and replays to its expected state; one PDU with a
// damaged signature, and all of them under another key seed, are refused. A
// restricted join (v10) needs the authorising user's server's signature too
// (authorization rule 4.2.1).
func TestSignaturesWithKeys(t *testing.T) {
	ctx := t.Context()
	for _, version := range []string{"10", "12"} {
		t.Run("gen v"+version, func(t *testing.T) {
			opts := gen.DefaultOptions()
			opts.Seed, opts.Events, opts.Servers, opts.RoomVersion = 5, 150, 3, version
			dir := filepath.Join(t.TempDir(), "room")
			_, err := gen.Generate(opts, dir, nil)
			require.NoError(t, err)
			raw, err := os.ReadFile(filepath.Join(dir, "events.jsonl"))
			require.NoError(t, err)
			keys := gen.KeyRing(opts)
			_, st := roomstatetest.Open(t, t.TempDir())
			res, err := st.Import(ctx, strings.NewReader(string(raw)), "gen", roomstate.ImportOptions{KeepGoing: true, Keys: keys})
			require.NoError(t, err)
			require.Empty(t, res.Refused)
			rooms, err := st.Rooms(ctx)
			require.NoError(t, err)
			_, err = resolver.Replay(ctx, rooms[0], resolver.ReplayOptions{})
			require.NoError(t, err)
			exp, err := recorded.Load(dir)
			require.NoError(t, err)
			cmp, err := recorded.Compare(ctx, rooms[0], exp, func(m recorded.Mismatch) { t.Error(m) })
			require.NoError(t, err)
			require.Zero(t, cmp.Mismatches)

			// The last line's signature damaged (its first base64 character changed).
			lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
			last := lines[len(lines)-1]
			i := strings.Index(last, `"ed25519:gen":"`) + len(`"ed25519:gen":"`)
			flip := "A"
			if last[i] == 'A' {
				flip = "B"
			}
			lines[len(lines)-1] = last[:i] + flip + last[i+1:]
			_, st2 := roomstatetest.Open(t, t.TempDir())
			res, err = st2.Import(ctx, strings.NewReader(strings.Join(lines, "\n")), "gen", roomstate.ImportOptions{KeepGoing: true, Keys: keys})
			require.NoError(t, err)
			require.Len(t, res.Refused, 1)
			require.ErrorIs(t, res.Refused[0], pdu.ErrBadSignature)
			require.Equal(t, len(lines), res.Refused[0].Line)

			other := opts
			other.KeySeed = 99
			_, st3 := roomstatetest.Open(t, t.TempDir())
			res, err = st3.Import(ctx, strings.NewReader(string(raw)), "gen", roomstate.ImportOptions{KeepGoing: true, Keys: gen.KeyRing(other)})
			require.NoError(t, err)
			require.Zero(t, res.Imported)
			require.ErrorIs(t, res.Refused[0], pdu.ErrBadSignature)
		})
	}
	t.Run("restricted join v10", func(t *testing.T) {
		c := newChain(t, "10", "!restricted:a.test")
		c.add(alice, spec.MRoomJoinRules, ptr(""), map[string]any{"join_rule": "restricted",
			"allow": []map[string]any{{"type": "m.room_membership", "room_id": "!space:a.test"}}}, nil)
		via := map[string]any{"membership": "join", "join_authorised_via_users_server": alice}
		unsigned := c.add("@carol:c.test", spec.MRoomMember, ptr("@carol:c.test"), via, func(*gomatrixserverlib.ProtoEvent) bool { return false })
		signed := c.add("@carol:c.test", spec.MRoomMember, ptr("@carol:c.test"), map[string]any{"membership": "join",
			"join_authorised_via_users_server": alice, "displayname": "Carol"}, nil)
		c.lines[len(c.lines)-1] = string(signed.Sign("a.test", "ed25519:1", c.key).JSON())
		pub := c.key.Public().(ed25519.PublicKey)
		keys := pdu.KeyRing{}
		for _, s := range []string{"a.test", "b.test", "c.test"} {
			keys[s] = map[gomatrixserverlib.KeyID]ed25519.PublicKey{"ed25519:1": pub}
		}
		_, st := roomstatetest.Open(t, t.TempDir())
		res, err := st.Import(ctx, strings.NewReader(strings.Join(c.lines, "\n")), "restricted", roomstate.ImportOptions{KeepGoing: true, Keys: keys})
		require.NoError(t, err)
		require.Len(t, res.Refused, 1, "%v", res.Refused)
		require.Equal(t, unsigned.EventID(), res.Refused[0].EventID)
		require.ErrorIs(t, res.Refused[0], pdu.ErrBadSignature)
		require.Contains(t, res.Refused[0].Error(), "authorization rule 4.2.1 of room version 10")
		r, err := st.Room(ctx, c.roomID)
		require.NoError(t, err)
		_, err = resolver.Replay(ctx, r, resolver.ReplayOptions{})
		require.NoError(t, err)
		es, ok, err := r.EventState(signed.EventID())
		require.NoError(t, err)
		require.True(t, ok && !es.Rejected, es.Reason)
	})
}
