package resolver_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/testrooms"
	"github.com/mtxdb/mtxdb/testrooms/gen"
)

// memberAuthRooms are the rooms the stand-in tests read: every real room and
// generated rooms of several versions with kicks, bans, invites and rejections.
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
	return dirs
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

// checkAll is the outcome of the rules on auth_events and of the authorization
// rules: "" when allowed, else the reason.
func checkAll(p gomatrixserverlib.PDU, auth []gomatrixserverlib.PDU) string {
	if err := resolver.CheckAuthEvents(p, auth, nil, nil); err != nil {
		return "auth events: " + err.Error()
	}
	if err := resolver.AllowedList(p, auth); err != nil {
		return err.Error()
	}
	return ""
}

// TestReplayWithoutPDUCache replays rooms with the PDU cache at one entry, so that
// authorisation and resolution take every auth event from the stand-ins or from
// the store, and compares every event's state record (before, after, rejection
// and its reason) and the room head with a replay at the default size.
func TestReplayWithoutPDUCache(t *testing.T) {
	for _, dir := range memberAuthRooms(t) {
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

type replayed struct {
	head   roomstate.Head
	states map[string]roomstate.EventState
}

func replayRecords(t *testing.T, dir string) replayed {
	t.Helper()
	eng, err := packstore.Open(packstore.DefaultOptions(t.TempDir()))
	require.NoError(t, err)
	defer eng.Close()
	st := roomstate.New(eng)
	f, err := os.Open(filepath.Join(dir, "events.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	res, err := st.Import(f, dir, roomstate.ImportOptions{})
	require.NoError(t, err)
	out := replayed{states: map[string]roomstate.EventState{}}
	for _, id := range res.Rooms {
		room, err := st.Room(id)
		require.NoError(t, err)
		_, err = resolver.Replay(room, resolver.ReplayOptions{})
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
