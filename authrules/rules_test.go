package authrules_test

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/authrules"
	"github.com/mtxdb/mtxdb/pdu"
)

// update rewrites docs/auth-rules.md instead of comparing it.
var update = flag.Bool("update", false, "rewrite docs/auth-rules.md")

// Users of the conformance rooms: alice creates the room; bob and dave are joined;
// carol is not in the room.
const (
	alice = "@alice:a.test"
	bob   = "@bob:b.test"
	carol = "@carol:c.test"
	dave  = "@dave:a.test"
)

// bld builds the events of one conformance case in one room version.
type bld struct {
	t      testing.TB
	v      int
	ver    gomatrixserverlib.IRoomVersion
	key    ed25519.PrivateKey
	ts     int64
	roomID string
	create gomatrixserverlib.PDU
	// tpiKey signs third-party invites.
	tpiKey ed25519.PrivateKey
}

func newBld(t testing.TB, v int, createContent map[string]any) *bld {
	ver, err := gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersion(fmt.Sprint(v)))
	require.NoError(t, err)
	seed := sha256.Sum256([]byte("authrules"))
	b := &bld{t: t, v: v, ver: ver, key: ed25519.NewKeyFromSeed(seed[:]), ts: 1700000000000,
		tpiKey: ed25519.NewKeyFromSeed(seed[:])}
	b.roomID = "!room:a.test"
	c := map[string]any{"room_version": fmt.Sprint(v)}
	if v <= 10 {
		c["creator"] = alice
	}
	for k, x := range createContent {
		if x == nil {
			delete(c, k)
		} else {
			c[k] = x
		}
	}
	b.create = b.ev(alice, spec.MRoomCreate, ptr(""), c, nil, nil, nil)
	if v >= 12 {
		b.roomID = "!" + strings.TrimPrefix(b.create.EventID(), "$")
	}
	return b
}

func ptr(s string) *string { return &s }

// ev builds an event; mod may change the proto event before it is built.
func (b *bld) ev(sender, typ string, sk *string, content any, prev, auth []string, mod func(*gomatrixserverlib.ProtoEvent)) gomatrixserverlib.PDU {
	b.t.Helper()
	raw, err := json.Marshal(content)
	require.NoError(b.t, err)
	if prev == nil {
		prev = []string{}
	}
	if auth == nil {
		auth = []string{}
	}
	proto := gomatrixserverlib.ProtoEvent{SenderID: sender, RoomID: b.roomID, Type: typ, StateKey: sk,
		Content: raw, PrevEvents: prev, AuthEvents: auth, Depth: int64(len(prev) + 1)}
	if typ == spec.MRoomCreate && b.v >= 12 {
		proto.RoomID = ""
	}
	if mod != nil {
		mod(&proto)
	}
	b.ts++
	origin := spec.ServerName(strings.SplitN(sender, ":", 2)[1])
	p, err := b.ver.NewEventBuilderFromProtoEvent(&proto).Build(time.UnixMilli(b.ts), origin, "ed25519:1", b.key)
	require.NoError(b.t, err, "build %s", typ)
	return p
}

func (b *bld) member(sender, target, membership string, extra map[string]any) gomatrixserverlib.PDU {
	c := map[string]any{"membership": membership}
	for k, x := range extra {
		c[k] = x
	}
	return b.ev(sender, spec.MRoomMember, ptr(target), c, []string{b.create.EventID()}, nil, nil)
}

// pl is a power levels event by alice: users maps bob and dave to 0 unless given,
// alice to 100 (not in v12: she is its creator).
func (b *bld) pl(sender string, c map[string]any) gomatrixserverlib.PDU {
	users := map[string]any{bob: 0, dave: 0}
	if b.v < 12 {
		users[alice] = 100
	}
	if u, ok := c["users"].(map[string]any); ok {
		for k, x := range u {
			if x == nil {
				delete(users, k)
			} else {
				users[k] = x
			}
		}
	}
	content := map[string]any{"users": users}
	for k, x := range c {
		if k != "users" {
			content[k] = x
		}
	}
	return b.ev(sender, spec.MRoomPowerLevels, ptr(""), content, []string{b.create.EventID()}, nil, nil)
}

func (b *bld) jr(rule string) gomatrixserverlib.PDU {
	return b.ev(alice, spec.MRoomJoinRules, ptr(""), map[string]any{"join_rule": rule}, []string{b.create.EventID()}, nil, nil)
}

func (b *bld) msg(sender string) gomatrixserverlib.PDU {
	return b.ev(sender, "m.room.message", nil, map[string]any{"body": "hi"}, []string{b.create.EventID()}, nil, nil)
}

// base is the usual state: the create event, alice, bob and dave joined, power
// levels, a public join rule; extra events replace those of their key.
func (b *bld) base(extra ...gomatrixserverlib.PDU) []gomatrixserverlib.PDU {
	st := []gomatrixserverlib.PDU{b.create, b.member(alice, alice, spec.Join, nil), b.member(bob, bob, spec.Join, nil),
		b.member(dave, dave, spec.Join, nil), b.pl(alice, nil), b.jr(spec.Public)}
	for _, e := range extra {
		replaced := false
		for i, s := range st {
			if s.Type() == e.Type() && *s.StateKey() == *e.StateKey() {
				st[i], replaced = e, true
			}
		}
		if !replaced {
			st = append(st, e)
		}
	}
	return st
}

// Where a third-party invite event holds its key (tpi).
const (
	keyBoth       = iota // public_key and public_keys
	keyPublicKey         // only public_key (public_keys holds another key)
	keyPublicKeys        // only public_keys (public_key is another key)
)

// tpi is a third-party invite event by sender with the token "tok", its key where
// where says.
func (b *bld) tpi(sender string, where int) gomatrixserverlib.PDU {
	pub := base64.RawStdEncoding.EncodeToString(b.tpiKey.Public().(ed25519.PublicKey))
	other := base64.RawStdEncoding.EncodeToString(make([]byte, 32))
	c := map[string]any{"display_name": "c", "key_validity_url": "https://id.test/v", "public_key": pub,
		"public_keys": []map[string]any{{"public_key": pub}}}
	switch where {
	case keyPublicKey:
		c["public_keys"] = []map[string]any{{"public_key": other}}
	case keyPublicKeys:
		c["public_key"] = other
	}
	return b.ev(sender, spec.MRoomThirdPartyInvite, ptr("tok"), c, []string{b.create.EventID()}, nil, nil)
}

// tpiContent is an invite's third_party_invite: signed for mxid with token,
// signed by key (nil: the third-party invite key).
func (b *bld) tpiContent(mxid, token string, key ed25519.PrivateKey) map[string]any {
	if key == nil {
		key = b.tpiKey
	}
	signed := map[string]any{"mxid": mxid}
	if token != "" {
		signed["token"] = token
	}
	raw, _ := json.Marshal(signed)
	s, err := gomatrixserverlib.SignJSON("id.test", "ed25519:0", key, raw)
	require.NoError(b.t, err)
	var out map[string]any
	require.NoError(b.t, json.Unmarshal(s, &out))
	return map[string]any{"display_name": "c", "signed": out}
}

// ruleCase is one rule's pair: build returns the event and the state (or, for
// auth-events cases, the auth events it cites) for the breaking event (bad) or its
// twin. badRule is the rule that must reject the breaking event (default: the rule
// itself, for rules that reject); for rules that allow, the twin must be allowed by
// the rule itself.
type ruleCase struct {
	build   func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU)
	badRule string
	// auth: the case is about auth_events (CheckAuthEvents with the second result as
	// the cited events); rejected: events the check is told were rejected.
	auth     bool
	rejected func(b *bld, auth []gomatrixserverlib.PDU) map[string]bool
	// create: the bad event's room is built with this create content.
	create map[string]any
	// needsKeys: the rule needs the servers' signing keys; not applied without them.
	needsKeys bool
}

var kings = map[string]any{"users": map[string]any{bob: 50}, "ban": 75, "events": map[string]any{"m.room.power_levels": 50, "m.room.topic": 100, "m.room.name": 50}}

// ruleCases: one per leaf rule ID of ruleOutline (set in init: some cases reuse
// others).
var ruleCases map[string]ruleCase

// make builds the case's breaking event (bad) or its twin in version v, with the
// events it is checked against (cited by it when the case is about auth_events).
func (c ruleCase) make(t testing.TB, v int, r authrules.Rule, bad bool) (*bld, gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
	var cc map[string]any
	if bad || r.ID == "federate" {
		cc = c.create
	}
	b := newBld(t, v, cc)
	p, evs := c.build(b, bad)
	if c.auth {
		p = b.cite(p, evs)
	}
	return b, p, evs
}

func init() { ruleCases = ruleCaseTable() }

func ruleCaseTable() map[string]ruleCase {
	return map[string]ruleCase{
		"create.prev_events": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			if !bad {
				return b.create, nil
			}
			return b.ev(alice, spec.MRoomCreate, ptr(""), createContent(b), []string{"$x:a.test"}, nil, roomless(b)), nil
		}},
		"create.room_domain": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			if !bad {
				return b.create, nil
			}
			return b.ev(alice, spec.MRoomCreate, ptr(""), createContent(b), nil, nil, func(p *gomatrixserverlib.ProtoEvent) { p.RoomID = "!room:b.test" }), nil
		}},
		"create.room_id": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			if !bad {
				return b.create, nil
			}
			p := b.create
			var m map[string]any
			require.NoError(b.t, json.Unmarshal(p.JSON(), &m))
			m["room_id"] = "!" + strings.Repeat("A", 43)
			raw, _ := json.Marshal(m)
			q, err := b.ver.NewEventFromTrustedJSON(raw, false)
			require.NoError(b.t, err)
			return q, nil
		}},
		"create.room_version": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			if !bad {
				return b.create, nil
			}
			c := createContent(b)
			c["room_version"] = "99"
			return b.ev(alice, spec.MRoomCreate, ptr(""), c, nil, nil, roomless(b)), nil
		}},
		"create.creator": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			if !bad {
				return b.create, nil
			}
			c := createContent(b)
			delete(c, "creator")
			return b.ev(alice, spec.MRoomCreate, ptr(""), c, nil, nil, roomless(b)), nil
		}},
		"create.additional_creators": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			c := createContent(b)
			c["additional_creators"] = []string{bob}
			if bad {
				c["additional_creators"] = []string{"bob"}
			}
			return b.ev(alice, spec.MRoomCreate, ptr(""), c, nil, nil, roomless(b)), nil
		}},
		"create.allow": {badRule: "create.prev_events", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			return ruleCases["create.prev_events"].build(b, bad)
		}},
		"room_id.create": {auth: true, build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			if !bad {
				return b.msg(bob), b.base()[2:3]
			}
			p := b.ev(bob, "m.room.message", nil, map[string]any{"body": "hi"}, nil, nil,
				func(p *gomatrixserverlib.ProtoEvent) { p.RoomID = "!" + strings.Repeat("B", 43) })
			return p, b.base()[2:3]
		}},
		"auth_events.duplicate": {auth: true, build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			st := b.base()
			auth := citeable(b, st[1], st[4])
			if bad {
				auth = append(auth, st[1])
			}
			return b.msg(alice), auth
		}},
		"auth_events.selection": {auth: true, build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			st := b.base()
			auth := citeable(b, st[1], st[4])
			if bad {
				auth = append(auth, st[5]) // join rules, for a topic
			}
			return b.ev(alice, "m.room.topic", ptr(""), map[string]any{"topic": "t"}, []string{b.create.EventID()}, nil, nil), auth
		}},
		"auth_events.rejected": {auth: true, build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			st := b.base()
			return b.msg(alice), citeable(b, st[1], st[4])
		}, rejected: func(b *bld, auth []gomatrixserverlib.PDU) map[string]bool {
			return map[string]bool{auth[len(auth)-1].EventID(): true}
		}},
		"auth_events.no_create": {auth: true, build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			st := b.base()
			if bad {
				return b.msg(alice), []gomatrixserverlib.PDU{st[1], st[4]}
			}
			return b.msg(alice), citeable(b, st[1], st[4])
		}},
		"auth_events.other_room": {auth: true, build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			st := b.base()
			join := st[1]
			if bad {
				other := "!other:a.test"
				if b.v >= 12 {
					other = "!" + strings.Repeat("C", 43)
				}
				join = b.ev(alice, spec.MRoomMember, ptr(alice), map[string]any{"membership": "join"}, []string{b.create.EventID()}, nil,
					func(p *gomatrixserverlib.ProtoEvent) { p.RoomID = other })
			}
			return b.msg(alice), citeable(b, join, st[4])
		}},
		"federate": {create: map[string]any{"m.federate": false}, build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			if bad {
				return b.msg(bob), b.base()
			}
			return b.msg(dave), b.base()
		}},
		"aliases.no_state_key": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			sk := ptr("a.test")
			if bad {
				sk = nil
			}
			return b.ev(alice, spec.MRoomAliases, sk, map[string]any{"aliases": []string{}}, []string{b.create.EventID()}, nil, nil), b.base()
		}},
		"aliases.domain": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			sk := "a.test"
			if bad {
				sk = "b.test"
			}
			return b.ev(alice, spec.MRoomAliases, ptr(sk), map[string]any{"aliases": []string{}}, []string{b.create.EventID()}, nil, nil), b.base()
		}},
		"aliases.allow": {badRule: "aliases.domain", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			sk := "c.test" // carol is not in the room: aliases need no membership
			if bad {
				sk = "a.test"
			}
			return b.ev(carol, spec.MRoomAliases, ptr(sk), map[string]any{"aliases": []string{}}, []string{b.create.EventID()}, nil, nil), b.base()
		}},
		"member.fields": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			if bad {
				return b.ev(carol, spec.MRoomMember, ptr(carol), map[string]any{"displayname": "c"}, []string{b.create.EventID()}, nil, nil), b.base()
			}
			return b.member(carol, carol, spec.Join, nil), b.base()
		}},
		"member.via.signature": {needsKeys: true},
		"join.first": {badRule: "join.reject", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			who := alice
			if bad {
				who = bob
			}
			return b.member(who, who, spec.Join, nil), []gomatrixserverlib.PDU{b.create}
		}},
		"join.sender": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			if bad {
				return b.member(alice, carol, spec.Join, nil), b.base()
			}
			return b.member(carol, carol, spec.Join, nil), b.base()
		}},
		"join.banned": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			m := spec.Leave
			if bad {
				m = spec.Ban
			}
			return b.member(carol, carol, spec.Join, nil), b.base(b.member(alice, carol, m, nil))
		}},
		"join.invite": {badRule: "join.reject", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			st := b.base(b.jr(spec.Invite))
			if !bad {
				st = b.base(b.jr(spec.Invite), b.member(alice, carol, spec.Invite, nil))
			}
			return b.member(carol, carol, spec.Join, nil), st
		}},
		"join.restricted.member": {badRule: "join.restricted.via", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			st := b.base(b.jr(spec.Restricted))
			if !bad {
				st = b.base(b.jr(spec.Restricted), b.member(alice, carol, spec.Invite, nil))
			}
			return b.member(carol, carol, spec.Join, nil), st
		}},
		"join.restricted.via": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			via := alice
			if bad {
				via = carol
			}
			return b.member(carol, carol, spec.Join, map[string]any{"join_authorised_via_users_server": via}), b.base(b.jr(spec.Restricted))
		}},
		"join.restricted.allow": {badRule: "join.restricted.via", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			if bad {
				return b.member(carol, carol, spec.Join, nil), b.base(b.jr(spec.Restricted))
			}
			return ruleCases["join.restricted.via"].build(b, false)
		}},
		"join.public": {badRule: "join.reject", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			rule := spec.Public
			if bad {
				rule = "private"
			}
			return b.member(carol, carol, spec.Join, nil), b.base(b.jr(rule))
		}},
		"join.reject": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			return ruleCases["join.public"].build(b, bad)
		}},
		"invite.tpi.banned": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			st := b.base(b.tpi(alice, keyBoth))
			if bad {
				st = b.base(b.tpi(alice, keyBoth), b.member(alice, carol, spec.Ban, nil))
			}
			return b.member(alice, carol, spec.Invite, map[string]any{"third_party_invite": b.tpiContent(carol, "tok", nil)}), st
		}},
		"invite.tpi.signed": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			c := b.tpiContent(carol, "tok", nil)
			if bad {
				delete(c, "signed")
			}
			return b.member(alice, carol, spec.Invite, map[string]any{"third_party_invite": c}), b.base(b.tpi(alice, keyBoth))
		}},
		"invite.tpi.mxid_token": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			tok := "tok"
			if bad {
				tok = ""
			}
			return b.member(alice, carol, spec.Invite, map[string]any{"third_party_invite": b.tpiContent(carol, tok, nil)}), b.base(b.tpi(alice, keyBoth))
		}},
		"invite.tpi.mxid": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			mxid := carol
			if bad {
				mxid = "@eve:c.test"
			}
			return b.member(alice, carol, spec.Invite, map[string]any{"third_party_invite": b.tpiContent(mxid, "tok", nil)}), b.base(b.tpi(alice, keyBoth))
		}},
		"invite.tpi.event": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			st := b.base(b.tpi(alice, keyBoth))
			if bad {
				st = b.base()
			}
			return b.member(alice, carol, spec.Invite, map[string]any{"third_party_invite": b.tpiContent(carol, "tok", nil)}), st
		}},
		"invite.tpi.sender": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			by := alice
			if bad {
				by = dave
			}
			return b.member(alice, carol, spec.Invite, map[string]any{"third_party_invite": b.tpiContent(carol, "tok", nil)}), b.base(b.tpi(by, keyBoth))
		}},
		"invite.tpi.signature.public_key": {badRule: "invite.tpi.reject", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			return tpiSigned(b, bad, keyPublicKey)
		}},
		"invite.tpi.signature.public_keys": {badRule: "invite.tpi.reject", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			return tpiSigned(b, bad, keyPublicKeys)
		}},
		"invite.tpi.reject": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			return tpiSigned(b, bad, keyBoth)
		}},
		"invite.sender": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			by := alice
			if bad {
				by = "@eve:c.test"
			}
			return b.member(by, carol, spec.Invite, nil), b.base()
		}},
		"invite.target": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			target := carol
			if bad {
				target = bob
			}
			return b.member(alice, target, spec.Invite, nil), b.base()
		}},
		"invite.allow": {badRule: "invite.reject", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			by := alice
			if bad {
				by = bob
			}
			return b.member(by, carol, spec.Invite, nil), b.base(b.pl(alice, map[string]any{"invite": 50}))
		}},
		"invite.reject": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			return ruleCases["invite.allow"].build(b, bad)
		}},
		"leave.self": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			who := bob
			if bad {
				who = carol
			}
			return b.member(who, who, spec.Leave, nil), b.base()
		}},
		"leave.sender": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			by := alice
			if bad {
				by = carol
			}
			return b.member(by, bob, spec.Leave, nil), b.base()
		}},
		"leave.banned": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			by := alice
			if bad {
				by = bob // level 50: the kick level, not the ban level 75
			}
			return b.member(by, carol, spec.Leave, nil), b.base(b.pl(alice, kings), b.member(alice, carol, spec.Ban, nil))
		}},
		"leave.kick": {badRule: "leave.reject", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			by, target := alice, bob
			if bad {
				by, target = bob, alice
			}
			return b.member(by, target, spec.Leave, nil), b.base(b.pl(alice, kings))
		}},
		"leave.reject": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			return ruleCases["leave.kick"].build(b, bad)
		}},
		"ban.sender": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			by := alice
			if bad {
				by = carol
			}
			return b.member(by, bob, spec.Ban, nil), b.base()
		}},
		"ban.allow": {badRule: "ban.reject", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			by, target := alice, bob
			if bad {
				by, target = bob, dave
			}
			return b.member(by, target, spec.Ban, nil), b.base(b.pl(alice, kings))
		}},
		"ban.reject": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			return ruleCases["ban.allow"].build(b, bad)
		}},
		"knock.join_rule": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			rule := spec.Knock
			if bad {
				rule = spec.Public
			}
			return b.member(carol, carol, spec.Knock, nil), b.base(b.jr(rule))
		}},
		"knock.sender": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			by := carol
			if bad {
				by = alice
			}
			return b.member(by, carol, spec.Knock, nil), b.base(b.jr(spec.Knock))
		}},
		"knock.allow": {badRule: "knock.reject", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			who := carol
			if bad {
				who = bob
			}
			return b.member(who, who, spec.Knock, nil), b.base(b.jr(spec.Knock))
		}},
		"knock.reject": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			return ruleCases["knock.allow"].build(b, bad)
		}},
		"member.unknown": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			m := spec.Join
			if bad {
				m = "dance"
			}
			return b.member(carol, carol, m, nil), b.base()
		}},
		"sender": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			if bad {
				return b.msg(carol), b.base()
			}
			return b.msg(bob), b.base()
		}},
		"third_party_invite.level": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			by := alice
			if bad {
				by = bob
			}
			return b.tpi(by, keyBoth), b.base(b.pl(alice, map[string]any{"invite": 50}))
		}},
		"required_level": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			by := alice
			if bad {
				by = bob
			}
			return b.ev(by, "m.room.name", ptr(""), map[string]any{"name": "n"}, []string{b.create.EventID()}, nil, nil), b.base()
		}},
		"state_key": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			sk := bob
			if bad {
				sk = dave
			}
			return b.ev(bob, "x.note", ptr(sk), map[string]any{}, []string{b.create.EventID()}, nil, nil),
				b.base(b.pl(alice, map[string]any{"events": map[string]any{"x.note": 0}}))
		}},
		"power_levels.integers": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			var ban any = 50
			if bad {
				ban = "50"
			}
			return b.pl(alice, map[string]any{"ban": ban}), b.base()
		}},
		"power_levels.maps": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			var lvl any = 50
			if bad {
				lvl = "50"
			}
			return b.pl(alice, map[string]any{"events": map[string]any{"m.room.name": lvl}}), b.base()
		}},
		"power_levels.users": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			u := map[string]any{carol: 10}
			if bad {
				u = map[string]any{"carol": 10}
			}
			return b.pl(alice, map[string]any{"users": u}), b.base()
		}},
		"power_levels.creators": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			u := map[string]any{carol: 10}
			if bad {
				u = map[string]any{alice: 100}
			}
			return b.pl(alice, map[string]any{"users": u}), b.base()
		}},
		"power_levels.first": {badRule: "power_levels.users", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			u := map[string]any{carol: 10}
			if bad {
				u = map[string]any{"carol": 10}
			}
			return b.pl(alice, map[string]any{"users": u}), []gomatrixserverlib.PDU{b.create, b.member(alice, alice, spec.Join, nil)}
		}},
		"power_levels.named.old": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			c := plChange(map[string]any{"kick": 40})
			if bad {
				c = plChange(map[string]any{"ban": 40}) // from 75, above bob's 50
			}
			return b.pl(bob, c), b.base(b.pl(alice, kings))
		}},
		"power_levels.named.new": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			c := plChange(map[string]any{"kick": 40})
			if bad {
				c = plChange(map[string]any{"kick": 60})
			}
			return b.pl(bob, c), b.base(b.pl(alice, kings))
		}},
		"power_levels.events_old.level": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			ev := map[string]any{"m.room.power_levels": 50, "m.room.topic": 100, "m.room.name": 40}
			if bad {
				ev = map[string]any{"m.room.power_levels": 50, "m.room.topic": 50, "m.room.name": 50}
			}
			return b.pl(bob, plChange(map[string]any{"events": ev})), b.base(b.pl(alice, kings))
		}},
		"power_levels.events_new.level": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			lvl := 40
			if bad {
				lvl = 60
			}
			ev := map[string]any{"m.room.power_levels": 50, "m.room.topic": 100, "m.room.name": 50, "x.new": lvl}
			return b.pl(bob, plChange(map[string]any{"events": ev})), b.base(b.pl(alice, kings))
		}},
		"power_levels.users_old.level": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			u := map[string]any{bob: 50, dave: 50, carol: 0}
			if bad {
				u = map[string]any{bob: 50, dave: 0, carol: 10}
			}
			old := map[string]any{"users": map[string]any{bob: 50, dave: 50, carol: 10}, "ban": 75,
				"events": map[string]any{"m.room.power_levels": 50, "m.room.topic": 100, "m.room.name": 50}}
			return b.pl(bob, plChangeFrom(old, map[string]any{"users": u})), b.base(b.pl(alice, old))
		}},
		"power_levels.users_new.level": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			lvl := 40
			if bad {
				lvl = 60
			}
			return b.pl(bob, plChange(map[string]any{"users": map[string]any{bob: 50, carol: lvl}})), b.base(b.pl(alice, kings))
		}},
		"power_levels.allow": {badRule: "power_levels.named.new", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			return ruleCases["power_levels.named.new"].build(b, bad)
		}},
		"redaction.level": {badRule: "redaction.reject", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			by := alice
			if bad {
				by = bob
			}
			return b.ev(by, spec.MRoomRedaction, nil, map[string]any{}, []string{b.create.EventID()}, nil,
				func(p *gomatrixserverlib.ProtoEvent) { p.Redacts = "$x:a.test" }), b.base()
		}},
		"redaction.domain": {badRule: "redaction.reject", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			target := "$x:b.test"
			if bad {
				target = "$x:a.test"
			}
			return b.ev(bob, spec.MRoomRedaction, nil, map[string]any{}, []string{b.create.EventID()}, nil,
				func(p *gomatrixserverlib.ProtoEvent) { p.Redacts = target }), b.base()
		}},
		"redaction.reject": {build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			return ruleCases["redaction.domain"].build(b, bad)
		}},
		"allow": {badRule: "sender", build: func(b *bld, bad bool) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
			return ruleCases["sender"].build(b, bad)
		}},
	}
}

// cite returns p with auth_events naming evs (re-parsed: its event ID in v3+
// changes with them).
func (b *bld) cite(p gomatrixserverlib.PDU, evs []gomatrixserverlib.PDU) gomatrixserverlib.PDU {
	var m map[string]any
	require.NoError(b.t, json.Unmarshal(p.JSON(), &m))
	ids := []any{}
	for _, e := range evs {
		if b.v < 3 {
			ids = append(ids, []any{e.EventID(), map[string]any{}})
		} else {
			ids = append(ids, e.EventID())
		}
	}
	m["auth_events"] = ids
	raw, err := json.Marshal(m)
	require.NoError(b.t, err)
	q, err := b.ver.NewEventFromTrustedJSON(raw, false)
	require.NoError(b.t, err)
	return q
}

func createContent(b *bld) map[string]any {
	var c map[string]any
	require.NoError(b.t, json.Unmarshal(b.create.Content(), &c))
	return c
}

func roomless(b *bld) func(*gomatrixserverlib.ProtoEvent) {
	return func(p *gomatrixserverlib.ProtoEvent) {
		if b.v >= 12 {
			p.RoomID = ""
		}
	}
}

// citeable is what an event may cite: in v1-11 the create event too.
func citeable(b *bld, evs ...gomatrixserverlib.PDU) []gomatrixserverlib.PDU {
	if b.v >= 12 {
		return evs
	}
	return append([]gomatrixserverlib.PDU{b.create}, evs...)
}

// plChange is the kings power levels with changes.
func plChange(ch map[string]any) map[string]any { return plChangeFrom(kings, ch) }

func plChangeFrom(from, ch map[string]any) map[string]any {
	out := map[string]any{}
	for k, x := range from {
		out[k] = x
	}
	for k, x := range ch {
		out[k] = x
	}
	return out
}

// tpiSigned is a third-party invite whose signed part is signed by the right key
// (where the third-party invite event holds it) or, bad, by another key.
func tpiSigned(b *bld, bad bool, where int) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU) {
	var key ed25519.PrivateKey
	if bad {
		s := sha256.Sum256([]byte("other"))
		key = ed25519.NewKeyFromSeed(s[:])
	}
	return b.member(alice, carol, spec.Invite, map[string]any{"third_party_invite": b.tpiContent(carol, "tok", key)}),
		b.base(b.tpi(alice, where))
}

// ruleRow is one line of docs/auth-rules.md.
type ruleRow struct {
	rule           authrules.Rule
	bad, twin      string // outcome by our rules
	gmslBad, gmslT string // outcome by gomatrixserverlib's Allowed alone
	by             string
}

// TestAuthRulesConformance checks, for every room version 1-12 and every leaf rule
// of its authorization rules, an event that breaks exactly that rule (rejected, the
// reason naming the rule: version, number, ID) and a twin that does not (accepted;
// for a rule that allows, accepted by that rule). It also runs gomatrixserverlib's
// Allowed alone on both, and writes the table to docs/auth-rules.md (-update) or
// compares it with that file.
func TestAuthRulesConformance(t *testing.T) {
	var rows [][]ruleRow
	for v := 1; v <= authrules.MaxVersion; v++ {
		var vr []ruleRow
		for _, r := range authrules.Rules(fmt.Sprint(v)) {
			if !r.Leaf {
				vr = append(vr, ruleRow{rule: r})
				continue
			}
			c, ok := ruleCases[r.ID]
			require.True(t, ok, "no conformance case for rule %s (%s) of v%d", r.Num, r.ID, v)
			if c.needsKeys {
				vr = append(vr, ruleRow{rule: r, bad: "—", twin: "—", gmslBad: "—", gmslT: "—", by: "us, at import with --keys (pdu.KeyRing; integration TestSignaturesWithKeys); not checkable without keys"})
				continue
			}
			row := ruleRow{rule: r}
			for _, bad := range []bool{true, false} {
				b, p, evs := c.make(t, v, r, bad)
				var rej map[string]bool
				if c.rejected != nil && bad {
					rej = c.rejected(b, evs)
				}
				dec, err := check(b, p, evs, c.auth, rej)
				gerr := gmslAllowed(b, p, evs, rej)
				name := fmt.Sprintf("v%d rule %s (%s) bad=%v", v, r.Num, r.ID, bad)
				if bad {
					want := c.badRule
					if want == "" {
						want = r.ID
					}
					var are *authrules.RuleError
					require.True(t, errors.As(err, &are), "%s: want a rejection by %s, got %v (decided by %s)", name, want, err, dec.Rule.ID)
					require.Equal(t, want, are.Rule.ID, "%s: %v", name, err)
					require.Contains(t, err.Error(), fmt.Sprintf("authorization rule %s of room version %d (%s", are.Rule.Num, v, want))
					row.bad = "rejected by " + are.Rule.Num
					row.gmslBad = outcome(gerr)
				} else {
					require.NoError(t, err, name)
					if !strings.HasSuffix(r.ID, ".reject") && !c.auth && isAllowRule(r) {
						require.Equal(t, r.ID, dec.Rule.ID, "%s: allowed by another rule", name)
					}
					row.twin = "accepted"
					if dec.Rule.Num != "" {
						row.twin = "accepted by " + dec.Rule.Num
					}
					row.gmslT = outcome(gerr)
				}
			}
			row.by = "us"
			if row.gmslBad != "accepted" {
				row.by = "us and gomatrixserverlib"
			}
			vr = append(vr, row)
		}
		rows = append(rows, vr)
	}
	doc := renderRules(rows)
	path := filepath.Join("..", "docs", "auth-rules.md")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(doc), 0o644))
		return
	}
	old, err := os.ReadFile(path)
	require.NoError(t, err, "run go test ./authrules -run TestAuthRulesConformance -update")
	require.Equal(t, string(old), doc, "docs/auth-rules.md is stale: go test ./authrules -run TestAuthRulesConformance -update")
}

func isAllowRule(r authrules.Rule) bool {
	return strings.HasSuffix(r.Text, "allow") || strings.Contains(r.Text, ": allow") || strings.HasPrefix(r.Text, "allow") ||
		strings.HasPrefix(r.ID, "invite.tpi.signature.")
}

func outcome(err error) string {
	if err != nil {
		return "rejected"
	}
	return "accepted"
}

// check runs our rules: CheckAuthEvents then CheckRules against the cited events
// (auth cases), or CheckRules against the state.
func check(b *bld, p gomatrixserverlib.PDU, evs []gomatrixserverlib.PDU, auth bool, rejected map[string]bool) (authrules.Decision, error) {
	var create gomatrixserverlib.PDU
	if b.v >= 12 {
		create = b.create
	}
	if auth {
		if err := authrules.CheckAuthEvents(p, evs, func(id string) bool { return rejected[id] }, create); err != nil {
			return authrules.Decision{}, err
		}
	}
	byKey := map[authrules.Key]gomatrixserverlib.PDU{}
	for _, e := range evs {
		if e.StateKey() != nil {
			byKey[authrules.Key{Type: e.Type(), StateKey: *e.StateKey()}] = e
		}
	}
	if create != nil {
		byKey[authrules.Key{Type: spec.MRoomCreate, StateKey: ""}] = create
	}
	return authrules.CheckRules(p, byKey, create)
}

// gmslAllowed is gomatrixserverlib's Allowed alone against the same events (with
// NewAuthEvents keeping one per key); rejected auth events are not its concern.
func gmslAllowed(b *bld, p gomatrixserverlib.PDU, evs []gomatrixserverlib.PDU, _ map[string]bool) error {
	return allowedOn(p, gmslList(b, p, evs))
}

// gmslList is the auth events gmslAllowed hands Allowed: the state events among
// evs, and in v12 the create event.
func gmslList(b *bld, p gomatrixserverlib.PDU, evs []gomatrixserverlib.PDU) []gomatrixserverlib.PDU {
	list := append([]gomatrixserverlib.PDU(nil), evs...)
	if b.v >= 12 && p.Type() != spec.MRoomCreate {
		list = append(list, b.create)
	}
	var keep []gomatrixserverlib.PDU
	for _, e := range list {
		if e.StateKey() != nil {
			keep = append(keep, e)
		}
	}
	return keep
}

// allowedOn is gomatrixserverlib's Allowed on p against list, a panic as an error.
func allowedOn(p gomatrixserverlib.PDU, list []gomatrixserverlib.PDU) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	ae, err := gomatrixserverlib.NewAuthEvents(list)
	if err != nil {
		return err
	}
	return gomatrixserverlib.Allowed(p, ae, pdu.UserIDForSender)
}

func renderRules(rows [][]ruleRow) string {
	var sb strings.Builder
	sb.WriteString(`# Authorization rules, room versions 1-12: who enforces each

Generated by ` + "`go test ./authrules -run TestAuthRulesConformance -update`" + ` (authrules/rules_test.go);
do not edit. Rules and numbers as each version's page of the Matrix specification
renders them (Matrix spec v1.19, each room version's "Authorisation rules";
matrix-org/matrix-spec commit d0ba2aa, whose content/rooms is v1.19's): v1-v2 share
one text, v3-v5 one, v8-v9 one; v6, v7, v10, v11 and v12 have their own. The v12 page's source numbers the auth_events room
check "5." after "3." and has two items "10."; rendered they are 3.4 and 10.11, as
here. The rule texts are ours (authrules/rules.go).

For every leaf rule the test builds an event that breaks exactly that rule and a twin
that does not, and checks them with our rules (authrules.CheckAuthEvents, then the others,
which authrules.Authorize applies before gomatrixserverlib's Allowed): the breaking event must be rejected with a reason naming the rule (for a
rule that allows, the breaking event misses it and the rule named is the one that
rejects instead), the twin accepted (for a rule that allows, by that rule). The
gomatrixserverlib columns are its Allowed alone on the same events (its
NewAuthEvents keeps the last event per key, so it never sees the auth_events rules).
"enforced by" is "us" where gomatrixserverlib accepts the breaking event, "us and
gomatrixserverlib" where both reject it. The rule that needs the authorising
server's signature is applied at import when the servers' keys are given (import
--keys FILE; pdu.KeyRing) and cannot be checked without them; its test is
integration's TestSignaturesWithKeys, not this table's.
Headings (rules that only group the ones under them) have no test of their own.

`)
	for i, vr := range rows {
		fmt.Fprintf(&sb, "## Room version %d\n\n", i+1)
		sb.WriteString("| rule | ID | what | breaking event (ours) | twin (ours) | gomatrixserverlib: breaking / twin | enforced by |\n|---|---|---|---|---|---|---|\n")
		for _, r := range vr {
			if !r.rule.Leaf {
				fmt.Fprintf(&sb, "| %s | %s | %s | | | | |\n", r.rule.Num, r.rule.ID, esc(r.rule.Text))
				continue
			}
			fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %s / %s | %s |\n", r.rule.Num, r.rule.ID, esc(r.rule.Text),
				r.bad, r.twin, r.gmslBad, r.gmslT, r.by)
		}
		sb.WriteString("\n")
	}
	return sb.String()
}

func esc(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

// FuzzAuthRulesContent: our rules read event content of any shape (power levels,
// membership, create, third-party invite) without panicking, in versions 1, 6, 10
// and 12, against the usual state and against its auth events.
func FuzzAuthRulesContent(f *testing.F) {
	f.Add(uint8(0), []byte(`{"users":{"@bob:b.test":"50"},"ban":1.5,"events":{"x":null}}`))
	f.Add(uint8(1), []byte(`{"membership":"invite","third_party_invite":{"signed":{"mxid":1,"token":{}}}}`))
	f.Add(uint8(2), []byte(`{"room_version":7,"additional_creators":[1],"m.federate":"no"}`))
	f.Add(uint8(3), []byte(`{"membership":"join","join_authorised_via_users_server":5}`))
	type setup struct {
		b     *bld
		tmpl  [4]map[string]any // event JSON per kind, content replaced
		state []gomatrixserverlib.PDU
		auth  []gomatrixserverlib.PDU
	}
	var setups []setup
	for _, v := range []int{1, 6, 10, 12} {
		b := newBld(f, v, nil)
		su := setup{b: b, state: b.base(b.tpi(alice, keyBoth))}
		su.auth = citeable(b, su.state[1], su.state[4])
		for kind := range 4 {
			typ, sk := spec.MRoomPowerLevels, ""
			switch kind {
			case 1, 3:
				typ, sk = spec.MRoomMember, carol
			case 2:
				typ = spec.MRoomCreate
			}
			p := b.ev(alice, typ, ptr(sk), map[string]any{}, []string{b.create.EventID()}, nil, nil)
			require.NoError(f, json.Unmarshal(p.JSON(), &su.tmpl[kind]))
		}
		setups = append(setups, su)
	}
	f.Fuzz(func(t *testing.T, kind uint8, content []byte) {
		var probe any
		if json.Unmarshal(content, &probe) != nil {
			return
		}
		for _, su := range setups {
			m := map[string]any{}
			for k, x := range su.tmpl[kind%4] {
				m[k] = x
			}
			m["content"] = json.RawMessage(content)
			raw, err := json.Marshal(m)
			require.NoError(t, err)
			q, err := su.b.ver.NewEventFromTrustedJSON(raw, false)
			if err != nil {
				continue
			}
			_, _ = check(su.b, q, su.state, false, nil)
			_, _ = check(su.b, q, su.auth, true, nil)
		}
	})
}

// TestAuthRuleNumbers pins rule numbers read off the spec pages (Matrix spec v1.19,
// each room version's "Authorisation rules", as rendered; matrix-org/matrix-spec
// commit d0ba2aa has the same content/rooms), one or more per text that differs:
// the outline's counting must give them.
func TestAuthRuleNumbers(t *testing.T) {
	for _, c := range []struct{ v, id, num string }{
		{"1", "redaction.domain", "11.2"}, {"2", "allow", "12"}, {"1", "power_levels.users_new.level", "10.7.1"},
		{"3", "aliases.allow", "4.3"}, {"5", "allow", "11"}, {"5", "member.unknown", "5.6"},
		{"6", "member", "4"}, {"6", "power_levels.events_old", "9.4"}, {"6", "allow", "10"},
		{"7", "knock.reject", "4.6.4"}, {"7", "member.unknown", "4.7"},
		{"8", "member.via.signature", "4.2.1"}, {"9", "join.restricted.allow", "4.3.5.3"}, {"9", "member.unknown", "4.8"},
		{"10", "power_levels.integers", "9.1"}, {"10", "power_levels.allow", "9.10"},
		{"11", "create.allow", "1.4"}, {"11", "auth_events.other_room", "2.5"},
		{"12", "create.additional_creators", "1.4"}, {"12", "room_id.create", "2"}, {"12", "auth_events.other_room", "3.4"},
		{"12", "federate", "4"}, {"12", "member.via.signature", "5.2.1"}, {"12", "knock.allow", "5.7.3"},
		{"12", "power_levels.creators", "10.4"}, {"12", "power_levels.allow", "10.11"}, {"12", "allow", "11"},
	} {
		var got string
		for _, r := range authrules.Rules(c.v) {
			if r.ID == c.id {
				got = r.Num
			}
		}
		require.Equal(t, c.num, got, "room version %s rule %s", c.v, c.id)
	}
	require.Nil(t, authrules.Rules("13"))
}
