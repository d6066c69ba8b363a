package resolver_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/authrules"
	"github.com/mtxdb/mtxdb/resolver"
)

// scriptedRoomVersions are the room versions scriptedRooms writes a room of.
var scriptedRoomVersions = []string{"1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12"}

// scriptedRooms writes, for every room version 1-12, a small room with what the
// real and generated rooms lack: a third-party invite (m.room.third_party_invite
// and an invite whose signed object its public key verifies), knocks (allowed
// from v7), a restricted join through join_authorised_via_users_server (from v8),
// m.room.aliases (v1-5), a redaction (v1-2 read its redacts), a member content
// that names its membership as "Membership", and two forks that merge with
// conflicting power events (a power levels change against a kick, a ban against
// a join rules change). Each event's auth events are chosen from the state before
// it as this test tracks it (its own rules, resolver.ResolveMaps at a merge);
// events the rules reject stay in the room, as a misbehaving server sends them.
// It returns the rooms' directories (events.jsonl each).
func scriptedRooms(t *testing.T) []string {
	t.Helper()
	var dirs []string
	for _, v := range scriptedRoomVersions {
		dir := filepath.Join(t.TempDir(), "scripted-v"+v)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		writeScriptedRoom(t, v, dir)
		dirs = append(dirs, dir)
	}
	return dirs
}

// mapSource is an EventSource over parsed PDUs held in memory.
type mapSource map[string]gomatrixserverlib.PDU

func (m mapSource) Event(id string) (gomatrixserverlib.PDU, error) {
	if p, ok := m[id]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("no event %s", id)
}
func (m mapSource) Rejected(string) bool { return false }

func writeScriptedRoom(t *testing.T, version, dir string) {
	t.Helper()
	verImpl := gomatrixserverlib.MustGetRoomVersion(gomatrixserverlib.RoomVersion(version))
	v, err := strconv.Atoi(version)
	require.NoError(t, err)
	signKey := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))
	tpiKey := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{9}, ed25519.SeedSize))
	const a, b, c, d, e, f = "@a:s1.test", "@b:s2.test", "@c:s1.test", "@d:s2.test", "@e:s3.test", "@f:s3.test"
	roomID := "!scripted:s1.test"
	src := mapSource{}
	depth := map[string]int64{}
	ts := time.Unix(1_700_000_000, 0)
	var out bytes.Buffer

	type state = resolver.StateMap
	// emit builds, signs and writes one event with prev_events prev and auth
	// events chosen from st; a state event the rules allow is put in st.
	emit := func(st state, prev []string, sender, typ string, sk *string, content any, redacts string) string {
		t.Helper()
		keys := []resolver.Key{{Type: spec.MRoomPowerLevels}, {Type: spec.MRoomMember, StateKey: sender}}
		if v <= 11 {
			keys = append(keys, resolver.Key{Type: spec.MRoomCreate})
		}
		raw, err := json.Marshal(content)
		require.NoError(t, err)
		if typ == spec.MRoomMember {
			var mc gomatrixserverlib.MemberContent
			_ = json.Unmarshal(raw, &mc)
			keys = append(keys, resolver.Key{Type: spec.MRoomMember, StateKey: *sk})
			switch mc.Membership {
			case spec.Join, spec.Invite, spec.Knock:
				keys = append(keys, resolver.Key{Type: spec.MRoomJoinRules})
			}
			if mc.ThirdPartyInvite != nil {
				keys = append(keys, resolver.Key{Type: spec.MRoomThirdPartyInvite, StateKey: mc.ThirdPartyInvite.Signed.Token})
			}
			if mc.AuthorisedVia != "" && v >= 8 {
				keys = append(keys, resolver.Key{Type: spec.MRoomMember, StateKey: mc.AuthorisedVia})
			}
		}
		var auth []string
		var authPDUs []gomatrixserverlib.PDU
		seen := map[string]bool{}
		if typ != spec.MRoomCreate {
			for _, k := range keys {
				if id, ok := st[k]; ok && !seen[id] {
					seen[id] = true
					auth = append(auth, id)
					authPDUs = append(authPDUs, src[id])
				}
			}
		}
		var dep int64
		for _, p := range prev {
			dep = max(dep, depth[p])
		}
		proto := gomatrixserverlib.ProtoEvent{SenderID: sender, RoomID: roomID, Type: typ, StateKey: sk,
			PrevEvents: prev, AuthEvents: auth, Depth: dep + 1, Redacts: redacts, Content: raw}
		if auth == nil {
			proto.AuthEvents = []string{}
		}
		if prev == nil {
			proto.PrevEvents = []string{}
		}
		if v >= 12 && typ == spec.MRoomCreate {
			proto.RoomID = ""
		}
		_, origin, err := gomatrixserverlib.SplitID('@', sender)
		require.NoError(t, err)
		p, err := verImpl.NewEventBuilderFromProtoEvent(&proto).Build(ts, origin, "ed25519:1", signKey)
		require.NoError(t, err, "room version %s: %s by %s", version, typ, sender)
		ts = ts.Add(time.Second)
		if v >= 12 && typ == spec.MRoomCreate {
			roomID = "!" + p.EventID()[1:]
		}
		out.Write(p.JSON())
		out.WriteByte('\n')
		src[p.EventID()] = p
		depth[p.EventID()] = dep + 1
		if v >= 12 && typ != spec.MRoomCreate {
			authPDUs = append(authPDUs, src["$"+roomID[1:]]) // the create event the room ID names
		}
		if sk != nil {
			if typ == spec.MRoomCreate || authrules.Authorize(p, authPDUs) == nil {
				st[resolver.Key{Type: typ, StateKey: *sk}] = p.EventID()
			}
		}
		return p.EventID()
	}
	empty := ""
	member := func(m string) map[string]any { return map[string]any{"membership": m} }
	key := func(s string) *string { return &s }
	st := state{}
	createContent := map[string]any{"room_version": version}
	if v <= 10 {
		createContent["creator"] = a
	}
	tip := emit(st, nil, a, spec.MRoomCreate, &empty, createContent, "")
	tip = emit(st, []string{tip}, a, spec.MRoomMember, key(a), member(spec.Join), "")
	users := map[string]any{b: 50}
	if v <= 11 {
		users[a] = 100
	}
	pl := map[string]any{"users": users, "kick": 50, "ban": 50, "invite": 0, "redact": 50, "state_default": 50, "events_default": 0, "users_default": 0}
	tip = emit(st, []string{tip}, a, spec.MRoomPowerLevels, &empty, pl, "")
	tip = emit(st, []string{tip}, a, spec.MRoomJoinRules, &empty, map[string]any{"join_rule": spec.Public}, "")
	for _, u := range []string{b, c} {
		tip = emit(st, []string{tip}, u, spec.MRoomMember, key(u), member(spec.Join), "")
	}
	// A member content that names its membership under another case: rejected by
	// the member rule (no "membership"), the same parsed or not.
	tip = emit(st, []string{tip}, c, spec.MRoomMember, key(c), map[string]any{"Membership": spec.Join, "displayname": "C"}, "")
	if v <= 5 {
		tip = emit(st, []string{tip}, a, spec.MRoomAliases, key("s1.test"), map[string]any{"aliases": []string{"#x:s1.test"}}, "")
		tip = emit(st, []string{tip}, b, spec.MRoomAliases, key("s1.test"), map[string]any{"aliases": []string{"#y:s1.test"}}, "")
	}
	msg := emit(st, []string{tip}, c, "m.room.message", nil, map[string]any{"body": "hello"}, "")
	tip = emit(st, []string{msg}, b, spec.MRoomRedaction, nil, map[string]any{"redacts": msg}, msg)

	// A third-party invite for d, then d joins.
	tpiPub := tpiKey.Public().(ed25519.PublicKey)
	tip = emit(st, []string{tip}, a, spec.MRoomThirdPartyInvite, key("tok1"), map[string]any{"display_name": "d...",
		"key_validity_url": "https://id.test/isvalid", "public_key": base64.RawStdEncoding.EncodeToString(tpiPub),
		"public_keys": []any{map[string]any{"public_key": base64.RawStdEncoding.EncodeToString(tpiPub)}}}, "")
	signedRaw, err := json.Marshal(map[string]any{"mxid": d, "token": "tok1"})
	require.NoError(t, err)
	signedRaw, err = gomatrixserverlib.SignJSON("id.test", "ed25519:0", tpiKey, signedRaw)
	require.NoError(t, err)
	tip = emit(st, []string{tip}, a, spec.MRoomMember, key(d), map[string]any{"membership": spec.Invite,
		"third_party_invite": map[string]any{"display_name": "d...", "signed": json.RawMessage(signedRaw)}}, "")
	tip = emit(st, []string{tip}, d, spec.MRoomMember, key(d), member(spec.Join), "")

	// Knocks (rejected before v7), then an invite of the knocker.
	tip = emit(st, []string{tip}, a, spec.MRoomJoinRules, &empty, map[string]any{"join_rule": spec.Knock}, "")
	tip = emit(st, []string{tip}, e, spec.MRoomMember, key(e), member(spec.Knock), "")
	tip = emit(st, []string{tip}, a, spec.MRoomMember, key(e), member(spec.Invite), "")
	tip = emit(st, []string{tip}, e, spec.MRoomMember, key(e), member(spec.Join), "")

	// A restricted join (rejected before v8), and one naming a user without the
	// invite level.
	tip = emit(st, []string{tip}, a, spec.MRoomJoinRules, &empty, map[string]any{"join_rule": spec.Restricted,
		"allow": []any{map[string]any{"type": "m.room_membership", "room_id": "!other:s1.test"}}}, "")
	tip = emit(st, []string{tip}, f, spec.MRoomMember, key(f), map[string]any{"membership": spec.Join, "join_authorised_via_users_server": a}, "")
	tip = emit(st, []string{tip}, a, spec.MRoomPowerLevels, &empty, map[string]any{"users": users, "invite": 50}, "")
	tip = emit(st, []string{tip}, f, spec.MRoomMember, key(f), member(spec.Leave), "")
	tip = emit(st, []string{tip}, f, spec.MRoomMember, key(f), map[string]any{"membership": spec.Join, "join_authorised_via_users_server": c}, "")

	// Two forks, each merged by a message whose state before is resolved here.
	merge := func(x, y state, xTip, yTip string) (state, string) {
		t.Helper()
		resolved, err := resolver.ResolveMaps(gomatrixserverlib.RoomVersion(version), []resolver.StateMap{x, y}, src)
		require.NoError(t, err, "room version %s: merge", version)
		tip := emit(resolved, []string{xTip, yTip}, a, "m.room.message", nil, map[string]any{"body": "merged"}, "")
		return resolved, tip
	}
	fork := func(st state) state {
		out := state{}
		for k, id := range st {
			out[k] = id
		}
		return out
	}
	x, y := fork(st), fork(st)
	xTip := emit(x, []string{tip}, a, spec.MRoomPowerLevels, &empty, map[string]any{"users": map[string]any{a: 100, c: 60}, "kick": 50, "ban": 50}, "")
	if v >= 12 {
		xTip = emit(x, []string{tip}, a, spec.MRoomPowerLevels, &empty, map[string]any{"users": map[string]any{c: 60}, "kick": 50, "ban": 50}, "")
	}
	xTip = emit(x, []string{xTip}, a, spec.MRoomMember, key(d), member(spec.Ban), "")
	yTip := emit(y, []string{tip}, b, spec.MRoomMember, key(c), member(spec.Leave), "")
	yTip = emit(y, []string{yTip}, b, "m.room.topic", &empty, map[string]any{"topic": "b's"}, "")
	yTip = emit(y, []string{yTip}, d, spec.MRoomMember, key(d), map[string]any{"membership": spec.Leave, "reason": "bye"}, "")
	st, tip = merge(x, y, xTip, yTip)

	x, y = fork(st), fork(st)
	xTip = emit(x, []string{tip}, a, spec.MRoomMember, key(e), member(spec.Ban), "")
	xTip = emit(x, []string{xTip}, c, spec.MRoomMember, key(b), member(spec.Leave), "")
	yTip = emit(y, []string{tip}, a, spec.MRoomJoinRules, &empty, map[string]any{"join_rule": spec.Public}, "")
	yTip = emit(y, []string{yTip}, e, spec.MRoomMember, key(e), member(spec.Leave), "")
	yTip = emit(y, []string{yTip}, c, spec.MRoomMember, key(c), member(spec.Join), "")
	_, _ = merge(x, y, xTip, yTip)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "events.jsonl"), out.Bytes(), 0o644))
}

// TestScriptedRooms checks that the scripted rooms hold what they are for: in
// every room version the third-party invite is accepted and the "Membership"
// join rejected, the knock is accepted from v7 and the restricted join through a
// user with the invite level from v8, and both merges are replayed.
func TestScriptedRooms(t *testing.T) {
	for i, dir := range scriptedRooms(t) {
		version := scriptedRoomVersions[i]
		v, err := strconv.Atoi(version)
		require.NoError(t, err)
		got := replayRecords(t, dir)
		seen := map[string]bool{}
		merges := 0
		for _, p := range loadPDUs(t, dir).order {
			st, ok := got.states[p.EventID()]
			require.True(t, ok, "room version %s: event %s has no state record", version, p.EventID())
			if len(p.PrevEventIDs()) == 2 {
				merges++
			}
			if p.Type() != spec.MRoomMember {
				continue
			}
			var c map[string]any
			require.NoError(t, json.Unmarshal(p.Content(), &c))
			var what string
			var accepted bool
			switch {
			case c["Membership"] != nil:
				what, accepted = "Membership", false
			case c["third_party_invite"] != nil:
				what, accepted = "third-party invite", true
			case c["membership"] == spec.Knock:
				what, accepted = "knock", v >= 7
			case c["join_authorised_via_users_server"] == "@a:s1.test":
				what, accepted = "restricted join", v >= 8
			default:
				continue
			}
			seen[what] = true
			require.Equal(t, accepted, !st.Rejected, "room version %s: %s %s: %s", version, what, p.EventID(), st.Reason)
		}
		require.Len(t, seen, 4, "room version %s", version)
		require.Equal(t, 2, merges, "room version %s", version)
	}
}
