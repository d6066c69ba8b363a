package resolver

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"hash/maphash"
	"strconv"
	"strings"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/mtxdb/mtxdb/authrules"
	"github.com/mtxdb/mtxdb/internal/strtab"
)

// A roomResolver keeps, for each state event of the room it has parsed, what state
// resolution's ordering reads of it and what authorisation reads of it as an auth
// event, so that an event the PDU cache no longer holds is not read from the store
// and decoded from JSON again (replay parses each PDU once):
//   - its sender and origin_server_ts (roomResolver.senderOf, tsOf: 12 bytes per
//     event, no pointers, and the distinct senders once), for the power events'
//     split, the sender's power level and the two sort orders of the resolution
//     (Matrix spec v1.19, room version 2, "State resolution": reverse topological
//     power ordering, mainline ordering);
//   - for an m.room.member event, its membership (roomResolver.memb: one byte).
//
// Its ID, key and auth_events come from the auth index (graph). An eventHead gives
// them as a gomatrixserverlib.PDU. In a 1M-event room with 100,000 members,
// authorisation asked again for 530,000 member events the 20,000-entry cache had
// let go, and resolution for 169,000 events of full conflicted sets.
//
// What the authorization rules read of a member event that is not the event being
// authorised (Matrix spec v1.19, "Authorisation rules" of each room version: the
// sender's, the target's and the join_authorised_via_users_server user's current
// membership) is its key and its content's membership; gomatrixserverlib reads it
// through Membership() or NewMemberContentFromEvent. A member event whose content
// holds anything else the rules could read (third_party_invite,
// join_authorised_via_users_server, mxid_mapping), or a membership outside the five
// the spec names, has no membership kept: it is parsed again when asked for. In the
// iterative auth checks an event is checked against the rules as its eventHead when
// the rules read nothing more of it (checkableHead) and its JSON does not name the
// create event (namesImpliedCreate).
const (
	membUnknown uint8 = iota
	membJoin
	membLeave
	membInvite
	membBan
	membKnock
)

var membershipNames = [...]string{membJoin: spec.Join, membLeave: spec.Leave, membInvite: spec.Invite, membBan: spec.Ban, membKnock: spec.Knock}

// memberContents are the contents an eventHead of a member event answers, by
// membership code.
var memberContents = func() [][]byte {
	out := make([][]byte, len(membershipNames))
	for i, m := range membershipNames {
		if m != "" {
			out[i], _ = json.Marshal(map[string]string{"membership": m})
		}
	}
	return out
}()

// membershipCode returns the code of a parsed member event's membership, or
// membUnknown when the event is not one an eventHead can stand for.
func membershipCode(p gomatrixserverlib.PDU) uint8 {
	if p.Type() != spec.MRoomMember || p.StateKey() == nil {
		return membUnknown
	}
	// As gomatrixserverlib reads it: the whole content must parse, so that the
	// stand-in's content parses to the same membership in every reader.
	var c gomatrixserverlib.MemberContent
	if json.Unmarshal(p.Content(), &c) != nil || c.ThirdPartyInvite != nil || c.AuthorisedVia != "" || c.MXIDMapping != nil {
		return membUnknown
	}
	// encoding/json matches a key such as "Membership" to the field, this
	// package's member rule (memberRules) reads only the exact key: both must
	// read the same membership (TestEventHeadMembershipKeyCase).
	var raw map[string]json.RawMessage
	var m string
	if json.Unmarshal(p.Content(), &raw) != nil || json.Unmarshal(raw["membership"], &m) != nil || m != c.Membership {
		return membUnknown
	}
	for code, m := range membershipNames {
		if m != "" && m == c.Membership {
			return uint8(code)
		}
	}
	return membUnknown
}

// headTable keeps, by graph index, what an eventHead gives of each state event
// parsed so far: memb is a member event's membership code (membUnknown for
// others), senderOf its sender's index in senders plus one (0: not learnt), tsOf
// its origin_server_ts; namesCreate holds the events whose JSON names the create
// event the room ID implies (namesImpliedCreate), checked in parsed form. A
// zero headTable learns nothing.
type headTable struct {
	memb     []uint8
	senderOf []int32
	tsOf     []int64
	// senders numbers the senders from 0 (senderOf holds the number + 1), their
	// strings in arena.
	senders     *strtab.Index[string]
	arena       *strtab.Arena
	namesCreate map[int32]bool
	// recent holds the eventHeads head made last, by graph index modulo
	// headCacheSize: what head gives of an event does not change once learnt,
	// and the auth events of consecutive events are mostly the same few
	// member and power events.
	recent []*eventHead
}

// headCacheSize is the number of eventHeads a headTable keeps (a power of two).
const headCacheSize = 1 << 14

// newHeadTable returns a headTable for a room of n events.
func newHeadTable(n int) headTable {
	return headTable{memb: make([]uint8, n), senderOf: make([]int32, n), tsOf: make([]int64, n),
		senders: strtab.NewIndex[string](0, maphash.String), arena: new(strtab.Arena), namesCreate: map[int32]bool{}, recent: make([]*eventHead, headCacheSize)}
}

// headFacts is what learn reads of a state PDU's content and JSON: a member
// event's membership code (membershipCode) and whether its JSON names the
// create event the room ID implies (namesImpliedCreate, for an event checkable
// as its head).
type headFacts struct {
	memb        uint8
	namesCreate bool
}

// factsOf reads p's headFacts.
func factsOf(p gomatrixserverlib.PDU) headFacts {
	var f headFacts
	if p.Type() == spec.MRoomMember {
		f.memb = membershipCode(p)
	}
	f.namesCreate = checkableHead(p.Type(), f.memb) && namesImpliedCreate(p)
	return f
}

// learn keeps what an eventHead needs of a parsed state PDU of the room; f is
// p's headFacts when the prefetcher read them (nil: read here).
func (r *roomResolver) learn(p gomatrixserverlib.PDU, f *headFacts) { r.headTable.learn(r.g, p, f) }

// learn keeps what an eventHead needs of a parsed state PDU of g's room; f is
// p's headFacts when already read (nil: read here).
func (t *headTable) learn(g *graph, p gomatrixserverlib.PDU, f *headFacts) {
	if t.memb == nil || p.StateKey() == nil {
		return
	}
	i, ok := g.index.find(g.ids, p.EventID())
	if !ok || t.senderOf[i] != 0 {
		return
	}
	sender := string(p.SenderID())
	s, ok := t.senders.Find(sender)
	if !ok {
		s, _ = t.senders.Add(t.arena.Copy(sender))
	}
	t.senderOf[i], t.tsOf[i] = s+1, int64(p.OriginServerTS()) // from 1: 0 is "not learnt"
	if f == nil {
		read := factsOf(p)
		f = &read
	}
	t.memb[i] = f.memb
	if f.namesCreate {
		t.namesCreate[i] = true
	}
}

// checkableHead reports whether an eventHead of an event of this type (and
// membership code, for a member event) can be checked against the authorization
// rules in place of the parsed event: the rules read nothing of it but its type,
// state key, sender, room, auth and prev events and, of a member event, the
// membership (Matrix spec v1.19, "Authorisation rules" of each room version; this
// authrules' rules and gomatrixserverlib's Allowed read the content of the
// create, power levels and member events being checked, the state key's domain of
// m.room.aliases and the redacted event of m.room.redaction).
func checkableHead(eventType string, memb uint8) bool {
	switch eventType {
	case spec.MRoomMember:
		return memb != membUnknown
	case spec.MRoomCreate, spec.MRoomPowerLevels, spec.MRoomAliases, spec.MRoomRedaction:
		return false
	}
	return true
}

// namesImpliedCreate reports whether a PDU's JSON names the create event its room
// ID implies (room version 12: the room ID is the create event's ID with "!" for
// "$"), which the v12 rule on auth_events reads from the JSON (citedOnly): an
// eventHead has none, so such an event is checked in its parsed form.
func namesImpliedCreate(p gomatrixserverlib.PDU) bool {
	return bytes.Contains(p.JSON(), impliedCreateRef(p.RoomID().String()))
}

// impliedCreate returns the create event a v12 room ID names ("!" + the create
// event's reference hash), or nil: in other versions, or when the room holds no
// such event.
func (r *roomResolver) impliedCreate(p gomatrixserverlib.PDU) gomatrixserverlib.PDU {
	if versionNumber(p.Version()) < 12 || p.Type() == spec.MRoomCreate && p.StateKeyEquals("") {
		return nil
	}
	c, err := r.pdu("$" + strings.TrimPrefix(p.RoomID().String(), "!"))
	if err != nil || c.Type() != spec.MRoomCreate {
		return nil
	}
	return c
}

// versionNumber returns a room version of 1 to authrules.MaxVersion as a number, 0
// for others.
func versionNumber(v gomatrixserverlib.RoomVersion) int {
	if n, err := strconv.Atoi(string(v)); err == nil && n >= 1 && n <= authrules.MaxVersion {
		return n
	}
	return 0
}

// impliedCreateRef is the create event ID a room ID implies, quoted as in JSON.
func impliedCreateRef(roomID string) []byte {
	return []byte(`"$` + strings.TrimPrefix(roomID, "!") + `"`)
}

// head returns the eventHead of event i, false when what it needs has not been
// learnt (the event was not parsed yet, or it is a member event with no
// membership kept).
func (r *roomResolver) head(i int32) (*eventHead, bool) {
	h, ok := r.headTable.head(r.g, i, *r.roomID, gomatrixserverlib.RoomVersion(r.room.Head().RoomVersion))
	if ok && r.touch.on {
		r.touch.mark(i)
	}
	return h, ok
}

// head returns the eventHead of event i of g's room, false when what it needs
// has not been learnt. The same event may be given the same *eventHead again
// (recent): callers do not modify it but through its lazily named edges.
func (t *headTable) head(g *graph, i int32, room spec.RoomID, version gomatrixserverlib.RoomVersion) (*eventHead, bool) {
	s := t.senderOf[i]
	k := g.keyOf(i)
	if s == 0 || k < 0 {
		return nil, false
	}
	key := g.keys[k]
	if key.Type == spec.MRoomMember && t.memb[i] == membUnknown {
		return nil, false
	}
	slot := &t.recent[int(i)&(headCacheSize-1)]
	if h := *slot; h != nil && h.i == i && h.g == g && h.room == room && h.version == version {
		return h, true
	}
	h := &eventHead{id: g.ids[i], typ: key.Type, stateKey: key.StateKey, sender: t.senders.At(s - 1), ts: t.tsOf[i],
		memb: t.memb[i], g: g, i: i, room: room, version: version}
	*slot = h
	return h, true
}

// cached returns the parsed PDU of an event when the resolver holds it.
func (r *roomResolver) cached(eventID string) (gomatrixserverlib.PDU, bool) {
	if r.cur != nil && r.cur.EventID() == eventID {
		return r.cur, true
	}
	p, ok := r.pdus.Get(eventID)
	if !ok {
		p, ok = r.others.Get(eventID)
	}
	return p, ok
}

// light returns the cached PDU of an event, else its eventHead when use allows
// one for that graph index; false when neither (the caller parses the PDU).
//
// at is the event's graph index when the caller knows it: findIndex to look
// it up, notInGraph for an event the graph does not hold.
func (r *roomResolver) light(eventID string, at int32, use func(i int32) bool) (gomatrixserverlib.PDU, bool) {
	if p, ok := r.cached(eventID); ok {
		switch {
		case !r.touch.on:
		case at >= 0:
			r.touch.mark(at)
		case at == findIndex:
			r.markID(eventID)
		}
		return p, true
	}
	if r.memb == nil {
		return nil, false
	}
	if at == findIndex {
		at = notInGraph
		if i, ok := r.g.index.find(r.g.ids, eventID); ok {
			at = i
		}
	}
	if at < 0 || !use(at) {
		return nil, false
	}
	if h, ok := r.head(at); ok {
		return h, true
	}
	return nil, false
}

// Graph indexes that light and authEventAt take for an event whose index the
// caller does not have.
const (
	notInGraph int32 = -1 // the graph holds no event of that ID
	findIndex  int32 = -2 // look the ID up
)

// authEvent returns an event of the room to use as an auth event of an event being
// authorised (authorize): the cached PDU, else the eventHead of a member event
// whose membership is kept, else the PDU read and parsed.
func (r *roomResolver) authEvent(eventID string) (gomatrixserverlib.PDU, error) {
	return r.authEventAt(eventID, findIndex)
}

// authEventAt is authEvent for the event at graph index at (see light).
func (r *roomResolver) authEventAt(eventID string, at int32) (gomatrixserverlib.PDU, error) {
	if p, ok := r.light(eventID, at, func(i int32) bool { return r.memb[i] != membUnknown }); ok {
		return p, nil
	}
	return r.pdu(eventID)
}

// headOf gives resolution's ordering a state event without parsing it: the cached
// PDU, else the eventHead of a state event whose head is learnt; false when
// neither (the caller parses the PDU).
func (r *roomResolver) headOf(eventID string) (gomatrixserverlib.PDU, bool) {
	return r.light(eventID, findIndex, func(int32) bool { return true })
}

// checkEvent returns the event to check against the authorization rules in
// resolution's iterative auth checks. The cached PDU, else
// its eventHead when checkableHead says the rules read no more of it
// (TestEventHeadChecked), else the PDU read and parsed.
func (r *roomResolver) checkEvent(eventID string) (gomatrixserverlib.PDU, error) {
	p, ok := r.light(eventID, findIndex, func(i int32) bool {
		k := r.g.keyOf(i)
		return k >= 0 && !r.namesCreate[i] && checkableHead(r.g.keys[k].Type, r.memb[i])
	})
	if ok {
		return p, nil
	}
	return r.pdu(eventID)
}

// eventHead is a state event of the room as the resolver knows it without its PDU
// (see membUnknown): ID, type, state key, sender, origin_server_ts, and
// auth_events and prev_events from the auth index; content only for a member
// event (its membership). It implements gomatrixserverlib.PDU for resolution's
// ordering and for the authorization rules' reading of an auth member event;
// what neither reads answers empty (depth, unsigned, content of other types) or
// an error (JSON forms, signing).
type eventHead struct {
	id, typ, stateKey, sender string
	ts                        int64
	memb                      uint8
	g                         *graph // names authIDs and prevIDs on first use; nil: they are given
	i                         int32
	authIDs, prevIDs          []string
	room                      spec.RoomID
	version                   gomatrixserverlib.RoomVersion
}

var errEventHead = errors.New("resolver: an event kept as its head only has no JSON form")

func (h *eventHead) EventID() string                        { return h.id }
func (h *eventHead) StateKey() *string                      { return &h.stateKey }
func (h *eventHead) StateKeyEquals(s string) bool           { return h.stateKey == s }
func (h *eventHead) Type() string                           { return h.typ }
func (h *eventHead) Version() gomatrixserverlib.RoomVersion { return h.version }
func (h *eventHead) RoomID() spec.RoomID                    { return h.room }
func (h *eventHead) Redacts() string                        { return "" }
func (h *eventHead) Redacted() bool                         { return false }
func (h *eventHead) OriginServerTS() spec.Timestamp         { return spec.Timestamp(h.ts) }
func (h *eventHead) Redact()                                {}
func (h *eventHead) SenderID() spec.SenderID                { return spec.SenderID(h.sender) }
func (h *eventHead) Unsigned() []byte                       { return nil }
func (h *eventHead) Depth() int64                           { return 0 }
func (h *eventHead) JSON() []byte                           { return nil }
func (h *eventHead) ToHeaderedJSON() ([]byte, error)        { return nil, errEventHead }

// Content is the membership of a member event ({"membership": ...}), nil for
// other types (resolution reads their content from the parsed PDU).
func (h *eventHead) Content() []byte {
	if h.typ == spec.MRoomMember {
		return memberContents[h.memb]
	}
	return nil
}

func (h *eventHead) Membership() (string, error) {
	if h.typ != spec.MRoomMember || h.memb == membUnknown {
		return "", errEventHead
	}
	return membershipNames[h.memb], nil
}

func (h *eventHead) JoinRule() (string, error) { return "", errEventHead }

// AuthEventIDs and PrevEventIDs name the edges from the auth index on first use
// (a head is asked for them once per power event and per event sorted).
func (h *eventHead) AuthEventIDs() []string {
	if h.authIDs == nil && h.g != nil {
		h.authIDs = h.g.authIDs(h.i)
	}
	return h.authIDs
}

func (h *eventHead) PrevEventIDs() []string {
	if h.prevIDs == nil && h.g != nil {
		h.prevIDs = h.g.prevIDs(h.i)
	}
	return h.prevIDs
}

func (h *eventHead) HistoryVisibility() (gomatrixserverlib.HistoryVisibility, error) {
	return "", errEventHead
}

func (h *eventHead) PowerLevels() (*gomatrixserverlib.PowerLevelContent, error) {
	return nil, errEventHead
}

func (h *eventHead) SetUnsigned(any) (gomatrixserverlib.PDU, error) { return nil, errEventHead }
func (h *eventHead) SetUnsignedField(string, any) error             { return errEventHead }

func (h *eventHead) Sign(string, gomatrixserverlib.KeyID, ed25519.PrivateKey) gomatrixserverlib.PDU {
	return h
}
