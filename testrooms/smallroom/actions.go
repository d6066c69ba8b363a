package smallroom

import (
	"slices"
	"strconv"

	"github.com/matrix-org/gomatrixserverlib/spec"
)

// Auth faults: drafts whose auth_events break a rule on the auth events list
// (Matrix spec v1.19, "Authorisation rules": rule 2 of room versions 1-11, 3 of
// version 12).
const (
	faultOtherKey  = "bad: an auth event of a key the selection does not name"
	faultDuplicate = "bad: two auth events of one key"
	faultRejected  = "bad: cites a rejected auth event"
	faultNoCreate  = "bad: no m.room.create among its auth events"
)

func isFault(note string) bool {
	return note == faultOtherKey || note == faultDuplicate || note == faultRejected || note == faultNoCreate
}

// choose drafts srv's next event: one of its users acts on srv's naive state. A
// joined user is preferred; about one draft in eight is meant to be rejected.
func (s *sim) choose(srv *server) draft {
	w := view{s, srv}
	var joined []string
	for _, ui := range srv.users {
		if w.membership(s.users[ui]) == spec.Join {
			joined = append(joined, s.users[ui])
		}
	}
	u := s.users[srv.users[s.rng.Intn(len(srv.users))]]
	if len(joined) > 0 && s.chance(0.7) {
		u = joined[s.rng.Intn(len(joined))]
	}
	if s.chance(0.13) {
		if d, ok := s.badDraft(w, u); ok {
			return d
		}
	}
	if w.membership(u) != spec.Join {
		d := s.enter(w, u)
		if !d.bad || len(joined) == 0 || s.chance(0.1) {
			return d
		}
		// Mostly, a user the rules keep out waits and a joined one acts.
		u = joined[s.rng.Intn(len(joined))]
	}
	return s.act(w, u)
}

// enter drafts a membership change of a user not joined: a join the naive state
// allows (public, invited, restricted through a joined user who may invite), a
// knock, a rejected invite, or else a join the join rules forbid.
func (s *sim) enter(w view, u string) draft {
	m, rule := w.membership(u), w.joinRule()
	switch {
	case m == spec.Ban:
		d := s.member(u, u, spec.Join, "")
		d.bad, d.note = true, "bad: a banned user joins"
		return d
	case m == spec.Invite && s.chance(0.2), m == spec.Knock && s.chance(0.3):
		return s.member(u, u, spec.Leave, "")
	case rule == spec.Public || m == spec.Invite:
		return s.member(u, u, spec.Join, "")
	case restrictedRule(rule) && (rule == spec.Restricted || s.chance(0.5)):
		if via := s.authoriser(w, u); via != "" {
			return s.member(u, u, spec.Join, via)
		}
	case rule == spec.Knock || rule == spec.KnockRestricted:
		return s.member(u, u, spec.Knock, "")
	}
	d := s.member(u, u, spec.Join, "")
	d.bad, d.note = true, "bad: a join the join rules forbid"
	return d
}

// authoriser returns a joined user other than u who may invite, for u's
// restricted join (join_authorised_via_users_server), or "".
func (s *sim) authoriser(w view, u string) string {
	return s.pick(w, func(x string) bool {
		return x != u && w.membership(x) == spec.Join && w.level(x) >= w.named("invite")
	})
}

// pick returns a random user for which ok holds, or "".
func (s *sim) pick(w view, ok func(user string) bool) string {
	var c []string
	for _, x := range s.users {
		if ok(x) {
			c = append(c, x)
		}
	}
	if len(c) == 0 {
		return ""
	}
	return c[s.rng.Intn(len(c))]
}

// act drafts what a joined user u does, among what its level allows in srv's
// naive state: weighted messages, topics and names, leaving, profile re-joins,
// invites, kicks, bans, unbans, power levels and join rules changes.
func (s *sim) act(w view, u string) draft {
	level := w.level(u)
	type option struct {
		weight float64
		make   func() draft
	}
	var opts []option
	add := func(weight float64, ok bool, make func() draft) {
		if ok {
			opts = append(opts, option{weight, make})
		}
	}
	n := strconv.Itoa(len(s.room.Events))
	add(2, level >= w.stateLevel("m.room.message", false), func() draft {
		return draft{sender: u, typ: "m.room.message", content: map[string]any{"msgtype": "m.text", "body": "m" + n}}
	})
	add(1.2, level >= w.stateLevel(spec.MRoomTopic, true), func() draft {
		return draft{sender: u, typ: spec.MRoomTopic, sk: strp(""), content: map[string]any{"topic": "t" + n}}
	})
	add(0.8, level >= w.stateLevel(spec.MRoomName, true), func() draft {
		return draft{sender: u, typ: spec.MRoomName, sk: strp(""), content: map[string]any{"name": "n" + n}}
	})
	leave := 0.5
	if level >= w.named("invite") && s.pick(w, func(x string) bool { return x != u && w.membership(x) == spec.Join }) == "" {
		leave = 0.02 // the last one in who can let others in stays, mostly
	}
	add(leave, true, func() draft { return s.member(u, u, spec.Leave, "") })
	add(0.3, true, func() draft {
		d := s.member(u, u, spec.Join, "")
		d.content["displayname"] = "d" + n
		return d
	})
	invitee := s.pick(w, func(x string) bool {
		m := w.membership(x)
		return m != spec.Join && m != spec.Ban && m != spec.Invite
	})
	add(1.5, invitee != "" && level >= w.named("invite"), func() draft { return s.member(u, invitee, spec.Invite, "") })
	below := func(ms ...string) string {
		return s.pick(w, func(x string) bool { return x != u && slices.Contains(ms, w.membership(x)) && w.level(x) < level })
	}
	kickee, banee, unbanee := below(spec.Join, spec.Invite, spec.Knock), below(spec.Join, spec.Invite, spec.Knock, spec.Leave, ""), below(spec.Ban)
	add(1, kickee != "" && level >= w.named("kick"), func() draft { return s.member(u, kickee, spec.Leave, "") })
	add(0.8, banee != "" && level >= w.named("ban"), func() draft { return s.member(u, banee, spec.Ban, "") })
	add(0.4, unbanee != "" && level >= w.named("ban") && level >= w.named("kick"), func() draft {
		return s.member(u, unbanee, spec.Leave, "")
	})
	setup := 1.0
	if w.pl() == nil && s.creators[u] {
		setup = 8 // the creator sets the room up first, most of the time
	}
	add(2*setup, level >= w.stateLevel(spec.MRoomPowerLevels, true), func() draft { return s.powerChange(w, u, false) })
	setup = 1.0
	if w.joinRule() == "" && s.creators[u] {
		setup = 5
	}
	add(1.5*setup, level >= w.stateLevel(spec.MRoomJoinRules, true), func() draft { return s.joinRulesChange(u) })
	var total float64
	for _, o := range opts {
		total += o.weight
	}
	x := s.rng.Float64() * total
	for _, o := range opts {
		if x -= o.weight; x < 0 {
			return o.make()
		}
	}
	return opts[len(opts)-1].make()
}

// joinRulesChange drafts an m.room.join_rules of a rule the version has (with an
// allow list for the restricted ones).
func (s *sim) joinRulesChange(u string) draft {
	rules := joinRules(s.v)
	r := rules[s.rng.Intn(len(rules))]
	c := map[string]any{"join_rule": r}
	if restrictedRule(r) {
		c["allow"] = []any{map[string]any{"type": "m.room_membership", "room_id": "!other:s0.test"}}
	}
	return draft{sender: u, typ: spec.MRoomJoinRules, sk: strp(""), content: c}
}

// defaultLevels is a first power levels content: the creator at 100 (in v12 the
// creators are above any level and stay out of users), at times a moderator.
func (s *sim) defaultLevels() *levels {
	l := &levels{users: map[string]int64{}, events: map[string]int64{}, ban: 50, kick: 50, redact: 50, stateDefault: 50}
	if s.v <= 11 {
		l.users[s.users[0]] = 100
	}
	if len(s.users) > 1 && s.chance(0.5) {
		if mod := s.users[1+s.rng.Intn(len(s.users)-1)]; !(s.v >= 12 && s.creators[mod]) {
			l.users[mod] = 50
		}
	}
	if s.chance(0.3) {
		l.invite = 50
	}
	return l
}

var levelChoices = []int64{0, 10, 50, 75, 100}

// powerChange drafts u's next m.room.power_levels: one change to a user's level,
// a named level or an event type's level. Unless bad, only what the rules let u
// change (levels at or below its own, users below it); bad raises u above itself.
func (s *sim) powerChange(w view, u string, bad bool) draft {
	own := w.level(u)
	nl := s.defaultLevels()
	if cur := w.pl(); cur != nil {
		nl = cur.clone()
	}
	d := draft{sender: u, typ: spec.MRoomPowerLevels, sk: strp(""), pl: nl}
	allowed := func(old int64) []int64 {
		var c []int64
		for _, x := range levelChoices {
			if x <= own && old <= own {
				c = append(c, x)
			}
		}
		return c
	}
	switch r := s.rng.Float64(); {
	case bad:
		nl.users[u] = own + 1 + s.rng.Int63n(50)
		d.bad, d.note = true, "bad: raises the sender above its own level"
	case r < 0.5:
		t := s.pick(w, func(x string) bool { return !(s.v >= 12 && s.creators[x]) && (x == u || w.level(x) < own) })
		if c := allowed(0); t != "" && len(c) > 0 {
			nl.users[t] = c[s.rng.Intn(len(c))]
		}
	case r < 0.8:
		names := []*int64{&nl.ban, &nl.kick, &nl.invite, &nl.stateDefault, &nl.eventsDefault, &nl.redact, &nl.usersDefault}
		p := names[s.rng.Intn(len(names))]
		if c := allowed(*p); len(c) > 0 {
			*p = c[s.rng.Intn(len(c))]
		}
	default:
		types := []string{spec.MRoomTopic, spec.MRoomName, spec.MRoomPowerLevels, spec.MRoomJoinRules, "m.room.message"}
		t := types[s.rng.Intn(len(types))]
		old, ok := nl.events[t]
		if !ok {
			old = 0
		}
		if c := allowed(old); len(c) > 0 {
			nl.events[t] = c[s.rng.Intn(len(c))]
		}
	}
	if s.v <= 9 && len(nl.users) > 0 && s.chance(0.08) {
		for x := range nl.users {
			if nl.stringLevel == "" || x < nl.stringLevel {
				nl.stringLevel = x
			}
		}
	}
	d.content = nl.content()
	return d
}

// badDraft drafts an event meant to be rejected: a sender without the power it
// needs, a join the join rules forbid, a kick of a user at or above the sender, or
// an event whose auth_events break a rule on them (faults; emit applies them). It
// returns false when none of them fits u and srv's state.
func (s *sim) badDraft(w view, u string) (draft, bool) {
	joined := w.membership(u) == spec.Join
	level := w.level(u)
	switch s.rng.Intn(4) {
	case 0:
		if joined && level < w.stateLevel(spec.MRoomTopic, true) {
			d := draft{sender: u, typ: spec.MRoomTopic, sk: strp(""), content: map[string]any{"topic": "bad"}}
			d.bad, d.note = true, "bad: sender lacks power for m.room.topic"
			return d, true
		}
		if joined && w.pl() != nil && level < infiniteLevel && level >= w.stateLevel(spec.MRoomPowerLevels, true) {
			return s.powerChange(w, u, true), true
		}
	case 1:
		if !joined && w.joinRule() == spec.Invite && w.membership(u) != spec.Invite {
			d := s.member(u, u, spec.Join, "")
			d.bad, d.note = true, "bad: a join the join rules forbid"
			return d, true
		}
		if t := s.pick(w, func(x string) bool { return x != u && w.membership(x) == spec.Join && w.level(x) >= level }); joined && t != "" {
			d := s.member(u, t, spec.Leave, "")
			d.bad, d.note = true, "bad: kicks a user at or above the sender's level"
			return d, true
		}
	}
	if !joined {
		return draft{}, false
	}
	faults := []string{faultOtherKey, faultDuplicate, faultRejected}
	if s.v <= 11 {
		faults = append(faults, faultNoCreate)
	}
	d := s.act(w, u)
	d.bad, d.note = true, faults[s.rng.Intn(len(faults))]
	return d, true
}

// applyFault alters the auth events of e (drafted by srv, meant to be rejected)
// as its note says. It returns false when srv knows no event that would do.
func (s *sim) applyFault(srv *server, e *Event) bool {
	cited := map[key]bool{}
	for _, a := range e.Auth {
		cited[s.room.Events[a].key()] = true
	}
	var cand []int
	for i := range srv.known {
		if !srv.known[i] || !s.room.Events[i].IsState() || slices.Contains(e.Auth, i) {
			continue
		}
		k := s.room.Events[i].key()
		switch e.Note {
		case faultOtherKey:
			if !slices.Contains(selection(s.v, e.Sender, e.Type, e.StateKey, "", ""), k) && !cited[k] && k != createKey {
				cand = append(cand, i)
			}
		case faultDuplicate:
			if cited[k] {
				cand = append(cand, i)
			}
		case faultRejected:
			if cited[k] && s.facts[i].bad {
				cand = append(cand, i)
			}
		}
	}
	if e.Note == faultNoCreate {
		if len(e.Auth) == 0 || e.Auth[0] != 0 {
			return false
		}
		e.Auth = e.Auth[1:]
		return true
	}
	if len(cand) == 0 {
		return false
	}
	c := cand[s.rng.Intn(len(cand))]
	if e.Note == faultRejected {
		k := s.room.Events[c].key()
		e.Auth = slices.DeleteFunc(e.Auth, func(a int) bool { return s.room.Events[a].key() == k })
	}
	e.Auth = append(e.Auth, c)
	return true
}

// oddAuth makes e cite a power levels event srv knows other than the one it
// believes: an older one or one of another branch. The event is not meant to be
// rejected; what the rules make of it is the point.
func (s *sim) oddAuth(srv *server, e *Event) {
	cur, ok := srv.state[powerKey]
	if !ok {
		return
	}
	var cand []int
	for i := range srv.known {
		if srv.known[i] && i != cur && !s.facts[i].bad && s.room.Events[i].key() == powerKey {
			cand = append(cand, i)
		}
	}
	if len(cand) == 0 {
		return
	}
	c := cand[s.rng.Intn(len(cand))]
	for j, a := range e.Auth {
		if a == cur {
			e.Auth[j] = c
		}
	}
	e.Note = "auth: power levels " + s.room.Events[c].Name + ", not " + s.room.Events[cur].Name + " as believed"
}

// key returns a state event's key (the zero key for other events).
func (e *Event) key() key {
	if e.StateKey == nil {
		return key{}
	}
	return key{e.Type, *e.StateKey}
}
