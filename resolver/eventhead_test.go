package resolver_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/authrules"
	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/roomstate/roomstatetest"
	"github.com/mtxdb/mtxdb/testrooms"
	"github.com/mtxdb/mtxdb/testrooms/gen"
)

// memberAuthRooms are the rooms the stand-in tests read: every real room,
// generated rooms of several versions with kicks, bans, invites and rejections,
// and the scripted rooms of every room version 1-12 (third-party invites, knocks,
// restricted joins, aliases, redactions: scriptedRooms).
func memberAuthRooms(t *testing.T) []string {
	dirs, err := filepath.Glob(filepath.Join(testrooms.Dir(), "real", "room*"))
	require.NoError(t, err)
	for _, v := range []string{"10", "11", "12"} {
		dir := filepath.Join(t.TempDir(), "gen"+v)
		opts := gen.DefaultOptions()
		opts.Seed, opts.Events, opts.Servers, opts.RoomVersion = 7, 2500, 4, v
		_, err := gen.Generate(opts, dir, nil)
		require.NoError(t, err)
		dirs = append(dirs, dir)
	}
	return append(dirs, scriptedRooms(t)...)
}

// TestMemberAuthStandsIn checks that the stand-in authorisation uses for a member
// event the PDU cache let go (memberAuth: key and membership only) decides as
// the member event itself: every event of the rooms is checked against its auth
// events (CheckAuthEvents, then the rules) with each member event among them
// replaced by its stand-in, and the outcome and its reason must be the same. Each
// event is also checked as an invite, a ban and a join of its sender's and
// another member's key (the membership rules read the most of the auth events'
// memberships).
func TestMemberAuthStandsIn(t *testing.T) {
	checked, replaced, allowed := 0, 0, 0
	for _, dir := range memberAuthRooms(t) {
		events := loadPDUs(t, dir)
		var members []string // state keys of member events seen so far
		for _, p := range events.order {
			var auth, stood []gomatrixserverlib.PDU
			for _, a := range p.AuthEventIDs() {
				ae, ok := events.byID[a]
				if !ok {
					continue
				}
				auth = append(auth, ae)
				if s, ok := resolver.MemberAuthFor(ae); ok {
					stood = append(stood, s)
					replaced++
				} else {
					stood = append(stood, ae)
				}
			}
			variants := []gomatrixserverlib.PDU{p}
			if len(members) > 0 && p.Type() == spec.MRoomMember {
				other := members[len(members)/2]
				for i, m := range []string{spec.Invite, spec.Ban, spec.Join, spec.Leave} {
					variants = append(variants, withField(t, withField(t, p, "state_key", fmt.Sprintf("%q", other), 20+i),
						"content", fmt.Sprintf(`{"membership":%q}`, m), 30+i))
				}
			}
			for _, v := range variants {
				want, got := checkAll(v, auth), checkAll(v, stood)
				require.Equal(t, want, got, "%s: event %s (%s, state key %v): with stand-ins for its member auth events",
					dir, v.EventID(), v.Type(), v.StateKey())
				checked++
				if want == "" {
					allowed++
				}
			}
			if p.Type() == spec.MRoomMember && p.StateKey() != nil {
				members = append(members, *p.StateKey())
			}
		}
	}
	t.Logf("%d checks (%d allowed), %d member auth events stood in for", checked, allowed, replaced)
	require.Positive(t, allowed)
	require.Greater(t, checked-allowed, 100)
	require.Greater(t, replaced, 1000)
}

// TestEventHeadChecked checks that a member event checked in its light form
// (eventHead: key, sender, membership, auth and prev events, as the iterative
// auth checks of a resolution check an event the PDU cache let go) is decided as
// the parsed event: every member event of the rooms, and variants of it with
// another key and membership and with content the rules do not read, is checked
// against its auth events (member auth events as stand-ins, as in a resolution),
// and the outcome and its reason must be the same. Content the rules do read
// (join_authorised_via_users_server, third_party_invite, a displayname of the
// wrong type) must leave the event in its parsed form.
func TestEventHeadChecked(t *testing.T) {
	checked, allowed, parsedForm, namesCreate, otherTypes := 0, 0, 0, 0, 0
	for _, dir := range memberAuthRooms(t) {
		events := loadPDUs(t, dir)
		var members []string
		for _, p := range events.order {
			if p.StateKey() == nil {
				continue
			}
			var auth []gomatrixserverlib.PDU
			for _, a := range p.AuthEventIDs() {
				if ae, ok := events.byID[a]; ok {
					if s, ok := resolver.MemberAuthFor(ae); ok {
						ae = s
					}
					auth = append(auth, ae)
				}
			}
			if p.Type() != spec.MRoomMember {
				plain, parsed := checkPlainStateHead(t, dir, p, auth, members)
				checked, otherTypes, parsedForm = checked+plain, otherTypes+plain, parsedForm+parsed
				continue
			}
			key := fmt.Sprintf("%q", *p.StateKey())
			if len(members) > 0 {
				key = fmt.Sprintf("%q", members[len(members)/2])
			}
			var variants []gomatrixserverlib.PDU
			for i, m := range []string{spec.Join, spec.Invite, spec.Ban, spec.Leave, spec.Knock} {
				variants = append(variants, withField(t, withField(t, p, "state_key", key, 40+i), "content", fmt.Sprintf(`{"membership":%q}`, m), 50+i))
			}
			variants = append(variants, p,
				withField(t, p, "content", `{"membership":"join","displayname":"d","avatar_url":"mxc://x/y","reason":"r","is_direct":true}`, 60),
				withField(t, p, "content", `{"membership":"leave","reason":"r","third_party_invite":null}`, 61))
			for _, v := range variants {
				h, ok := resolver.CheckedHeadFor(v)
				if !ok {
					parsedForm++
					continue
				}
				want, got := checkAll(v, auth), checkAll(h, auth)
				require.Equal(t, want, got, "%s: event %s (state key %q, content %s): checked as its head", dir, v.EventID(), *v.StateKey(), v.Content())
				checked++
				if want == "" {
					allowed++
				}
			}
			if p.Version() == gomatrixserverlib.RoomVersionV12 {
				// v12: an auth_events that names the implied create event is read
				// from the JSON (the rule on auth_events rejects it).
				var raw struct {
					AuthEvents []string `json:"auth_events"`
				}
				require.NoError(t, json.Unmarshal(p.JSON(), &raw))
				cites, err := json.Marshal(append(raw.AuthEvents, "$"+strings.TrimPrefix(p.RoomID().String(), "!")))
				require.NoError(t, err)
				v := withField(t, p, "auth_events", string(cites), 80)
				if h, ok := resolver.CheckedHeadFor(v); ok {
					require.Equal(t, checkAll(v, auth), checkAll(h, auth), "%s: event %s naming the create event in auth_events", dir, v.EventID())
				} else {
					namesCreate++
				}
			}
			for i, c := range []string{
				`{"membership":"join","join_authorised_via_users_server":"@a:b"}`,
				`{"membership":"invite","third_party_invite":{"display_name":"x","signed":{"mxid":"@a:b","token":"t","signatures":{}}}}`,
				`{"membership":"join","displayname":5}`,
				`{"membership":"joined"}`,
			} {
				if _, ok := resolver.CheckedHeadFor(withField(t, p, "content", c, 70+i)); ok {
					t.Fatalf("%s: event %s with content %s was given a head", dir, p.EventID(), c)
				}
			}
			members = append(members, *p.StateKey())
		}
	}
	t.Logf("%d events checked as heads (%d members allowed, %d of other types), %d in parsed form, %d naming the create event",
		checked, allowed, otherTypes, parsedForm, namesCreate)
	require.Greater(t, allowed, 1000)
	require.Greater(t, otherTypes, 1000)
	require.Positive(t, namesCreate)
	require.Greater(t, checked-allowed, 1000)
}

// checkPlainStateHead is TestEventHeadChecked for a state event other than a
// member event: the event, and variants of it with a user's state key (the rule
// on state keys naming users) and of a type no rule names (the state default
// level), checked as the parsed event and as its head. The create, power levels,
// aliases and redaction events must stay in parsed form (the rules read their
// content). It returns the variants checked and those left parsed.
func checkPlainStateHead(t *testing.T, dir string, p gomatrixserverlib.PDU, auth []gomatrixserverlib.PDU, members []string) (checked, parsed int) {
	t.Helper()
	variants := []gomatrixserverlib.PDU{p}
	if p.Type() != spec.MRoomCreate { // (a v12 create event has no room_id to keep)
		variants = append(variants, withField(t, p, "type", `"org.example.custom"`, 90))
	}
	if len(members) > 0 && p.Type() != spec.MRoomCreate {
		variants = append(variants, withField(t, p, "state_key", fmt.Sprintf("%q", members[len(members)/2]), 91),
			withField(t, p, "state_key", fmt.Sprintf("%q", p.SenderID()), 92))
	}
	for _, v := range variants {
		h, ok := resolver.CheckedHeadFor(v)
		switch v.Type() {
		case spec.MRoomCreate, spec.MRoomPowerLevels, spec.MRoomAliases, spec.MRoomRedaction:
			require.False(t, ok, "%s: event %s (%s) was given a head to check", dir, v.EventID(), v.Type())
		}
		if !ok {
			parsed++
			continue
		}
		require.Equal(t, checkAll(v, auth), checkAll(h, auth), "%s: event %s (%s, state key %q): checked as its head", dir, v.EventID(), v.Type(), *v.StateKey())
		checked++
	}
	return checked, parsed
}

// checkAll is the outcome of the rules on auth_events and of the authorization
// rules: "" when allowed, else the reason.
func checkAll(p gomatrixserverlib.PDU, auth []gomatrixserverlib.PDU) string {
	if err := authrules.CheckAuthEvents(p, auth, nil, nil); err != nil {
		return "auth events: " + err.Error()
	}
	if err := authrules.Authorize(p, auth); err != nil {
		return err.Error()
	}
	return ""
}

// TestReplayWithoutPDUCache replays rooms with the PDU cache at one entry, so that
// authorisation and resolution take every auth event from the stand-ins or from
// the store, and compares every event's state record (before, after, rejection
// and its reason) and the room head with a replay at the default size.
func TestReplayWithoutPDUCache(t *testing.T) {
	recipes, err := filepath.Glob(filepath.Join(testrooms.Dir(), "..", "integration", "testdata", "recipes", "*", "events.jsonl"))
	require.NoError(t, err)
	require.NotEmpty(t, recipes)
	dirs := memberAuthRooms(t)
	for _, f := range recipes {
		dirs = append(dirs, filepath.Dir(f))
	}
	dirs = append(dirs, conflictRooms(t)...)
	for _, dir := range dirs {
		want := replayRecords(t, dir)
		restore := resolver.SetPDUCacheSize(1)
		got := replayRecords(t, dir)
		restore()
		require.Equal(t, want.head, got.head, dir)
		require.Equal(t, len(want.states), len(got.states), dir)
		for id, st := range want.states {
			require.Equal(t, st, got.states[id], "%s: event %s", dir, id)
		}
	}
}

// conflictRooms are generated rooms (v10-12) made to conflict: few members,
// many servers, power levels changes, conflicting admins, join rules changes,
// kicks, bans and a tenth of events sent without the permission for them.
func conflictRooms(t *testing.T) []string {
	var dirs []string
	for _, v := range []string{"10", "11", "12"} {
		dir := filepath.Join(t.TempDir(), "conflict"+v)
		opts := gen.DefaultOptions()
		opts.Seed, opts.Events, opts.Servers, opts.Members, opts.RoomVersion = 11, 1500, 6, 40, v
		opts.BadRate, opts.MaxDelay, opts.Loss = 0.1, 12, 0.1
		opts.Mix.Power, opts.Mix.PowerConflict, opts.Mix.JoinRules, opts.Mix.Kick, opts.Mix.Ban, opts.Mix.Unban = 3, 2, 2, 3, 2, 1
		_, err := gen.Generate(opts, dir, nil)
		require.NoError(t, err)
		dirs = append(dirs, dir)
	}
	return dirs
}

type replayed struct {
	head   roomrecord.Head
	states map[string]roomrecord.EventState
}

func replayRecords(t *testing.T, dir string) replayed {
	ctx := t.Context()
	t.Helper()
	_, st := roomstatetest.Open(t, t.TempDir())
	f, err := os.Open(filepath.Join(dir, "events.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	res, err := st.Import(ctx, f, dir, roomstate.ImportOptions{KeepGoing: true}) // a recipe room holds a PDU import refuses
	require.NoError(t, err)
	out := replayed{states: map[string]roomrecord.EventState{}}
	for _, id := range res.Rooms {
		room, err := st.Room(ctx, id)
		require.NoError(t, err)
		_, err = resolver.Replay(ctx, room, resolver.ReplayOptions{})
		require.NoError(t, err)
		out.head = room.Head()
		ids, err := room.EventIDs()
		require.NoError(t, err)
		for _, e := range ids {
			s, ok, err := room.EventState(e)
			require.NoError(t, err)
			if ok {
				out.states[e] = s
			}
		}
	}
	return out
}

// TestEventHeadMembershipKeyCase: the content of a member event may name its
// membership under a key that differs from "membership" only in case. Go's
// encoding/json (gomatrixserverlib's MemberContent) matches such a key, this
// package's member rule reads the exact key; whichever way it is read, the event
// as its head (content {"membership": ...}) must be decided as the parsed event,
// both when it is checked and when it is an auth event of another. Every member
// event of the real rooms is tried with such contents.
func TestEventHeadMembershipKeyCase(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join(testrooms.Dir(), "real", "room*"))
	require.NoError(t, err)
	contents := []string{
		`{"Membership":"join"}`,
		`{"MEMBERSHIP":"leave"}`,
		`{"membershiP":"invite"}`,
		`{"Membership":"ban","membership":"join"}`,
		`{"membership":"join","Membership":"leave"}`,
	}
	checked, asAuth := 0, 0
	for _, dir := range dirs {
		events := loadPDUs(t, dir)
		for _, p := range events.order {
			if p.Type() != spec.MRoomMember || p.StateKey() == nil {
				continue
			}
			var auth []gomatrixserverlib.PDU
			for _, a := range p.AuthEventIDs() {
				if ae, ok := events.byID[a]; ok {
					auth = append(auth, ae)
				}
			}
			for i, c := range contents {
				v := withField(t, p, "content", c, 100+i)
				if h, ok := resolver.CheckedHeadFor(v); ok {
					require.Equal(t, checkAll(v, auth), checkAll(h, auth), "%s: event %s with content %s: checked as its head", dir, v.EventID(), c)
					checked++
				}
				// v as the member auth event of a message its target sends.
				s, ok := resolver.MemberAuthFor(v)
				if !ok {
					continue
				}
				msg := withField(t, withField(t, p, "type", `"m.room.message"`, 110+i), "content", `{"body":"x"}`, 120+i)
				msg = withField(t, withField(t, msg, "state_key", `null`, 130+i), "sender", fmt.Sprintf("%q", *p.StateKey()), 140+i)
				var msgAuth, stood []gomatrixserverlib.PDU
				for _, a := range auth {
					if a.Type() != spec.MRoomMember {
						msgAuth, stood = append(msgAuth, a), append(stood, a)
					}
				}
				msgAuth, stood = append(msgAuth, v), append(stood, s)
				require.Equal(t, checkAll(msg, msgAuth), checkAll(msg, stood), "%s: event %s with content %s: as an auth event", dir, v.EventID(), c)
				asAuth++
			}
		}
	}
	t.Logf("%d checked as heads, %d as auth events", checked, asAuth)
	require.Positive(t, checked)
	require.Positive(t, asAuth)
}

// TestResolveMapsHeadSource: ResolveMaps given a Resolver itself as its source
// (which can answer an event in its light form, eventHead) resolves as given the
// Resolver as a bare EventSource (every event parsed), with the PDU cache at one
// entry so that the light forms are what it answers: at every merge of the real
// rooms (room version 1's resolution is gomatrixserverlib's, which reads depth
// and content) and of a generated v12 room (the create event's content gives the
// creators).
func TestResolveMapsHeadSource(t *testing.T) {
	dirs, err := recorded.RoomDirs(filepath.Join(testrooms.Dir(), "real"))
	require.NoError(t, err)
	opts := gen.DefaultOptions()
	opts.Seed, opts.Events, opts.Servers, opts.RoomVersion = 3, 400, 4, "12"
	dir := filepath.Join(t.TempDir(), "gen-v12")
	_, err = gen.Generate(opts, dir, nil)
	require.NoError(t, err)
	dirs = append(dirs, dir)
	restore := resolver.SetPDUCacheSize(1)
	defer restore()
	merges := map[gomatrixserverlib.RoomVersion]int{}
	for _, dir := range dirs {
		room, r, ids := replayedResolver(t, dir)
		for _, id := range ids {
			maps := mergeInputs(t, room, id)
			if maps == nil {
				continue
			}
			want, err := resolver.ResolveMaps(gomatrixserverlib.RoomVersion(room.Head().RoomVersion), maps, plainSource{r})
			require.NoError(t, err, "%s %s", dir, id)
			got, err := resolver.ResolveMaps(gomatrixserverlib.RoomVersion(room.Head().RoomVersion), maps, r)
			require.NoError(t, err, "%s %s: with the Resolver as source", dir, id)
			if d := diffMaps(got, want); d != "" {
				t.Errorf("%s: state before %s (room version %s): the Resolver as source differs: %s", filepath.Base(dir), id, gomatrixserverlib.RoomVersion(room.Head().RoomVersion), d)
			}
			merges[gomatrixserverlib.RoomVersion(room.Head().RoomVersion)]++
		}
	}
	t.Logf("merges compared by room version: %v", merges)
	require.Positive(t, merges[gomatrixserverlib.RoomVersionV1])
	require.Positive(t, merges[gomatrixserverlib.RoomVersionV12])
}

// TestIncrementalReplayParses: a replay after new events arrive parses their PDUs
// and those of the events their authorisation and resolution need, not the whole
// room (12 new events of room003 parse far fewer than its 212 PDUs).
func TestIncrementalReplayParses(t *testing.T) {
	ctx := t.Context()
	raw, err := os.ReadFile(filepath.Join(testrooms.Dir(), "real", "room003", "events.jsonl"))
	require.NoError(t, err)
	lines := strings.SplitAfter(strings.TrimSpace(string(raw)), "\n")
	require.Greater(t, len(lines), 200)
	_, st := roomstatetest.Open(t, t.TempDir())
	res, err := st.Import(ctx, strings.NewReader(strings.Join(lines[:200], "")), "first", roomstate.ImportOptions{})
	require.NoError(t, err)
	room, err := st.Room(ctx, res.Rooms[0])
	require.NoError(t, err)
	_, err = resolver.Replay(ctx, room, resolver.ReplayOptions{})
	require.NoError(t, err)
	_, err = st.Import(ctx, strings.NewReader(strings.Join(lines, "")), "all", roomstate.ImportOptions{})
	require.NoError(t, err)
	room, err = st.Room(ctx, res.Rooms[0])
	require.NoError(t, err)
	rep, err := resolver.Replay(ctx, room, resolver.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, len(lines)-200, rep.Computed)
	// The new events, and at most their auth events and those of the states they
	// resolve: far fewer than the room.
	needed := map[string]bool{}
	for _, l := range lines[200:] {
		var e struct {
			AuthEvents []json.RawMessage `json:"auth_events"`
		}
		require.NoError(t, json.Unmarshal([]byte(l), &e))
		for _, a := range e.AuthEvents {
			var id string
			if json.Unmarshal(a, &id) != nil { // v1-2: [event ID, hashes]
				var pair []json.RawMessage
				require.NoError(t, json.Unmarshal(a, &pair))
				require.NoError(t, json.Unmarshal(pair[0], &id))
			}
			needed[id] = true
		}
	}
	t.Logf("computed %d, parsed %d, auth events of the new events %d", rep.Computed, rep.EventsLoaded, len(needed))
	require.LessOrEqual(t, rep.EventsLoaded, rep.Computed+len(needed))
}
