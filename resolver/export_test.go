package resolver

import (
	"fmt"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/mtxdb/mtxdb/authrules"
	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/roomstate"
)

// ForceWalk makes the lockstep walks (v2.1's conflicted subgraph, step 1's power
// subset) use only the ancestors walk ("up") or, where the source allows it, only
// the descendants walk ("down"), until the returned function restores the default.
func ForceWalk(dir string) (restore func()) {
	old := walkDirection
	switch dir {
	case "up":
		walkDirection = walkUp
	case "down":
		walkDirection = walkDown
	default:
		panic("ForceWalk: " + dir)
	}
	return func() { walkDirection = old }
}

// Sources of a stateRes for ConflictedSubgraph and PowerSubset: events only
// (whole auth chains walked up), the GraphSource methods (lockstep by event ID),
// or the roomResolver itself (lockstep over its auth index by handle).
const (
	WalkPlain = "plain"
	WalkGraph = "graph"
	WalkIndex = "index"
)

// WalkModes are the three, in the order tests run them.
var WalkModes = []string{WalkPlain, WalkGraph, WalkIndex}

// graphOnly hides a GraphSource's other methods (the roomResolver's).
type graphOnly struct{ GraphSource }

// stateResFor returns a stateRes over src of the given mode.
func stateResFor(mode string, src EventSource) *stateRes {
	switch mode {
	case WalkPlain:
		return &stateRes{src: src, pdus: map[string]gomatrixserverlib.PDU{}}
	case WalkGraph:
		return newStateRes(graphOnly{src.(GraphSource)})
	case WalkIndex:
		if _, ok := src.(*roomResolver); !ok {
			panic("stateResFor: index mode needs the roomResolver")
		}
		return newStateRes(src)
	}
	panic("stateResFor: " + mode)
}

// ConflictedSubgraph is conflictedSubgraph for src, read as mode says.
func ConflictedSubgraph(mode string, src EventSource, conflicted map[string]bool) (map[string]bool, error) {
	return conflictedSubgraph(stateResFor(mode, src), conflicted)
}

// PowerSubset is step 1's set of the full conflicted set ids, for src read as
// mode says.
func PowerSubset(mode string, src EventSource, ids []string) ([]string, error) {
	st := stateResFor(mode, src)
	full := map[string]bool{}
	for _, id := range ids {
		p, err := st.event(id)
		if err != nil {
			return nil, err
		}
		st.pdus[id] = p
		full[id] = true
	}
	return st.powerSubset(ids, full)
}

// AllowedOnce is Cache.allowedOnce.
func (c *Cache) AllowedOnce(p gomatrixserverlib.PDU, auth []gomatrixserverlib.PDU) error {
	return c.allowedOnce(p, auth)
}

// AuthorizeAgainst checks a PDU against a whole state map: the entries the
// authorization rules read for it (and, in room versions whose create event is
// implied by the room ID, the create event from its auth_events). It returns nil
// when the event is allowed, an error wrapping errRejected otherwise.
func AuthorizeAgainst(p gomatrixserverlib.PDU, state StateMap, src EventSource) error {
	var list []gomatrixserverlib.PDU
	have := map[Key]bool{}
	for _, t := range gomatrixserverlib.StateNeededForAuth([]gomatrixserverlib.PDU{p}).Tuples() {
		k := Key{Type: t.EventType, StateKey: t.StateKey}
		if id, ok := state[k]; ok && !have[k] {
			e, err := src.Event(id)
			if err != nil {
				return fmt.Errorf("%w: %s: %v", errNoEvent, id, err)
			}
			list, have[k] = append(list, e), true
		}
	}
	ck := Key{Type: spec.MRoomCreate, StateKey: ""}
	if id, ok := state[ck]; ok && !have[ck] && p.Type() != spec.MRoomCreate {
		if e, err := src.Event(id); err == nil {
			list = append(list, e)
		}
	}
	if err := authrules.Authorize(p, list); err != nil {
		return fmt.Errorf("%w: event %s: %v", errRejected, p.EventID(), err)
	}
	return nil
}

// AuthDifferenceOf is the auth difference ResolveConflicts computes for the
// given whole state maps through the Resolver's per-resolution view of its
// auth index (the conflicted keys, per-state conflicted events and unconflicted
// map taken from the maps as Resolve takes them from snapshots).
func AuthDifferenceOf(r *Resolver, maps []StateMap) ([]string, error) {
	keys := map[Key]bool{}
	for _, m := range maps {
		for k := range m {
			keys[k] = true
		}
	}
	conflicted := map[Key]bool{}
	for k := range keys {
		v0, ok0 := maps[0][k]
		for _, m := range maps[1:] {
			if v, ok := m[k]; ok != ok0 || v != v0 {
				conflicted[k] = true
			}
		}
	}
	perState := make([][]string, len(maps))
	for _, k := range sortedKeys(func() map[Key]string {
		out := map[Key]string{}
		for k := range conflicted {
			out[k] = ""
		}
		return out
	}()) {
		for i, m := range maps {
			if id, ok := m[k]; ok {
				perState[i] = append(perState[i], id)
			}
		}
	}
	unconflicted := func(k Key) (string, bool, error) {
		if conflicted[k] {
			return "", false, nil
		}
		id, ok := maps[0][k]
		return id, ok, nil
	}
	g, err := r.graph()
	if err != nil {
		return nil, err
	}
	memo := &keyMemo{}
	memo.reset(len(g.keys))
	view := &resView{g: g, upTo: r.upTo, unconflicted: unconflictedByID(g, unconflicted), memo: memo}
	diff, err := authDifference(perState, view)
	if err == nil {
		err = view.err
	}
	return diff, err
}

// SetMinCutDepth sets the lineage depth from which the auth difference cuts a
// value's lineage (cutLineages) and returns the number of cuts made so far and
// a function restoring the old depth.
func SetMinCutDepth(d int32) (cuts func() int64, restore func()) {
	old := minCutDepth
	minCutDepth = d
	return lineageCuts.Load, func() { minCutDepth = old }
}

// BelowFloorStops returns the number of events the auth difference's walks
// found in a floor's same-key lineage below it so far.
func BelowFloorStops() int64 { return belowFloorStops.Load() }

// MemberAuthFor returns the stand-in authorisation uses for a parsed member event
// (an eventHead: key, sender, timestamp, membership, auth and prev events), false
// when the event is not one it stands in for.
func MemberAuthFor(p gomatrixserverlib.PDU) (gomatrixserverlib.PDU, bool) {
	code := membershipCode(p)
	if code == membUnknown {
		return nil, false
	}
	return &eventHead{id: p.EventID(), typ: p.Type(), stateKey: *p.StateKey(), sender: string(p.SenderID()),
		ts: int64(p.OriginServerTS()), memb: code, authIDs: p.AuthEventIDs(), prevIDs: p.PrevEventIDs(), room: p.RoomID(), version: p.Version()}, true
}

// CheckedHeadFor returns the eventHead resolution's iterative auth checks check
// in place of a parsed state event (Resolver.CheckEvent), false when they check
// the parsed PDU.
func CheckedHeadFor(p gomatrixserverlib.PDU) (gomatrixserverlib.PDU, bool) {
	if p.StateKey() == nil {
		return nil, false
	}
	code := membershipCode(p)
	if !checkableHead(p.Type(), code) || namesImpliedCreate(p) {
		return nil, false
	}
	return &eventHead{id: p.EventID(), typ: p.Type(), stateKey: *p.StateKey(), sender: string(p.SenderID()),
		ts: int64(p.OriginServerTS()), memb: code, authIDs: p.AuthEventIDs(), prevIDs: p.PrevEventIDs(), room: p.RoomID(), version: p.Version()}, true
}

// SetPDUCacheSize makes the Resolvers created from now on keep n parsed PDUs once
// their room's auth index is loaded, and returns a function restoring the default.
func SetPDUCacheSize(n int) (restore func()) {
	old := testPDUCache
	testPDUCache = n
	return func() { testPDUCache = old }
}

// unconflictedByID turns a lookup of the unconflicted state map by key and event
// ID into one by interned key and graph index; an event the graph does not hold
// answers "none" (for tests over partial graphs).
func unconflictedByID(g *graph, f func(Key) (string, bool, error)) func(int32) (int32, bool, error) {
	return func(k int32) (int32, bool, error) {
		id, found, err := f(g.keys[k])
		if err != nil || !found {
			return -1, false, err
		}
		x, ok := g.index.find(g.ids, id)
		return x, ok, nil
	}
}

// Resolver is the room resolver Replay runs, for the tests that read its event
// source and auth index.
type Resolver = roomResolver

// New returns a room resolver for room.
func New(room *roomstate.Room) (*Resolver, error) { return newRoomResolver(room) }

// WithBatchSize returns opts writing n state records per batch.
func WithBatchSize(opts ReplayOptions, n int) ReplayOptions {
	opts.batchSize = n
	return opts
}

// SetAheadAuth turns the replay's checks ahead (prefetcher.checkAhead) on or
// off until the returned function restores the default.
func SetAheadAuth(on bool) (restore func()) {
	old := aheadAuth
	aheadAuth = on
	return func() { aheadAuth = old }
}

// SetBoundByPrevs turns the replay's bound on auth children at its prev
// events' positions (prevsBound) on or off until the returned function
// restores it; bounded counts the events whose bound it lowered.
func SetBoundByPrevs(on bool) (bounded func() int64, restore func()) {
	old := boundByPrevs
	boundByPrevs = on
	return boundedResolutions.Load, func() { boundByPrevs = old }
}

// SetCursorMoveMax sets the most keys a state cursor moves by (cursorMoveMax)
// until the returned function restores it; given counts the moves given up.
func SetCursorMoveMax(n int) (given func() int64, restore func()) {
	old := cursorMoveMax
	cursorMoveMax = n
	return farMoves.Load, func() { cursorMoveMax = old }
}

// Lookup is lookup (the state cursor, else the HAMT); LookupHAMT reads the HAMT
// only.
func (r *roomResolver) Lookup(root hamtstore.NodeID, k Key) (string, bool, error) {
	return r.lookup(root, k)
}

// LookupHAMT is lookupHAMT.
func (r *roomResolver) LookupHAMT(root hamtstore.NodeID, k Key) (string, bool, error) {
	return r.lookupHAMT(root, k)
}

// GraphKeys returns the keys of the room's auth index.
func (r *roomResolver) GraphKeys() ([]Key, error) {
	g, err := r.graph()
	if err != nil {
		return nil, err
	}
	return g.keys, nil
}

// SetPrefetchMembers bounds the prefetcher's parsed member events to n until the
// returned function restores the default.
func SetPrefetchMembers(n int) (restore func()) {
	old := prefetchMembers
	prefetchMembers = n
	return func() { prefetchMembers = old }
}

// SetReplayCommitEvery makes replays commit every n state records until the
// returned function restores the default.
func SetReplayCommitEvery(n int) (restore func()) {
	old := replayCommitEvery
	replayCommitEvery = n
	return func() { replayCommitEvery = old }
}
