package gen

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// view is what a server sees when it creates an event: its prev_events and the
// state before the event.
type view struct {
	s      *server
	prevs  []int32
	before pmap
}

func (r *room) viewOf(s *server) view {
	prevs := r.prevEvents(s)
	return view{s: s, prevs: prevs, before: r.resolve(prevs)}
}

// emit creates an event from a view and sends it to the other servers.
func (r *room) emit(v view, d draft) (int32, error) {
	idx, err := r.create(v.s, v.prevs, v.before, d)
	if err != nil {
		return 0, err
	}
	r.broadcast(idx)
	return idx, nil
}

func (r *room) userIndex(id string) (int, bool) {
	var srv, n int
	if _, err := fmt.Sscanf(id, "@user%d:server%d.test", &n, &srv); err != nil {
		return 0, false
	}
	s := srv - 1
	if s < 0 || s >= len(r.servers) || n < 1 || n > len(r.servers[s].users) {
		return 0, false
	}
	return r.servers[s].users[n-1], true
}

func (r *room) membership(st pmap, ui int) string {
	if idx, ok := st.get(stateKey(spec.MRoomMember, r.users[ui].id)); ok {
		return r.events[idx].member
	}
	return ""
}

// powerLevels returns the power-level content of a state (cached per event).
func (r *room) powerLevels(st pmap) *gomatrixserverlib.PowerLevelContent {
	idx, ok := st.get(stateKey(spec.MRoomPowerLevels, ""))
	if !ok {
		return &gomatrixserverlib.PowerLevelContent{}
	}
	if pl, ok := r.plCache[idx]; ok {
		return pl
	}
	pl, err := gomatrixserverlib.NewPowerLevelContentFromEvent(r.events[idx].pdu)
	if err != nil {
		pl = gomatrixserverlib.PowerLevelContent{}
	}
	r.plCache[idx] = &pl
	return &pl
}

func (r *room) level(st pmap, ui int) int64 {
	if ui == r.creator && r.ver.PrivilegedCreators() {
		return gomatrixserverlib.CreatorPowerLevel
	}
	return r.powerLevels(st).UserLevel(spec.SenderID(r.users[ui].id))
}

func (r *room) joinRule(st pmap) string {
	idx, ok := st.get(stateKey(spec.MRoomJoinRules, ""))
	if !ok {
		return ""
	}
	if jr, ok := r.jrCache[idx]; ok {
		return jr
	}
	var c struct {
		JoinRule string `json:"join_rule"`
	}
	_ = json.Unmarshal(r.events[idx].pdu.Content(), &c)
	r.jrCache[idx] = c.JoinRule
	return c.JoinRule
}

// pickUser samples users of a server (or of every server when s is nil) until one
// satisfies ok; it gives up after a few tries, as a busy server would pick someone
// else to act.
func (r *room) pickUser(s *server, ok func(ui int) bool) (int, bool) {
	for range 24 {
		var ui int
		if s == nil {
			ui = r.rng.IntN(len(r.users))
		} else if r.rng.IntN(4) == 0 {
			// Admins and moderators (the first three users of each server) act
			// more often than their share.
			ui = s.users[r.rng.IntN(min(3, len(s.users)))]
		} else {
			ui = s.users[r.rng.IntN(len(s.users))]
		}
		if ok(ui) {
			return ui, true
		}
	}
	return 0, false
}

// createRoom has the origin's first user create the room, join it, and set power
// levels, join rules, history visibility, name and topic.
func (r *room) createRoom() error {
	s := r.servers[0]
	s.joined = true
	r.creator = s.users[0]
	if !r.ver.DomainlessRoomIDs() {
		// v10, v11: a room ID the creating server makes up (here from the seed).
		h := sha256.Sum256([]byte(fmt.Sprintf("mtxdb gen room %d", r.opts.Seed)))
		r.roomID = "!" + base64.RawURLEncoding.EncodeToString(h[:])[:18] + ":" + s.name
	}
	creator := r.users[r.creator].id
	createContent := map[string]any{"room_version": r.opts.RoomVersion}
	if r.opts.RoomVersion == "10" {
		createContent["creator"] = creator
	}
	users := map[string]int64{}
	for _, srv := range r.servers {
		for j, ui := range srv.users[:min(3, len(srv.users))] {
			level := int64(50)
			if j == 0 {
				level = 100
			}
			users[r.users[ui].id] = level
		}
	}
	if r.ver.PrivilegedCreators() {
		delete(users, creator) // v12: creators must not appear in users
	}
	pl := map[string]any{
		"users": users, "users_default": 0, "events_default": 0, "state_default": 50,
		"ban": 50, "kick": 50, "redact": 50, "invite": 0,
		"events": map[string]int64{
			spec.MRoomPowerLevels: 100, "m.room.history_visibility": 100, spec.MRoomJoinRules: 100,
			"m.room.server_acl": 100, "m.room.tombstone": 100, "m.room.name": 50, "m.room.topic": 50,
			"m.room.avatar": 50, "m.room.canonical_alias": 50,
		},
		"notifications": map[string]int64{"room": 50},
	}
	drafts := []draft{
		{sender: r.creator, typ: spec.MRoomCreate, stateKey: strp(""), content: createContent},
		{sender: r.creator, typ: spec.MRoomMember, stateKey: strp(creator), content: map[string]any{"membership": "join", "displayname": r.users[r.creator].name}},
		{sender: r.creator, typ: spec.MRoomPowerLevels, stateKey: strp(""), content: pl},
		{sender: r.creator, typ: spec.MRoomJoinRules, stateKey: strp(""), content: map[string]any{"join_rule": "public"}},
		{sender: r.creator, typ: "m.room.history_visibility", stateKey: strp(""), content: map[string]any{"history_visibility": "shared"}},
		{sender: r.creator, typ: "m.room.name", stateKey: strp(""), content: map[string]any{"name": fmt.Sprintf("Generated room %d", r.opts.Seed)}},
		{sender: r.creator, typ: "m.room.topic", stateKey: strp(""), content: map[string]any{"topic": "A room generated by mtxdb gen"}},
	}
	for _, d := range drafts {
		if _, err := r.emit(r.viewOf(s), d); err != nil {
			return err
		}
		if r.events[len(r.events)-1].rejected {
			return fmt.Errorf("gen: room setup event %s was rejected", d.typ)
		}
	}
	return nil
}

// kinds of event, in Mix field order.
const (
	kMessage = iota
	kJoin
	kLeave
	kProfile
	kInvite
	kKick
	kBan
	kUnban
	kPower
	kJoinRules
	kHistoryVis
	kTopic
	kName
	kRedaction
	kPowerConflict
	nKinds
)

func (r *room) pickKind() int {
	m := r.opts.Mix
	w := [nKinds]float64{m.Message, m.Join, m.Leave, m.Profile, m.Invite, m.Kick, m.Ban, m.Unban,
		m.Power, m.JoinRules, m.HistoryVis, m.Topic, m.Name, m.Redaction, m.PowerConflict}
	// Grow towards the member target, then churn around it.
	if r.joined < r.opts.Members {
		w[kJoin] *= 2
	} else {
		w[kJoin] = w[kLeave]
	}
	var total float64
	for _, x := range w {
		total += x
	}
	x := r.rng.Float64() * total
	for k, v := range w {
		if x < v {
			return k
		}
		x -= v
	}
	return kMessage
}

// step has one server create one event (or, for a power conflict, two servers one
// each).
func (r *room) step() error {
	s := r.servers[r.rng.IntN(len(r.servers))]
	if !s.joined {
		return r.serverJoins(s)
	}
	if r.rng.Float64() < r.opts.BadRate {
		return r.bad(r.viewOf(s))
	}
	k := r.pickKind()
	if k == kPowerConflict && len(r.events)+2 <= r.opts.Events {
		if made, err := r.powerConflict(s); made || err != nil {
			return err
		}
		// No admin could change the power levels here: the tick goes on as
		// for any kind whose preconditions fail (Mix).
	}
	if k == kPowerConflict {
		k = kPower // one event left (a conflict's pair would pass --events), or none made
	}
	v := r.viewOf(s)
	if k == kJoin && r.joined < r.opts.Members && r.joinRule(v.before) != "public" {
		// Invite-only while the room still grows: its admins reopen it, or its
		// members invite people (who join later); otherwise growth would stall
		// for as long as the rule stays.
		k = kInvite
		if r.rng.IntN(2) == 0 {
			k = kJoinRules
		}
	}
	d, ok := r.draftFor(k, v)
	if !ok {
		d, ok = r.draftFor(kMessage, v)
	}
	if !ok {
		d, ok = r.draftFor(kJoin, v)
	}
	if !ok {
		return nil // nobody on this server can act now; the tick passes
	}
	_, err := r.emit(v, d)
	return err
}

// serverJoins makes a server resident through its first user's join (send_join
// through the origin, which receives the join at once).
func (r *room) serverJoins(s *server) error {
	if r.rng.IntN(3) != 0 {
		return nil // servers join over time
	}
	r.join(s)
	v := r.viewOf(s)
	if r.joinRule(v.before) != "public" {
		s.joined = false
		return nil
	}
	ui := s.users[0]
	idx, err := r.emit(v, draft{sender: ui, typ: spec.MRoomMember, stateKey: strp(r.users[ui].id),
		content: map[string]any{"membership": "join", "displayname": r.users[ui].name}})
	if err != nil {
		return err
	}
	r.receive(r.servers[0], idx)
	return nil
}

func member(membership string, u user, extra map[string]any) map[string]any {
	c := map[string]any{"membership": membership}
	if membership == spec.Join || membership == spec.Invite {
		c["displayname"] = u.name
	}
	for k, v := range extra {
		c[k] = v
	}
	return c
}

// draftFor builds an event of kind k that the server's users may send, or reports
// that none applies now.
func (r *room) draftFor(k int, v view) (draft, bool) {
	st := v.before
	joined := func(ui int) bool { return r.membership(st, ui) == spec.Join }
	pl := r.powerLevels(st)
	canState := func(typ string) func(ui int) bool {
		return func(ui int) bool { return joined(ui) && r.level(st, ui) >= pl.EventLevel(typ, true) }
	}
	memberDraft := func(sender, target int, membership string, extra map[string]any) draft {
		return draft{sender: sender, typ: spec.MRoomMember, stateKey: strp(r.users[target].id),
			content: member(membership, r.users[target], extra)}
	}
	switch k {
	case kMessage:
		ui, ok := r.pickUser(v.s, joined)
		return draft{sender: ui, typ: "m.room.message", content: map[string]any{
			"msgtype": "m.text", "body": fmt.Sprintf("message %d from %s", len(r.events), r.users[ui].id)}}, ok
	case kJoin:
		public := r.joinRule(st) == "public"
		ui, ok := r.pickUser(v.s, func(ui int) bool {
			m := r.membership(st, ui)
			return m == spec.Invite || (public && m != spec.Join && m != spec.Ban)
		})
		return memberDraft(ui, ui, spec.Join, nil), ok
	case kLeave:
		ui, ok := r.pickUser(v.s, func(ui int) bool { return joined(ui) && ui != r.creator })
		return memberDraft(ui, ui, spec.Leave, nil), ok
	case kProfile:
		ui, ok := r.pickUser(v.s, joined)
		d := memberDraft(ui, ui, spec.Join, nil)
		d.content.(map[string]any)["displayname"] = fmt.Sprintf("%s (%d)", r.users[ui].name, len(r.events))
		return d, ok
	case kInvite:
		sender, ok := r.pickUser(v.s, func(ui int) bool { return joined(ui) && r.level(st, ui) >= pl.Invite })
		if !ok {
			return draft{}, false
		}
		target, ok := r.pickUser(nil, func(ui int) bool { m := r.membership(st, ui); return m == "" || m == spec.Leave })
		d := memberDraft(sender, target, spec.Invite, nil)
		d.cosign = r.servers[r.users[target].server]
		return d, ok
	case kKick, kBan, kUnban:
		need, membership := pl.Kick, spec.Leave
		if k != kKick {
			need = pl.Ban
		}
		if k == kBan {
			membership = spec.Ban
		}
		sender, ok := r.pickUser(v.s, func(ui int) bool { return joined(ui) && r.level(st, ui) >= need })
		if !ok {
			return draft{}, false
		}
		lvl := r.level(st, sender)
		target, ok := r.pickUser(nil, func(ui int) bool {
			m := r.membership(st, ui)
			switch k {
			case kKick:
				if m != spec.Join {
					return false
				}
			case kBan:
				if m == spec.Ban {
					return false
				}
			case kUnban:
				if m != spec.Ban {
					return false
				}
			}
			return ui != sender && r.level(st, ui) < lvl
		})
		return memberDraft(sender, target, membership, map[string]any{"reason": "moderation"}), ok
	case kPower:
		return r.powerDraft(v, -1)
	case kJoinRules:
		sender, ok := r.pickUser(v.s, canState(spec.MRoomJoinRules))
		rule := "invite"
		if r.joinRule(st) != "public" {
			rule = "public"
		}
		return draft{sender: sender, typ: spec.MRoomJoinRules, stateKey: strp(""), content: map[string]any{"join_rule": rule}}, ok
	case kHistoryVis:
		sender, ok := r.pickUser(v.s, canState("m.room.history_visibility"))
		hv := []string{"shared", "joined", "invited", "world_readable"}[r.rng.IntN(4)]
		return draft{sender: sender, typ: "m.room.history_visibility", stateKey: strp(""), content: map[string]any{"history_visibility": hv}}, ok
	case kTopic:
		sender, ok := r.pickUser(v.s, canState("m.room.topic"))
		return draft{sender: sender, typ: "m.room.topic", stateKey: strp(""), content: map[string]any{"topic": fmt.Sprintf("Topic %d", len(r.events))}}, ok
	case kName:
		sender, ok := r.pickUser(v.s, canState("m.room.name"))
		return draft{sender: sender, typ: "m.room.name", stateKey: strp(""), content: map[string]any{"name": fmt.Sprintf("Room name %d", len(r.events))}}, ok
	case kRedaction:
		sender, ok := r.pickUser(v.s, joined)
		if !ok {
			return draft{}, false
		}
		mod := r.level(st, sender) >= pl.Redact
		for i := len(r.events) - 1; i >= max(0, len(r.events)-200); i-- {
			e := r.events[i]
			if !v.s.known[i] || e.rejected || e.typ != "m.room.message" {
				continue
			}
			if mod || int(e.sender) == sender {
				return r.redaction(sender, e.id), true
			}
		}
		return draft{}, false
	}
	return draft{}, false
}

func (r *room) redaction(sender int, target string) draft {
	d := draft{sender: sender, typ: spec.MRoomRedaction, content: map[string]any{"reason": "redacted"}}
	if r.ver.Version() == gomatrixserverlib.RoomVersionV10 {
		d.redacts = target
	} else {
		d.content.(map[string]any)["redacts"] = target // v11+: redacts moved into content
	}
	return d
}

// powerDraft has an admin of the view's server change one user's power level:
// promote a member to moderator or demote a moderator. With target >= 0 that user
// is changed (a conflict pair acts on the same user).
func (r *room) powerDraft(v view, target int) (draft, bool) {
	st := v.before
	pl := r.powerLevels(st)
	sender, ok := r.pickUser(v.s, func(ui int) bool {
		return r.membership(st, ui) == spec.Join && r.level(st, ui) >= pl.EventLevel(spec.MRoomPowerLevels, true)
	})
	if !ok {
		return draft{}, false
	}
	lvl := r.level(st, sender)
	if target < 0 {
		target, ok = r.pickUser(nil, func(ui int) bool {
			return ui != sender && ui != r.creator && r.membership(st, ui) == spec.Join && r.level(st, ui) < lvl
		})
		if !ok {
			return draft{}, false
		}
	} else if target == sender || target == r.creator || r.level(st, target) >= lvl {
		return draft{}, false
	}
	content, users, ok := r.plContent(st)
	if !ok {
		return draft{}, false
	}
	id := r.users[target].id
	switch {
	case r.level(st, target) >= 50 || r.rng.IntN(4) == 0 && users[id] != nil:
		delete(users, id)
	case len(users) >= maxPowerUsers:
		// As many moderators as a room keeps: demote one instead.
		var mods []string
		for u, l := range users {
			if f, _ := l.(float64); f == 50 && u != r.users[sender].id {
				mods = append(mods, u)
			}
		}
		if len(mods) == 0 {
			return draft{}, false
		}
		slices.Sort(mods)
		delete(users, mods[r.rng.IntN(len(mods))])
	default:
		users[id] = 50
	}
	return draft{sender: sender, typ: spec.MRoomPowerLevels, stateKey: strp(""), content: content}, true
}

// powerConflict has admins on two servers change the same user's power level in
// the same tick, each from its own view, before either hears of the other.
func (r *room) powerConflict(a *server) (made bool, err error) {
	others := slices.DeleteFunc(slices.Clone(r.servers), func(s *server) bool { return s == a || !s.joined })
	if len(others) == 0 {
		return false, nil
	}
	b := others[r.rng.IntN(len(others))]
	va, vb := r.viewOf(a), r.viewOf(b)
	da, ok := r.powerDraft(va, -1)
	if !ok {
		return false, nil
	}
	target := -1
	if ui, ok := r.userIndex(firstChangedUser(r, va.before, da)); ok {
		target = ui
	}
	db, ok := r.powerDraft(vb, target)
	if !ok {
		// Fall back to a moderation conflict: b's moderators kick the user a promotes.
		db, ok = r.draftFor(kKick, vb)
	}
	if _, err := r.emit(va, da); err != nil {
		return true, err
	}
	if ok {
		r.stats.conflicts++
		if _, err := r.emit(vb, db); err != nil {
			return true, err
		}
	}
	return true, nil
}

// firstChangedUser returns the user whose level a power-level draft changes.
func firstChangedUser(r *room, st pmap, d draft) string {
	old := r.powerLevels(st).Users
	users, _ := d.content.(map[string]any)["users"].(map[string]any)
	var ids []string
	for id := range users {
		if _, ok := old[id]; !ok {
			ids = append(ids, id)
		}
	}
	for id := range old {
		if _, ok := users[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	if len(ids) == 0 {
		return ""
	}
	return ids[0]
}

// bad has a user of the server attempt something they lack the permission for;
// the server sends it unchecked and everyone rejects it.
func (r *room) bad(v view) error {
	st := v.before
	r.stats.badAttempts++
	pl := r.powerLevels(st)
	var d draft
	var ok bool
	switch r.rng.IntN(4) {
	case 0: // a user who is not in the room talks
		var ui int
		ui, ok = r.pickUser(v.s, func(ui int) bool { return r.membership(st, ui) != spec.Join })
		d = draft{sender: ui, typ: "m.room.message", content: map[string]any{"msgtype": "m.text", "body": "not a member"}}
	case 1: // a regular member sets the topic
		var ui int
		ui, ok = r.pickUser(v.s, func(ui int) bool {
			return r.membership(st, ui) == spec.Join && r.level(st, ui) < pl.EventLevel("m.room.topic", true)
		})
		d = draft{sender: ui, typ: "m.room.topic", stateKey: strp(""), content: map[string]any{"topic": "unauthorised"}}
	case 2: // a regular member kicks someone
		var sender, target int
		sender, ok = r.pickUser(v.s, func(ui int) bool { return r.membership(st, ui) == spec.Join && r.level(st, ui) < pl.Kick })
		if ok {
			target, ok = r.pickUser(nil, func(ui int) bool { return ui != sender && r.membership(st, ui) == spec.Join })
		}
		d = draft{sender: sender, typ: spec.MRoomMember, stateKey: strp(r.users[target].id), content: map[string]any{"membership": "leave"}}
	default: // a moderator changes the power levels
		var ui int
		ui, ok = r.pickUser(v.s, func(ui int) bool {
			l := r.level(st, ui)
			return r.membership(st, ui) == spec.Join && l < pl.EventLevel(spec.MRoomPowerLevels, true)
		})
		if ok {
			d, ok = r.powerDraftBy(v, ui)
		}
	}
	if !ok {
		return nil
	}
	_, err := r.emit(v, d)
	return err
}

// powerDraftBy is a power-level change by a given (unprivileged) sender: it gives
// the sender the admin level.
func (r *room) powerDraftBy(v view, sender int) (draft, bool) {
	content, users, ok := r.plContent(v.before)
	if !ok {
		return draft{}, false
	}
	users[r.users[sender].id] = 100
	return draft{sender: sender, typ: spec.MRoomPowerLevels, stateKey: strp(""), content: content}, true
}

// maxPowerUsers caps the users map of the power levels (a few admins per server
// and some moderators): beyond it a promotion demotes someone instead, so the
// content every authorisation parses stays small on large rooms.
const maxPowerUsers = 24

// plContent returns a fresh copy of the power-levels content of a state and its
// users map (set in content, so changes to it are in the copy).
func (r *room) plContent(st pmap) (content, users map[string]any, ok bool) {
	idx, ok := st.get(stateKey(spec.MRoomPowerLevels, ""))
	if !ok {
		return nil, nil, false
	}
	if err := json.Unmarshal(r.events[idx].pdu.Content(), &content); err != nil {
		return nil, nil, false
	}
	users, _ = content["users"].(map[string]any)
	if users == nil {
		users = map[string]any{}
	}
	content["users"] = users
	return content, users, true
}
