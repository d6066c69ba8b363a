package smallroom

import (
	"encoding/json"
	"slices"
	"strconv"

	"github.com/matrix-org/gomatrixserverlib/spec"
)

// key is a state key: (event_type, state_key).
type key struct{ typ, sk string }

func memberKey(user string) key { return key{spec.MRoomMember, user} }

var (
	createKey     = key{spec.MRoomCreate, ""}
	powerKey      = key{spec.MRoomPowerLevels, ""}
	joinRulesKey  = key{spec.MRoomJoinRules, ""}
	infiniteLevel = int64(1) << 62 // room version 12's creators
)

// levels is the part of an m.room.power_levels content the generator models.
type levels struct {
	users                                     map[string]int64
	usersDefault, eventsDefault, stateDefault int64
	ban, kick, invite, redact                 int64
	events                                    map[string]int64
	stringLevel                               string // a users entry written as a string (v1-9 allow it)
}

func (l *levels) clone() *levels {
	c := *l
	c.users = make(map[string]int64, len(l.users))
	for u, x := range l.users {
		c.users[u] = x
	}
	c.events = make(map[string]int64, len(l.events))
	for t, x := range l.events {
		c.events[t] = x
	}
	c.stringLevel = ""
	return &c
}

// content is the levels as an m.room.power_levels content.
func (l *levels) content() map[string]any {
	users := map[string]any{}
	for u, x := range l.users {
		users[u] = x
		if u == l.stringLevel {
			users[u] = strconv.FormatInt(x, 10)
		}
	}
	events := map[string]any{}
	for t, x := range l.events {
		events[t] = x
	}
	return map[string]any{"users": users, "users_default": l.usersDefault, "events_default": l.eventsDefault,
		"state_default": l.stateDefault, "ban": l.ban, "kick": l.kick, "invite": l.invite, "redact": l.redact, "events": events}
}

// facts is what the generator remembers of an event it made.
type facts struct {
	bad        bool // meant to be rejected: kept out of every server's naive state
	tip        bool // may be named in prev_events by later events
	membership string
	pl         *levels
	joinRule   string
}

// server is one homeserver's naive view: the events it knows and the state it
// believes, built from its own events and, at a sync, another server's belief
// merged key by key (it need not be any resolution).
type server struct {
	idx   int
	name  string
	users []int
	known []bool
	state map[key]int
}

// view answers the authorization questions the generator asks of a server's
// naive state (approximately the rules: a wrong guess only makes one more or one
// fewer rejection).
type view struct {
	s   *sim
	srv *server
}

func (w view) get(k key) (int, bool) {
	i, ok := w.srv.state[k]
	return i, ok
}

func (w view) membership(user string) string {
	if i, ok := w.get(memberKey(user)); ok {
		return w.s.facts[i].membership
	}
	return ""
}

func (w view) pl() *levels {
	if i, ok := w.get(powerKey); ok {
		return w.s.facts[i].pl
	}
	return nil
}

func (w view) joinRule() string {
	if i, ok := w.get(joinRulesKey); ok {
		return w.s.facts[i].joinRule
	}
	return ""
}

func (w view) level(user string) int64 {
	if w.s.creators[user] && w.s.v >= 12 {
		return infiniteLevel
	}
	pl := w.pl()
	if pl == nil {
		if w.s.creators[user] {
			return 100
		}
		return 0
	}
	if x, ok := pl.users[user]; ok {
		return x
	}
	return pl.usersDefault
}

// stateLevel is the level an event of type typ needs (state event or not).
func (w view) stateLevel(typ string, state bool) int64 {
	pl := w.pl()
	if pl == nil {
		return 0
	}
	if x, ok := pl.events[typ]; ok {
		return x
	}
	if state {
		return pl.stateDefault
	}
	return pl.eventsDefault
}

// named is one of the levels ban, kick, invite (defaults as the spec gives them
// without a power levels event: Matrix spec v1.19, Server-Server API, "Authorisation
// rules", "Definitions").
func (w view) named(name string) int64 {
	pl := w.pl()
	switch {
	case pl == nil && name == "invite":
		return 0
	case pl == nil:
		return 50
	case name == "ban":
		return pl.ban
	case name == "kick":
		return pl.kick
	}
	return pl.invite
}

// joinRules lists the join rules a room version has.
func joinRules(v int) []string {
	rules := []string{spec.Public, spec.Invite}
	if v >= 7 {
		rules = append(rules, spec.Knock)
	}
	if v >= 8 {
		rules = append(rules, spec.Restricted)
	}
	if v >= 10 {
		rules = append(rules, spec.KnockRestricted)
	}
	return rules
}

func restrictedRule(r string) bool { return r == spec.Restricted || r == spec.KnockRestricted }

// selection returns the keys the auth events selection (Matrix spec v1.19,
// Server-Server API, "Auth events selection") names for an event, in the order it
// cites them; v12 leaves out the create event (the room ID names it).
func selection(v int, sender, typ string, sk *string, membership, via string) []key {
	var keys []key
	if v <= 11 {
		keys = append(keys, createKey)
	}
	keys = append(keys, powerKey, memberKey(sender))
	if typ != spec.MRoomMember || sk == nil {
		return keys
	}
	if *sk != sender {
		keys = append(keys, memberKey(*sk))
	}
	switch membership {
	case spec.Join, spec.Invite, spec.Knock:
		keys = append(keys, joinRulesKey)
	}
	if membership == spec.Join && via != "" && v >= 8 && !slices.Contains(keys, memberKey(via)) {
		keys = append(keys, memberKey(via))
	}
	return keys
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // maps of strings and numbers only
	}
	return b
}
