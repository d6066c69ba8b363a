package resolver

import (
	"github.com/hashicorp/golang-lru/v2"
	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/mtxdb/mtxdb/authrules"
)

// prefetcher parses the PDUs of the events ahead of the replay on another
// goroutine, so that loading and parsing runs beside resolution on a second
// core. It also checks each state event (and each event of a type whose rules
// read its content: see Cache.allowedOnce) against its own auth events with the
// authorization rules, the first of a server's two checks on receipt, which
// depends on nothing the replay computes. Each parsed PDU enters the resolver's
// cache, and each outcome is used, when the replay reaches its event.
type prefetcher struct {
	r      *roomResolver
	out    chan prefetched
	done   chan struct{} // closed by stop
	exited chan struct{} // closed when the goroutine has returned

	// Owned by the goroutine: its own authorizer (authrules keeps what it
	// parses per authorizer) and the state PDUs it parsed, as auth events of
	// the events after them.
	authorize func(p gomatrixserverlib.PDU, authEvents []gomatrixserverlib.PDU) error
	// members and others hold auth events apart, as the replay's caches do:
	// the member events that come and go by the hundred thousand in a large
	// room would push out the create, power levels and join rules events
	// every check reads.
	members, others *lru.Cache[string, gomatrixserverlib.PDU]
	plain           map[checkKey]struct{} // plainCheckKey of the plain events checked
	// heads keeps what an eventHead gives of each member event parsed here, so
	// that a member event the members cache has let go is still an auth event
	// (as the replay's authEvent gives it); empty when the room ID does not
	// parse.
	heads   headTable
	g       *graph
	roomID  spec.RoomID
	version gomatrixserverlib.RoomVersion
}

// prefetched is one event ahead of the replay.
type prefetched struct {
	id  string
	pdu gomatrixserverlib.PDU // nil when loading failed (the replay loads it again and reports)
	// checked: authErr is the outcome of the rules against the event's auth
	// events (authrules.Authorize), which Cache.allowedOnce would compute.
	checked bool
	authErr error
	// facts: what the prefetcher read of a member event for its headTable,
	// handed to the replay's (nil: not read).
	facts *headFacts
}

// prefetchWindow is how many parsed PDUs may wait ahead of the replay (~2 KB each).
const prefetchWindow = 1024

// prefetchMembers bounds the member events the prefetcher keeps parsed as auth
// events (the others are bounded as the replay's are, otherCacheSize); it keeps
// the member events it let go as eventHeads (sized with pduCacheSize; a
// variable for the tests).
var prefetchMembers = 4096

// prefetch starts parsing the PDUs of order on another goroutine. The
// create, power levels, join rules and third-party invite events the replay
// holds parsed are the prefetcher's first auth events (a replay that resumes
// has parsed none of the events before order).
func (rp *replay) prefetch(order []int32) *prefetcher {
	members, _ := lru.New[string, gomatrixserverlib.PDU](prefetchMembers)
	others, _ := lru.New[string, gomatrixserverlib.PDU](otherCacheSize)
	for _, p := range rp.r.others.Values() { // PDUs are not modified once parsed: shared
		others.Add(p.EventID(), p)
	}
	pf := &prefetcher{r: rp.r, out: make(chan prefetched, prefetchWindow), done: make(chan struct{}), exited: make(chan struct{}),
		authorize: authrules.NewAuthorizer(), members: members, others: others, plain: map[checkKey]struct{}{}}
	g, room := rp.g, rp.r.room
	pf.g = g
	if rp.r.roomID != nil {
		pf.heads, pf.roomID = newHeadTable(len(g.ids)), *rp.r.roomID
		pf.version = gomatrixserverlib.RoomVersion(room.Head().RoomVersion)
	}
	go func() {
		defer close(pf.exited)
		defer close(pf.out)
		for _, i := range order {
			x := prefetched{id: g.ids[i]}
			if p, err := room.StoredEvent(g.ids[i], g.g.Redacted[i]); err == nil {
				x.pdu = p
				x.checked, x.authErr = pf.checkAhead(p)
				switch {
				case p.StateKey() == nil || !authTypes[p.Type()]:
				case p.Type() == spec.MRoomMember:
					pf.members.Add(x.id, p)
					f := factsOf(p)
					pf.heads.learn(g, p, &f)
					x.facts = &f
				default:
					pf.others.Add(x.id, p)
				}
			}
			select {
			case pf.out <- x:
			case <-pf.done:
				return
			}
		}
	}()
	return pf
}

// checkAhead checks p against its auth events, when this goroutine parsed each
// of them lately and has not made the same plain event's check before
// (Cache.allowedOnce); false when it does not check (the replay then checks p
// itself).
func (pf *prefetcher) checkAhead(p gomatrixserverlib.PDU) (bool, error) {
	if !aheadAuth {
		return false, nil
	}
	ids := p.AuthEventIDs()
	var plainKey checkKey
	plain := p.StateKey() == nil && !contentRuled[p.Type()]
	if plain {
		// The replay's Cache most likely holds the outcome of a plain event
		// whose check this goroutine made (their bounds differ: the replay
		// checks what it misses itself).
		plainKey = plainCheckKey(p, ids)
		if _, ok := pf.plain[plainKey]; ok {
			return false, nil
		}
	}
	auth := make([]gomatrixserverlib.PDU, 0, len(ids))
	for _, id := range ids {
		a, ok := pf.others.Get(id)
		if !ok {
			a, ok = pf.members.Get(id)
		}
		if !ok {
			a, ok = pf.memberHead(id)
		}
		if !ok {
			// Not parsed here: the replay checks p with its own caches, rather
			// than parsing the event a second time.
			return false, nil
		}
		auth = append(auth, a)
	}
	if plain {
		if len(pf.plain) >= maxAuthChecks {
			clear(pf.plain)
		}
		pf.plain[plainKey] = struct{}{}
	}
	return true, pf.authorize(p, auth)
}

// memberHead returns the eventHead of a member event parsed here whose
// membership is kept, as the replay's authEvent would give it.
func (pf *prefetcher) memberHead(id string) (gomatrixserverlib.PDU, bool) {
	if pf.heads.memb == nil {
		return nil, false
	}
	i, ok := pf.g.index.find(pf.g.ids, id)
	if !ok || pf.heads.memb[i] == membUnknown {
		return nil, false
	}
	h, ok := pf.heads.head(pf.g, i, pf.roomID, pf.version)
	if !ok {
		return nil, false
	}
	return h, true
}

// aheadAuth turns checkAhead on (tests turn it off to compare).
var aheadAuth = true

// contentRuled are the event types whose authorization rules gomatrixserverlib
// picks by type, state key or not: their rules read the content.
var contentRuled = map[string]bool{spec.MRoomCreate: true, spec.MRoomAliases: true, spec.MRoomMember: true,
	spec.MRoomPowerLevels: true, spec.MRoomRedaction: true}

// take receives the PDU of the next event of the replay order, caches it and
// hands its outcome against its auth events, if checked, to the authorisation.
func (pf *prefetcher) take() {
	if pf == nil {
		return
	}
	pf.r.ahead = prefetched{}
	if x, ok := <-pf.out; ok && x.pdu != nil {
		pf.r.stats.EventsLoaded++ // parsed on the prefetching goroutine
		if !pf.r.holds(x.id) {
			pf.r.keep(x.pdu, x.facts)
		}
		pf.r.ahead = x
	}
}

// stop ends the prefetching goroutine and waits for it (no read of the store is
// left running when Replay returns: the caller may close it).
func (pf *prefetcher) stop() {
	if pf != nil {
		close(pf.done)
		<-pf.exited
	}
}
