package smallroom

import (
	"fmt"
	"math/rand"
	"slices"
	"strconv"

	"github.com/matrix-org/gomatrixserverlib/spec"
)

// Options choose a room's shape; a zero field is left to the seed.
type Options struct {
	Version string // room version "1".."12"; "" picks one
	Events  int    // number of events, 2-60; 0 picks one
	Servers int    // number of servers, 1-5; 0 picks one
}

// Bounds of Options.
const (
	MinEvents, MaxEvents   = 2, 60
	MinServers, MaxServers = 1, 5
)

// Versions are the room versions Generate makes.
var Versions = []string{"1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12"}

// userNames name the users, three per server at most.
var userNames = []string{"alice", "bob", "carol", "dan", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "niaj", "olivia", "peggy", "rupert"}

// Generate makes a random room from seed: the same seed and options give the same
// room. Servers act in turn on their own view; at random a server syncs with
// another (learns the events and merges the state it believes), so that branches
// made apart meet again as a merge. About one event in seven is meant to be
// rejected, and some cite odd auth events (see the package comment).
func Generate(seed int64, opts Options) (*Room, error) {
	rng := rand.New(rand.NewSource(seed))
	if opts.Version == "" {
		opts.Version = Versions[rng.Intn(len(Versions))]
	}
	v, err := strconv.Atoi(opts.Version)
	if err != nil || v < 1 || v > 12 {
		return nil, fmt.Errorf("smallroom: room version %q: not one of 1-12", opts.Version)
	}
	if opts.Events == 0 {
		opts.Events = MinEvents + rng.Intn(MaxEvents-MinEvents+1)
	}
	if opts.Servers == 0 {
		opts.Servers = MinServers + rng.Intn(MaxServers-MinServers+1)
	}
	if opts.Events < MinEvents || opts.Events > MaxEvents || opts.Servers < MinServers || opts.Servers > MaxServers {
		return nil, fmt.Errorf("smallroom: %d events, %d servers: outside %d-%d and %d-%d", opts.Events, opts.Servers,
			MinEvents, MaxEvents, MinServers, MaxServers)
	}
	s := &sim{rng: rng, v: v, room: &Room{Seed: seed, Version: opts.Version}, creators: map[string]bool{}}
	for i := 0; i < opts.Servers; i++ {
		srv := &server{idx: i, name: fmt.Sprintf("s%d.test", i), state: map[key]int{}}
		for j := 0; j < 1+rng.Intn(3); j++ {
			srv.users = append(srv.users, len(s.users))
			s.users = append(s.users, "@"+userNames[len(s.users)]+":"+srv.name)
		}
		s.servers = append(s.servers, srv)
	}
	s.start()
	for len(s.room.Events) < opts.Events {
		s.step()
	}
	if err := s.room.validate(); err != nil {
		return nil, err
	}
	return s.room, nil
}

// sim is one generation: the room so far, what the generator knows of each event,
// and the servers' views.
type sim struct {
	rng      *rand.Rand
	v        int
	room     *Room
	facts    []facts
	users    []string // users[0], of server 0, creates the room
	servers  []*server
	creators map[string]bool
}

func (s *sim) chance(p float64) bool { return s.rng.Float64() < p }

// draft is an event a server is about to send.
type draft struct {
	sender  string
	typ     string
	sk      *string
	content map[string]any
	via     string // join_authorised_via_users_server
	note    string
	bad     bool
	pl      *levels
}

// start sends the create event and the creator's join from server 0. In room
// versions 1-10 the create event names the creator in content.creator, and at
// times another user of server 0 sends it: the creator (who joins first and has
// level 100 until there are power levels) is then not the create event's sender.
func (s *sim) start() {
	creator, sender := s.users[0], s.users[0]
	s.creators[creator] = true
	c := map[string]any{"room_version": s.room.Version}
	note := ""
	if s.v <= 10 {
		c["creator"] = creator
		if len(s.servers[0].users) > 1 && s.chance(0.05) {
			sender = s.users[s.servers[0].users[1]]
			note = "creator " + creator + ", sent by " + sender
		}
	}
	if s.v >= 12 && len(s.users) > 1 && s.chance(0.3) {
		extra := s.users[1+s.rng.Intn(len(s.users)-1)]
		c["additional_creators"] = []string{extra}
		s.creators[extra] = true
	}
	srv := s.servers[0]
	s.emit(srv, draft{sender: sender, typ: spec.MRoomCreate, sk: strp(""), content: c, note: note})
	s.emit(srv, s.member(creator, creator, spec.Join, ""))
}

func strp(x string) *string { return &x }

// step lets one server act: a server that does not know the room yet first syncs
// with one that does; others sync at random.
func (s *sim) step() {
	srv := s.servers[s.rng.Intn(len(s.servers))]
	if !srv.knows(0) || s.chance(0.25) || !s.canAct(srv) && s.chance(0.6) {
		var others []*server
		for _, o := range s.servers {
			if o != srv && o.knows(0) {
				others = append(others, o)
			}
		}
		if len(others) > 0 {
			s.sync(srv, others[s.rng.Intn(len(others))])
		}
	}
	if !srv.knows(0) {
		srv = s.servers[0]
	}
	if !s.canAct(srv) && s.chance(0.8) {
		// Nobody here may join nor act (an invite-only room, no invite): most of
		// the time a server with a joined user goes instead.
		for _, o := range s.servers {
			if o.knows(0) && s.canAct(o) {
				srv = o
				break
			}
		}
	}
	s.emit(srv, s.choose(srv))
}

// canAct reports whether a user of srv is joined or may join, in srv's view.
func (s *sim) canAct(srv *server) bool {
	w := view{s, srv}
	rule := w.joinRule()
	for _, ui := range srv.users {
		switch m := w.membership(s.users[ui]); {
		case m == spec.Join, m == spec.Invite:
			return true
		case m == spec.Ban:
		case rule == spec.Public, rule == spec.Knock, rule == spec.KnockRestricted:
			return true
		case rule == spec.Restricted && s.authoriser(w, s.users[ui]) != "":
			return true
		}
	}
	return false
}

func (srv *server) knows(i int) bool { return i < len(srv.known) && srv.known[i] }

func (srv *server) learn(i int) {
	for len(srv.known) <= i {
		srv.known = append(srv.known, false)
	}
	srv.known[i] = true
}

// sync gives srv every event other knows and merges other's belief into srv's:
// a key only one believes is taken, a key both believe differently goes to the
// later event more often than not.
func (s *sim) sync(srv, other *server) {
	for i := range other.known {
		if other.known[i] {
			srv.learn(i)
		}
	}
	keys := make([]key, 0, len(other.state))
	for k := range other.state {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int { return other.state[a] - other.state[b] })
	for _, k := range keys {
		theirs := other.state[k]
		mine, ok := srv.state[k]
		if !ok || mine < theirs && s.chance(0.7) || mine > theirs && s.chance(0.3) {
			srv.state[k] = theirs
		}
	}
}

// member drafts an m.room.member event.
func (s *sim) member(sender, target, membership, via string) draft {
	c := map[string]any{"membership": membership}
	if via != "" {
		c["join_authorised_via_users_server"] = via
	}
	return draft{sender: sender, typ: spec.MRoomMember, sk: strp(target), content: c, via: via}
}

// emit turns a draft into the next event of the room, sent by srv: its prev events
// from srv's tips, its auth events from srv's state (possibly altered: oddAuth),
// its timestamp from its prev events'.
func (s *sim) emit(srv *server, d draft) {
	i := len(s.room.Events)
	w := view{s, srv}
	e := Event{Name: "e" + strconv.Itoa(i), Sender: d.sender, Type: d.typ, StateKey: d.sk, Content: mustJSON(d.content), Note: d.note}
	f := facts{bad: d.bad, tip: !d.bad || s.chance(0.2), pl: d.pl}
	switch d.typ {
	case spec.MRoomMember:
		f.membership, _ = d.content["membership"].(string)
	case spec.MRoomJoinRules:
		f.joinRule, _ = d.content["join_rule"].(string)
	}
	if i > 0 {
		e.Prev = s.prevEvents(srv)
		for _, k := range selection(s.v, d.sender, d.typ, d.sk, f.membership, d.via) {
			if a, ok := w.get(k); ok {
				e.Auth = append(e.Auth, a)
			}
		}
		if d.bad && isFault(d.note) && !s.applyFault(srv, &e) {
			f.bad, f.tip, e.Note = false, true, "" // no event srv knows would do: sent as drafted
		}
		if !f.bad && s.chance(0.05) {
			s.oddAuth(srv, &e)
		}
		var ts int64
		for _, p := range e.Prev {
			ts = max(ts, s.room.Events[p].TS)
		}
		switch r := s.rng.Float64(); {
		case r < 0.15: // the same as its latest parent
		case r < 0.3: // older than its parents
			ts -= 1 + s.rng.Int63n(3)
		default:
			ts += 1 + s.rng.Int63n(3)
		}
		e.TS = ts
	} else {
		e.TS = 1000
	}
	s.room.Events = append(s.room.Events, e)
	s.facts = append(s.facts, f)
	srv.learn(i)
	if e.StateKey != nil && !f.bad {
		srv.state[key{e.Type, *e.StateKey}] = i
	}
}

// prevEvents picks prev_events for srv's next event: most often all its tips (at
// most 10), else one tip, a sibling of a tip, or an older event (a fork from the
// past).
func (s *sim) prevEvents(srv *server) []int {
	tips := s.tips(srv)
	switch r := s.rng.Float64(); {
	case r < 0.12:
		return []int{tips[s.rng.Intn(len(tips))]}
	case r < 0.18:
		t := tips[s.rng.Intn(len(tips))]
		if p := s.room.Events[t].Prev; len(p) > 0 {
			return slices.Clone(p)
		}
	case r < 0.22:
		var old []int
		for i := range srv.known {
			if srv.known[i] && s.facts[i].tip {
				old = append(old, i)
			}
		}
		return []int{old[s.rng.Intn(len(old))]}
	}
	if len(tips) > 10 {
		s.rng.Shuffle(len(tips), func(a, b int) { tips[a], tips[b] = tips[b], tips[a] })
		tips = tips[:10]
		slices.Sort(tips)
	}
	return tips
}

// tips are the events srv knows that may be built on and that no such known event
// names in prev_events.
func (s *sim) tips(srv *server) []int {
	child := make([]bool, len(srv.known))
	for i := range srv.known {
		if srv.known[i] && s.facts[i].tip {
			for _, p := range s.room.Events[i].Prev {
				child[p] = true
			}
		}
	}
	var tips []int
	for i := range srv.known {
		if srv.known[i] && s.facts[i].tip && !child[i] {
			tips = append(tips, i)
		}
	}
	if len(tips) == 0 {
		tips = append(tips, 0)
	}
	return tips
}
