package authrules

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// decision is the rule that decided an event: the rule that allowed it, or (as
// a *RuleError) the one that rejected it.
type decision struct {
	Rule    Rule
	Allowed bool
}

// CheckAuthEvents applies the rules on an event's auth_events (Matrix spec v1.19,
// room versions 1-12, "Authorisation rules": rule 2 "Considering the event's
// auth_events" in versions 1-11, rule 3 in version 12) to the events its
// auth_events name, in that order: duplicates, entries the auth events selection
// (Matrix spec v1.19, Server-Server API, "Auth events selection") does not name,
// rejected entries, no m.room.create (1-11), entries of another room. It also
// applies v12's rule 2 (the room_id names an accepted create event) when create is
// given. rejected reports an entry's rejection. It returns nil or an
// *RuleError. gomatrixserverlib's Allowed applies none of these: its
// NewAuthEvents keeps the last event per key. Versions other than 1-12: nil.
func CheckAuthEvents(p gomatrixserverlib.PDU, auth []gomatrixserverlib.PDU, rejected func(id string) bool, create gomatrixserverlib.PDU) error {
	v := ruleVersion(string(p.Version()))
	if v == 0 || p.Type() == spec.MRoomCreate && p.StateKeyEquals("") {
		return nil
	}
	fail := func(id, f string, args ...any) error {
		return &RuleError{Version: string(p.Version()), Rule: rule(v, id), Detail: fmt.Sprintf(f, args...)}
	}
	if v >= 12 {
		if err := checkRoomIDCreate(v, p, create, rejected); err != nil {
			return err
		}
	}
	if v >= 12 {
		auth = citedOnly(p, auth)
	}
	seen := map[key]string{}
	for _, a := range auth {
		if a.StateKey() == nil {
			return fail("auth_events.selection", "auth event %s (%s) is not a state event", a.EventID(), a.Type())
		}
		k := keyOf(a)
		if prev, dup := seen[k]; dup {
			return fail("auth_events.duplicate", "auth events %s and %s are both (%s, %q)", prev, a.EventID(), k.Type, k.StateKey)
		}
		seen[k] = a.EventID()
	}
	allowed := selectionKeys(v, p)
	for _, a := range auth {
		if !allowed[keyOf(a)] {
			return fail("auth_events.selection", "auth event %s is (%s, %q), which the auth events selection does not name for this event",
				a.EventID(), a.Type(), *a.StateKey())
		}
	}
	for _, a := range auth {
		if rejected != nil && rejected(a.EventID()) {
			return fail("auth_events.rejected", "auth event %s was rejected", a.EventID())
		}
	}
	if v <= 11 {
		if _, ok := seen[key{Type: spec.MRoomCreate, StateKey: ""}]; !ok {
			return fail("auth_events.no_create", "no m.room.create among its %d auth events", len(auth))
		}
	}
	for _, a := range auth {
		if a.RoomID().String() != p.RoomID().String() {
			return fail("auth_events.other_room", "auth event %s is an event of room %s, this event's room is %s",
				a.EventID(), a.RoomID().String(), p.RoomID().String())
		}
	}
	return nil
}

// citedOnly keeps the events p's auth_events field names, as often as it names
// them: in v12 gomatrixserverlib's AuthEventIDs adds the create event the room ID
// implies, which the rules must not count as cited.
func citedOnly(p gomatrixserverlib.PDU, auth []gomatrixserverlib.PDU) []gomatrixserverlib.PDU {
	createID := "$" + strings.TrimPrefix(p.RoomID().String(), "!")
	if !bytes.Contains(p.JSON(), []byte(`"`+createID+`"`)) {
		// The JSON never names the create event: any in auth is the implied one
		// (the common case; no need to decode the whole event).
		out := make([]gomatrixserverlib.PDU, 0, len(auth))
		for _, a := range auth {
			if a.EventID() != createID {
				out = append(out, a)
			}
		}
		return out
	}
	var f struct {
		AuthEvents []string `json:"auth_events"`
	}
	_ = json.Unmarshal(p.JSON(), &f)
	n := map[string]int{}
	for _, id := range f.AuthEvents {
		n[id]++
	}
	out := make([]gomatrixserverlib.PDU, 0, len(auth))
	for _, a := range auth {
		if n[a.EventID()] > 0 {
			n[a.EventID()]--
			out = append(out, a)
		}
	}
	return out
}

// checkRoomIDCreate is v12's rule 2: the room ID is the create event's ID with "!"
// for "$", and that event was accepted.
func checkRoomIDCreate(v int, p gomatrixserverlib.PDU, create gomatrixserverlib.PDU, rejected func(string) bool) error {
	r := rule(v, "room_id.create")
	switch {
	case create == nil:
		return &RuleError{Version: string(p.Version()), Rule: r, Detail: fmt.Sprintf("no m.room.create for room %s", p.RoomID().String())}
	case "!"+strings.TrimPrefix(create.EventID(), "$") != p.RoomID().String():
		return &RuleError{Version: string(p.Version()), Rule: r,
			Detail: fmt.Sprintf("room %s is not named after the create event %s", p.RoomID().String(), create.EventID())}
	case rejected != nil && rejected(create.EventID()):
		return &RuleError{Version: string(p.Version()), Rule: r, Detail: fmt.Sprintf("the create event %s was rejected", create.EventID())}
	}
	return nil
}

// selectionKeys is the set of (type, state_key) the auth events selection names for
// p (Matrix spec v1.19, Server-Server API, "Auth events selection"; v12 leaves out
// m.room.create: its room ID implies it).
func selectionKeys(v int, p gomatrixserverlib.PDU) map[key]bool {
	keys := map[key]bool{
		{Type: spec.MRoomPowerLevels, StateKey: ""}:              true,
		{Type: spec.MRoomMember, StateKey: string(p.SenderID())}: true,
	}
	if v <= 11 {
		keys[key{Type: spec.MRoomCreate, StateKey: ""}] = true
	}
	if p.Type() != spec.MRoomMember || p.StateKey() == nil {
		return keys
	}
	keys[key{Type: spec.MRoomMember, StateKey: *p.StateKey()}] = true
	c := memberContent(p)
	switch c.Membership {
	case spec.Join, spec.Invite, spec.Knock:
		keys[key{Type: spec.MRoomJoinRules, StateKey: ""}] = true
	}
	if c.Membership == spec.Invite && c.ThirdPartyInvite != nil && c.ThirdPartyInvite.Signed.Token != "" {
		keys[key{Type: spec.MRoomThirdPartyInvite, StateKey: c.ThirdPartyInvite.Signed.Token}] = true
	}
	if c.Membership == spec.Join && c.Via != "" && v >= 8 {
		keys[key{Type: spec.MRoomMember, StateKey: c.Via}] = true
	}
	return keys
}

// memberFields is the part of m.room.member content the rules read.
type memberFields struct {
	Membership       string `json:"membership"`
	ThirdPartyInvite *struct {
		Signed struct {
			Token string `json:"token"`
		} `json:"signed"`
	} `json:"third_party_invite"`
	Via string `json:"join_authorised_via_users_server"`
}

func memberContent(p gomatrixserverlib.PDU) memberFields {
	var c memberFields
	_ = json.Unmarshal(p.Content(), &c)
	return c
}

// authCtx is one evaluation of the rules after the auth_events ones: the event,
// the auth events by key (its auth events, or the state before it), and what the
// rules read of them.
type authCtx struct {
	v      int
	p      gomatrixserverlib.PDU
	byKey  map[key]gomatrixserverlib.PDU
	create gomatrixserverlib.PDU
	pl     *levels   // nil: no m.room.power_levels
	memo   *ruleMemo // nil: parse what the rules read every time
}

// checkRules applies the authorization rules of p's room version (1-12) other than
// the auth_events ones to p against the auth events in byKey (one per key: its
// auth events, or the state before it), and returns the rule that decided: allowed,
// or rejected as a *RuleError. In v12 the create event comes from create (the
// room ID names it), in 1-11 from byKey; v12's rule 2 (the room ID names the
// accepted create event) is CheckAuthEvents' (on receipt: state resolution takes
// the create event it is given, as the Ruma v12 vectors, whose room IDs are made
// up, require). Rules that need the servers' signing keys
// (member.via.signature) are not applied here. Versions other than 1-12 return a
// zero decision and nil. What it parses of power levels and create events is kept
// in memo (nil: none kept).
func checkRules(p gomatrixserverlib.PDU, byKey map[key]gomatrixserverlib.PDU, create gomatrixserverlib.PDU, memo *ruleMemo) (decision, error) {
	v := ruleVersion(string(p.Version()))
	if v == 0 {
		return decision{}, nil
	}
	a := &authCtx{v: v, p: p, byKey: byKey, create: create, memo: memo}
	if v <= 11 || a.create == nil {
		a.create = byKey[key{Type: spec.MRoomCreate, StateKey: ""}]
	}
	id, ok, detail := a.evaluate()
	r := rule(v, id)
	if ok {
		return decision{Rule: r, Allowed: true}, nil
	}
	return decision{Rule: r}, &RuleError{Version: string(p.Version()), Rule: r, Detail: detail}
}

// evaluate walks the rules in spec order and returns the ID of the deciding rule,
// whether it allows, and (rejections) what broke it.
func (a *authCtx) evaluate() (id string, ok bool, detail string) {
	p, v := a.p, a.v
	rej := func(id, f string, args ...any) (string, bool, string) { return id, false, fmt.Sprintf(f, args...) }
	if p.Type() == spec.MRoomCreate && p.StateKeyEquals("") {
		return a.createRules()
	}
	if a.create == nil {
		if v >= 12 {
			return rej("room_id.create", "no m.room.create for room %s", p.RoomID().String())
		}
		return rej("auth_events.no_create", "no m.room.create among the auth events")
	}
	if ci := a.createInfo(); ci.noFederate && domainOf(string(p.SenderID())) != domainOf(string(a.create.SenderID())) {
		return rej("federate", "m.federate is false and the sender %s is not of %s", p.SenderID(), domainOf(string(a.create.SenderID())))
	}
	if pe := a.byKey[key{Type: spec.MRoomPowerLevels, StateKey: ""}]; pe != nil {
		a.pl = a.memo.levels(v, pe)
	}
	if v <= 5 && p.Type() == spec.MRoomAliases {
		switch {
		case p.StateKey() == nil:
			return rej("aliases.no_state_key", "m.room.aliases without a state_key")
		case *p.StateKey() != domainOf(string(p.SenderID())):
			return rej("aliases.domain", "state_key %q is not the sender's domain %s", *p.StateKey(), domainOf(string(p.SenderID())))
		}
		return "aliases.allow", true, ""
	}
	if p.Type() == spec.MRoomMember {
		return a.memberRules()
	}
	sender := string(p.SenderID())
	if m := a.membership(sender); m != spec.Join {
		return rej("sender", "the sender %s is not joined (membership %q)", sender, m)
	}
	if p.Type() == spec.MRoomThirdPartyInvite {
		if a.level(sender) >= a.named("invite") {
			return "third_party_invite.level", true, ""
		}
		return rej("third_party_invite.level", "the sender's level %s is below the invite level %d", levelString(a.level(sender)), a.named("invite"))
	}
	if req := a.required(p); req > a.level(sender) {
		return rej("required_level", "%s needs level %d, the sender has %s", p.Type(), req, levelString(a.level(sender)))
	}
	if sk := p.StateKey(); sk != nil && strings.HasPrefix(*sk, "@") && *sk != sender {
		return rej("state_key", "state_key %q is a user other than the sender %s", *sk, sender)
	}
	if p.Type() == spec.MRoomPowerLevels && p.StateKeyEquals("") {
		return a.powerLevelsRules()
	}
	if v <= 2 && p.Type() == spec.MRoomRedaction {
		if a.level(sender) >= a.named("redact") {
			return "redaction.level", true, ""
		}
		if domainOf(p.Redacts()) != "" && domainOf(p.Redacts()) == domainOf(p.EventID()) {
			return "redaction.domain", true, ""
		}
		return rej("redaction.reject", "the sender's level %s is below the redact level %d and %s is of another server than %s",
			levelString(a.level(sender)), a.named("redact"), p.Redacts(), p.EventID())
	}
	return "allow", true, ""
}

// createRules is rule 1 (m.room.create).
func (a *authCtx) createRules() (string, bool, string) {
	p, v := a.p, a.v
	if n := len(p.PrevEventIDs()); n > 0 {
		return "create.prev_events", false, fmt.Sprintf("%d prev_events", n)
	}
	if v <= 11 {
		if domainOf(p.RoomID().String()) != domainOf(string(p.SenderID())) {
			return "create.room_domain", false, fmt.Sprintf("room %s is not of the sender's domain %s", p.RoomID().String(), domainOf(string(p.SenderID())))
		}
	} else {
		var h struct {
			RoomID json.RawMessage `json:"room_id"`
		}
		_ = json.Unmarshal(p.JSON(), &h)
		if h.RoomID != nil {
			return "create.room_id", false, fmt.Sprintf("it has room_id %s", h.RoomID)
		}
	}
	var c map[string]json.RawMessage
	_ = json.Unmarshal(p.Content(), &c)
	if rv, ok := c["room_version"]; ok {
		var s string
		if json.Unmarshal(rv, &s) != nil || !gomatrixserverlib.KnownRoomVersion(gomatrixserverlib.RoomVersion(s)) {
			return "create.room_version", false, fmt.Sprintf("room_version %s is not a known version", rv)
		}
	}
	if v <= 10 {
		if _, ok := c["creator"]; !ok {
			return "create.creator", false, "content has no creator"
		}
	}
	if v >= 12 {
		if ac, ok := c["additional_creators"]; ok {
			var list []string
			if json.Unmarshal(ac, &list) != nil {
				return "create.additional_creators", false, fmt.Sprintf("additional_creators %s is not an array of strings", ac)
			}
			for _, u := range list {
				if !validUserID(u) {
					return "create.additional_creators", false, fmt.Sprintf("additional_creators entry %q is not a valid user ID", u)
				}
			}
		}
	}
	return "create.allow", true, ""
}

// memberRules is the m.room.member rule (5 in versions 1-5 and 12, 4 in 6-11).
func (a *authCtx) memberRules() (string, bool, string) {
	p, v := a.p, a.v
	rej := func(id, f string, args ...any) (string, bool, string) { return id, false, fmt.Sprintf(f, args...) }
	var c map[string]json.RawMessage
	_ = json.Unmarshal(p.Content(), &c)
	var membership string
	if p.StateKey() == nil || json.Unmarshal(c["membership"], &membership) != nil {
		return rej("member.fields", "no state_key, or no membership string in content")
	}
	target, sender := *p.StateKey(), string(p.SenderID())
	senderM, targetM := a.membership(sender), a.membership(target)
	joinRule := a.joinRule()
	switch membership {
	case spec.Join:
		if prev := p.PrevEventIDs(); len(prev) == 1 && prev[0] == a.create.EventID() && target == a.creator() {
			return "join.first", true, ""
		}
		if sender != target {
			return rej("join.sender", "the sender %s joins %s", sender, target)
		}
		if senderM == spec.Ban {
			return rej("join.banned", "%s is banned", sender)
		}
		if joinRule == spec.Invite || v >= 7 && joinRule == spec.Knock {
			if targetM == spec.Invite || targetM == spec.Join {
				return "join.invite", true, ""
			}
			return rej("join.reject", "join rule %s and membership %q", joinRule, targetM)
		}
		if v >= 8 && (joinRule == spec.Restricted || v >= 10 && joinRule == spec.KnockRestricted) {
			if targetM == spec.Join || targetM == spec.Invite {
				return "join.restricted.member", true, ""
			}
			var via string
			_ = json.Unmarshal(c["join_authorised_via_users_server"], &via)
			if via == "" || a.membership(via) != spec.Join || a.level(via) < a.named("invite") {
				return rej("join.restricted.via", "join_authorised_via_users_server %q is not a joined user with the invite level", via)
			}
			return "join.restricted.allow", true, ""
		}
		if joinRule == spec.Public {
			return "join.public", true, ""
		}
		return rej("join.reject", "join rule %q", joinRule)
	case spec.Invite:
		if tpi, ok := c["third_party_invite"]; ok && string(tpi) != "null" {
			return a.thirdPartyInvite(tpi, target, targetM)
		}
		if senderM != spec.Join {
			return rej("invite.sender", "the sender %s is not joined (membership %q)", sender, senderM)
		}
		if targetM == spec.Join || targetM == spec.Ban {
			return rej("invite.target", "the target %s has membership %s", target, targetM)
		}
		if a.level(sender) >= a.named("invite") {
			return "invite.allow", true, ""
		}
		return rej("invite.reject", "the sender's level %s is below the invite level %d", levelString(a.level(sender)), a.named("invite"))
	case spec.Leave:
		if sender == target {
			if targetM == spec.Invite || targetM == spec.Join || v >= 7 && targetM == spec.Knock {
				return "leave.self", true, ""
			}
			return rej("leave.self", "%s leaves with membership %q", sender, targetM)
		}
		if senderM != spec.Join {
			return rej("leave.sender", "the sender %s is not joined (membership %q)", sender, senderM)
		}
		if targetM == spec.Ban && a.level(sender) < a.named("ban") {
			return rej("leave.banned", "unbanning %s needs the ban level %d, the sender has %s", target, a.named("ban"), levelString(a.level(sender)))
		}
		if a.level(sender) >= a.named("kick") && a.level(target) < a.level(sender) {
			return "leave.kick", true, ""
		}
		return rej("leave.reject", "the sender's level %s against the kick level %d and the target's level %s",
			levelString(a.level(sender)), a.named("kick"), levelString(a.level(target)))
	case spec.Ban:
		if senderM != spec.Join {
			return rej("ban.sender", "the sender %s is not joined (membership %q)", sender, senderM)
		}
		if a.level(sender) >= a.named("ban") && a.level(target) < a.level(sender) {
			return "ban.allow", true, ""
		}
		return rej("ban.reject", "the sender's level %s against the ban level %d and the target's level %s",
			levelString(a.level(sender)), a.named("ban"), levelString(a.level(target)))
	case spec.Knock:
		if v < 7 {
			break
		}
		if joinRule != spec.Knock && !(v >= 10 && joinRule == spec.KnockRestricted) {
			return rej("knock.join_rule", "join rule %q", joinRule)
		}
		if sender != target {
			return rej("knock.sender", "the sender %s knocks for %s", sender, target)
		}
		if senderM != spec.Ban && senderM != spec.Invite && senderM != spec.Join {
			return "knock.allow", true, ""
		}
		return rej("knock.reject", "%s has membership %s", sender, senderM)
	}
	return rej("member.unknown", "membership %q", membership)
}

// thirdPartyInvite is the third_party_invite part of the invite rules.
func (a *authCtx) thirdPartyInvite(raw json.RawMessage, target, targetM string) (string, bool, string) {
	rej := func(id, f string, args ...any) (string, bool, string) { return id, false, fmt.Sprintf(f, args...) }
	if targetM == spec.Ban {
		return rej("invite.tpi.banned", "the target %s is banned", target)
	}
	var tpi map[string]json.RawMessage
	_ = json.Unmarshal(raw, &tpi)
	signedRaw, ok := tpi["signed"]
	var signed map[string]json.RawMessage
	if !ok || json.Unmarshal(signedRaw, &signed) != nil || signed == nil {
		return rej("invite.tpi.signed", "third_party_invite has no signed object")
	}
	var mxid, token string
	if json.Unmarshal(signed["mxid"], &mxid) != nil || json.Unmarshal(signed["token"], &token) != nil || mxid == "" || token == "" {
		return rej("invite.tpi.mxid_token", "signed has no mxid or no token")
	}
	if mxid != target {
		return rej("invite.tpi.mxid", "mxid %s is not the state_key %s", mxid, target)
	}
	ev := a.byKey[key{Type: spec.MRoomThirdPartyInvite, StateKey: token}]
	if ev == nil {
		return rej("invite.tpi.event", "no m.room.third_party_invite with state_key %q", token)
	}
	if ev.SenderID() != a.p.SenderID() {
		return rej("invite.tpi.sender", "the sender %s is not the m.room.third_party_invite's sender %s", a.p.SenderID(), ev.SenderID())
	}
	var c struct {
		PublicKey  string `json:"public_key"`
		PublicKeys []struct {
			PublicKey string `json:"public_key"`
		} `json:"public_keys"`
	}
	_ = json.Unmarshal(ev.Content(), &c)
	if c.PublicKey != "" && signedBy(signedRaw, c.PublicKey) {
		return "invite.tpi.signature.public_key", true, ""
	}
	for _, k := range c.PublicKeys {
		if signedBy(signedRaw, k.PublicKey) {
			return "invite.tpi.signature.public_keys", true, ""
		}
	}
	return rej("invite.tpi.reject", "no signature in signed verifies with a public key of %s", ev.EventID())
}

// signedBy reports whether any signature of the signed object verifies with the
// (unpadded or padded, standard or URL-safe base64) ed25519 public key.
func signedBy(signed json.RawMessage, key string) bool {
	pub := decodeBase64(key)
	if len(pub) != ed25519.PublicKeySize {
		return false
	}
	var s struct {
		Signatures map[string]map[string]string `json:"signatures"`
	}
	if json.Unmarshal(signed, &s) != nil {
		return false
	}
	for entity, sigs := range s.Signatures {
		for keyID := range sigs {
			if gomatrixserverlib.VerifyJSON(entity, gomatrixserverlib.KeyID(keyID), ed25519.PublicKey(pub), signed) == nil {
				return true
			}
		}
	}
	return false
}

func decodeBase64(s string) []byte {
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.StdEncoding, base64.RawURLEncoding, base64.URLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b
		}
	}
	return nil
}

// powerLevelsRules is the m.room.power_levels rule (10 in versions 1-5 and 12, 9 in
// 6-11).
func (a *authCtx) powerLevelsRules() (string, bool, string) {
	p, v := a.p, a.v
	rej := func(id, f string, args ...any) (string, bool, string) { return id, false, fmt.Sprintf(f, args...) }
	var c map[string]json.RawMessage
	_ = json.Unmarshal(p.Content(), &c)
	if v >= 10 {
		for _, k := range namedLevels {
			if raw, ok := c[k]; ok {
				if _, ok := parseLevel(v, raw); !ok {
					return rej("power_levels.integers", "%s is %s, not an integer", k, raw)
				}
			}
		}
		for _, k := range []string{"events", "notifications"} {
			if raw, ok := c[k]; ok {
				var m map[string]json.RawMessage
				if json.Unmarshal(raw, &m) != nil || m == nil {
					return rej("power_levels.maps", "%s is not an object", k)
				}
				for kk, x := range m {
					if _, ok := parseLevel(v, x); !ok {
						return rej("power_levels.maps", "%s[%q] is %s, not an integer", k, kk, x)
					}
				}
			}
		}
	}
	if raw, ok := c["users"]; ok {
		var m map[string]json.RawMessage
		if json.Unmarshal(raw, &m) != nil || m == nil {
			return rej("power_levels.users", "users is not an object")
		}
		for u, x := range m {
			if !validUserID(u) {
				return rej("power_levels.users", "users key %q is not a valid user ID", u)
			}
			if _, ok := parseLevel(v, x); !ok {
				return rej("power_levels.users", "users[%q] is %s, not an integer", u, x)
			}
		}
		if v >= 12 {
			for _, cr := range a.creators() {
				if _, ok := m[cr]; ok {
					return rej("power_levels.creators", "users names the room creator %s", cr)
				}
			}
		}
	}
	if a.pl == nil {
		return "power_levels.first", true, ""
	}
	newPL := parseLevels(v, p.Content())
	sender := string(p.SenderID())
	own := a.level(sender)
	for _, k := range namedLevels {
		o, oldOK := a.pl.raw[k]
		n, newOK := newPL.raw[k]
		if oldOK == newOK && o == n {
			continue
		}
		if oldOK && o > own {
			return rej("power_levels.named.old", "%s changes from %d, above the sender's level %s", k, o, levelString(own))
		}
		if newOK && n > own {
			return rej("power_levels.named.new", "%s changes to %d, above the sender's level %s", k, n, levelString(own))
		}
	}
	maps := []string{"events"}
	if v >= 6 {
		maps = append(maps, "notifications")
	}
	for _, m := range maps {
		for k, o := range a.pl.maps[m] {
			if n, ok := newPL.maps[m][k]; (!ok || n != o) && o > own {
				return rej("power_levels.events_old.level", "%s[%q] changes from %d, above the sender's level %s", m, k, o, levelString(own))
			}
		}
	}
	for _, m := range maps {
		for k, n := range newPL.maps[m] {
			if o, ok := a.pl.maps[m][k]; (!ok || n != o) && n > own {
				return rej("power_levels.events_new.level", "%s[%q] changes to %d, above the sender's level %s", m, k, n, levelString(own))
			}
		}
	}
	for u, o := range a.pl.users {
		if n, ok := newPL.users[u]; u != sender && (!ok || n != o) && o >= own {
			return rej("power_levels.users_old.level", "users[%q] changes from %d, not below the sender's level %s", u, o, levelString(own))
		}
	}
	for u, n := range newPL.users {
		if o, ok := a.pl.users[u]; (!ok || n != o) && n > own {
			return rej("power_levels.users_new.level", "users[%q] changes to %d, above the sender's level %s", u, n, levelString(own))
		}
	}
	return "power_levels.allow", true, ""
}

// namedLevels are the power levels the rules compare by name.
var namedLevels = []string{"users_default", "events_default", "state_default", "ban", "redact", "kick", "invite"}

// levels is a parsed m.room.power_levels content: values present (raw) and the
// events, notifications and users maps. Values a version cannot read are left out.
type levels struct {
	raw   map[string]int64
	maps  map[string]map[string]int64
	users map[string]int64
}

// ruleMemo keeps what the rules parse of power levels and create events, by room
// and event ID: every event of a room is checked against one of few power levels
// events, whose users map may hold thousands of entries. An event ID names one
// event only within one event source (a store, one ResolveMaps call): made-up IDs
// in test fixtures name different events in different rooms, and in room versions
// 1 and 2 an event ID is whatever its server chose. So a ruleMemo lives in the
// function NewAuthorizer returns, whose scope is one source, never in the package. A nil *ruleMemo keeps
// nothing. Not safe for concurrent use.
type ruleMemo struct {
	pl      *lru.Cache[string, *levels]
	create  *lru.Cache[string, createFacts]
	allowed *lru.Cache[string, allowedLevels]
}

// Bounds of ruleMemo's two caches.
const (
	memoLevels = 1024
	memoCreate = 256
)

func newRuleMemo() *ruleMemo {
	l, _ := lru.New[string, *levels](memoLevels)
	c, _ := lru.New[string, createFacts](memoCreate)
	a, _ := lru.New[string, allowedLevels](memoLevels)
	return &ruleMemo{pl: l, create: c, allowed: a}
}

// levels returns pe's power levels as version v reads them.
func (m *ruleMemo) levels(v int, pe gomatrixserverlib.PDU) *levels {
	if m == nil {
		return parseLevels(v, pe.Content())
	}
	k := pe.RoomID().String() + "\x00" + pe.EventID()
	if l, ok := m.pl.Get(k); ok {
		return l
	}
	l := parseLevels(v, pe.Content())
	m.pl.Add(k, l)
	return l
}

func parseLevels(v int, content []byte) *levels {
	var c map[string]json.RawMessage
	_ = json.Unmarshal(content, &c)
	l := &levels{raw: map[string]int64{}, maps: map[string]map[string]int64{}, users: map[string]int64{}}
	for _, k := range namedLevels {
		if x, ok := parseLevel(v, c[k]); ok && c[k] != nil {
			l.raw[k] = x
		}
	}
	for _, m := range []string{"events", "notifications", "users"} {
		var mm map[string]json.RawMessage
		_ = json.Unmarshal(c[m], &mm)
		out := map[string]int64{}
		for k, raw := range mm {
			if x, ok := parseLevel(v, raw); ok {
				out[k] = x
			}
		}
		if m == "users" {
			l.users = out
		} else {
			l.maps[m] = out
		}
	}
	return l
}

// stringLevel is the integer-string form of room versions 1-9 (Matrix spec v1.19,
// room version 1, "m.room.power_levels events accept values as strings").
var stringLevel = regexp.MustCompile(`^\s*[+-]?[0-9]+\s*$`)

// parseLevel reads one power level: an integer; in versions 1-9 also an integer
// string; in 1-5 also a float, truncated (Matrix spec v1.19, room version 1,
// "m.room.power_levels events accept values as floats").
func parseLevel(v int, raw json.RawMessage) (int64, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0, false
	}
	if raw[0] == '"' {
		var s string
		if v > 9 || json.Unmarshal(raw, &s) != nil || !stringLevel.MatchString(s) {
			return 0, false
		}
		n, err := strconv.ParseInt(strings.TrimPrefix(strings.TrimSpace(s), "+"), 10, 64)
		return n, err == nil
	}
	if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		return n, true
	}
	if v <= 5 {
		if f, err := strconv.ParseFloat(string(raw), 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) &&
			f > math.MinInt64 && f < math.MaxInt64 {
			return int64(f), true
		}
	}
	return 0, false
}

// infinite is a room creator's level in v12 ("infinitely high").
const infinite = math.MaxInt64

func levelString(l int64) string {
	if l == infinite {
		return "infinite (room creator)"
	}
	return strconv.FormatInt(l, 10)
}

// level is a user's power level: infinite for v12 creators; without a power levels
// event 100 for the creator and 0 for others (Matrix spec v1.19, Client-Server API,
// "m.room.power_levels"); else users[user] or users_default.
func (a *authCtx) level(user string) int64 {
	if a.v >= 12 && slices.Contains(a.creators(), user) {
		return infinite
	}
	if a.pl == nil {
		if user == a.creator() {
			return 100
		}
		return 0
	}
	if l, ok := a.pl.users[user]; ok {
		return l
	}
	return a.pl.raw["users_default"]
}

// named is a named level with its default (Matrix spec v1.19, Client-Server API,
// "m.room.power_levels": ban, kick and redact 50, invite 0, state_default 50 (0
// without a power levels event), events_default and users_default 0).
func (a *authCtx) named(k string) int64 {
	if a.pl != nil {
		if l, ok := a.pl.raw[k]; ok {
			return l
		}
	}
	switch k {
	case "ban", "kick", "redact":
		return 50
	case "state_default":
		if a.pl != nil {
			return 50
		}
	}
	return 0
}

// required is the event type's required power level (Matrix spec v1.19,
// Server-Server API, "Authorisation rules", "Definitions").
func (a *authCtx) required(p gomatrixserverlib.PDU) int64 {
	if a.pl != nil {
		if l, ok := a.pl.maps["events"][p.Type()]; ok {
			return l
		}
	}
	if p.StateKey() != nil {
		return a.named("state_default")
	}
	return a.named("events_default")
}

// createFacts is what the rules read of a create event's content.
type createFacts struct {
	noFederate bool     // m.federate is false
	creator    string   // content.creator ("" if absent)
	additional []string // content.additional_creators (v12)
}

// createInfo returns what the rules read of the create event (kept in the
// ruleMemo: every event reads it).
func (a *authCtx) createInfo() createFacts {
	k := a.create.RoomID().String() + "\x00" + a.create.EventID()
	if a.memo != nil {
		if f, ok := a.memo.create.Get(k); ok {
			return f
		}
	}
	var c struct {
		Federate   *bool    `json:"m.federate"`
		Creator    string   `json:"creator"`
		Additional []string `json:"additional_creators"`
	}
	_ = json.Unmarshal(a.create.Content(), &c)
	f := createFacts{noFederate: c.Federate != nil && !*c.Federate, creator: c.Creator, additional: c.Additional}
	if a.memo != nil {
		a.memo.create.Add(k, f)
	}
	return f
}

// creator is the room's creator: content.creator in versions 1-10, the create
// event's sender from 11.
func (a *authCtx) creator() string {
	if c := a.createInfo().creator; a.v <= 10 && c != "" {
		return c
	}
	return string(a.create.SenderID())
}

// creators is v12's room creators: the create event's sender and its
// additional_creators.
func (a *authCtx) creators() []string {
	return append([]string{string(a.create.SenderID())}, a.createInfo().additional...)
}

// membership is a user's current membership ("leave" without a member event).
func (a *authCtx) membership(user string) string {
	if e := a.byKey[key{Type: spec.MRoomMember, StateKey: user}]; e != nil {
		if m := memberContent(e).Membership; m != "" {
			return m
		}
	}
	return spec.Leave
}

// joinRule is the current join rule ("invite" without a join rules event, as
// gomatrixserverlib and Synapse read it).
func (a *authCtx) joinRule() string {
	if e := a.byKey[key{Type: spec.MRoomJoinRules, StateKey: ""}]; e != nil {
		var c struct {
			JoinRule string `json:"join_rule"`
		}
		if json.Unmarshal(e.Content(), &c) == nil && c.JoinRule != "" {
			return c.JoinRule
		}
	}
	return spec.Invite
}

// domainOf is the server name after the first ':' of an ID ("" if none).
func domainOf(id string) string {
	if i := strings.IndexByte(id, ':'); i >= 0 {
		return id[i+1:]
	}
	return ""
}

// validUserID applies the user ID grammar as for senders (historical characters
// allowed; at most 255 bytes).
func validUserID(s string) bool {
	if len(s) > 255 {
		return false
	}
	_, err := spec.NewUserID(s, true)
	return err == nil
}
