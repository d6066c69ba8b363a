package gen

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/mtxdb/mtxdb/pdu"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// buildWithGMSL makes create build every event with gomatrixserverlib's
// EventBuilder (tests compare buildEvent with it).
var buildWithGMSL = false

// draft is an event a server is about to create.
type draft struct {
	sender   int // user index
	typ      string
	stateKey *string
	content  any
	redacts  string
	// cosign, for invites of a user on another server, is the invitee's server,
	// which also signs the event (Matrix spec v1.19, Server-Server API, "Inviting to
	// a room": the invited server signs invites).
	cosign *server
}

func strp(s string) *string { return &s }

// stateKey returns the state map key of an event type and state key.
func stateKey(typ, sk string) string { return typ + "\x00" + sk }

// create builds, authorises and records an event from server s on top of prevs
// whose resolved state is before. It returns the new event's index.
func (r *room) create(s *server, prevs []int32, before pmap, d draft) (int32, error) {
	u := r.users[d.sender]
	content, err := json.Marshal(d.content)
	if err != nil {
		return 0, err
	}
	proto := gomatrixserverlib.ProtoEvent{
		SenderID: u.id,
		RoomID:   r.roomID,
		Type:     d.typ,
		StateKey: d.stateKey,
		Content:  content,
		Redacts:  d.redacts,
	}
	isCreate := d.typ == spec.MRoomCreate
	prevIDs := make([]string, len(prevs))
	var depth int64
	for i, p := range prevs {
		prevIDs[i] = r.events[p].id
		depth = max(depth, r.events[p].depth)
	}
	proto.Depth = depth + 1
	proto.PrevEvents = prevIDs

	// Auth events: the spec's selection, from the state before the event.
	authIDs := []string{}
	if !isCreate {
		needed, err := gomatrixserverlib.StateNeededForProtoEvent(&proto)
		if err != nil {
			return 0, fmt.Errorf("gen: auth events for %s: %w", d.typ, err)
		}
		for _, t := range needed.Tuples() {
			idx, ok := before.get(stateKey(t.EventType, t.StateKey))
			if !ok {
				continue
			}
			if t.EventType == spec.MRoomCreate && r.ver.DomainlessRoomIDs() {
				continue // v12: the room ID names the create event
			}
			authIDs = append(authIDs, r.events[idx].id)
		}
	}
	proto.AuthEvents = authIDs
	if isCreate && r.ver.DomainlessRoomIDs() {
		proto.RoomID = ""
	}
	var pdu gomatrixserverlib.PDU
	var sign *signing
	if isCreate || d.cosign != nil || buildWithGMSL || r.signer == nil {
		pdu, err = r.ver.NewEventBuilderFromProtoEvent(&proto).Build(time.UnixMilli(r.ts), spec.ServerName(s.name), keyID, s.key)
	} else {
		pdu, sign, err = r.buildEvent(&proto, r.ts, s.name, s.key)
	}
	if err != nil {
		return 0, fmt.Errorf("gen: build %s: %w", d.typ, err)
	}
	if d.cosign != nil && d.cosign != s {
		// Sign returns a PDU that has lost its parsed room ID in v12 (RoomID() is
		// then empty and the create-event check fails); parse the signed JSON again.
		signed := pdu.Sign(d.cosign.name, keyID, d.cosign.key)
		if pdu, err = r.ver.NewEventFromTrustedJSON(signed.JSON(), false); err != nil {
			return 0, fmt.Errorf("gen: re-parse co-signed %s: %w", d.typ, err)
		}
	}
	if isCreate {
		r.roomID = pdu.RoomID().String()
	}

	e := &event{pdu: pdu, id: pdu.EventID(), typ: d.typ, sender: int32(d.sender), server: s.idx, depth: proto.Depth, prev: prevs, tick: r.tick, sign: sign}
	if sign != nil {
		r.signer.jobs <- sign
	}
	if sk := pdu.StateKey(); sk != nil {
		e.key = stateKey(d.typ, *sk)
		if d.typ == spec.MRoomMember {
			e.member, _ = pdu.Membership()
		}
	}
	cited := pdu.AuthEventIDs()
	if e.key != "" {
		e.authIDs = cited
	}
	e.prevSame = -1
	for _, a := range cited {
		ai := r.byID[a]
		e.auth = append(e.auth, ai)
		if e.key != "" && r.events[ai].key == e.key {
			e.prevSame, e.sdepth = ai, r.events[ai].sdepth+1
		}
	}
	idx := int32(len(r.events))
	r.setJump(e, idx)
	if _, dup := r.byID[e.id]; dup {
		return 0, fmt.Errorf("gen: duplicate event ID %s", e.id)
	}
	r.byID[e.id] = idx
	r.events = append(r.events, e)
	r.grow()

	e.beforeRec, e.after = before.rec, before
	r.held = append(r.held, idx)
	if err := r.authorise(e, before); err != nil {
		e.rejected = true
	} else if e.key != "" {
		e.after = r.record(before.set(e.key, idx), before)
		for _, a := range e.auth {
			r.events[a].kids = append(r.events[a].kids, e.id)
			r.events[a].kidIdx = append(r.events[a].kidIdx, idx)
		}
		if e.member != "" {
			r.noteMembership(d.stateKey, e.member)
		}
	}
	r.accept(s, idx)
	return idx, nil
}

// setJump sets the jump pointer of event idx (e) from its prevSame link: skew-binary
// jumps, so that a lineage's ancestor at any depth is found in O(log depth) steps
// (authView.sameKeyAncestor).
func (r *room) setJump(e *event, idx int32) {
	e.jump = idx
	p := e.prevSame
	if p < 0 {
		return
	}
	e.jump = p
	j := r.events[p].jump
	if jj := r.events[j].jump; r.events[p].sdepth-r.events[j].sdepth == r.events[j].sdepth-r.events[jj].sdepth {
		e.jump = jj
	}
}

// noteMembership keeps the per-user membership hints and the joined count.
func (r *room) noteMembership(stateKey *string, m string) {
	ui, ok := r.userIndex(*stateKey)
	if !ok {
		return
	}
	u := &r.users[ui]
	if u.mem == spec.Join {
		r.joined--
	}
	if m == spec.Join {
		r.joined++
	}
	u.mem = m
}

// errRejected marks an authorisation failure.
var errRejected = errors.New("gen: rejected")

// authorise checks an event the way resolver.Authorize does: against its auth
// events, then against the state before it.
func (r *room) authorise(e *event, before pmap) (err error) {
	defer func() {
		if rec := recover(); rec != nil {
			err = fmt.Errorf("%w: gomatrixserverlib panicked: %v", errRejected, rec)
		}
	}()
	authPDUs := make([]gomatrixserverlib.PDU, 0, len(e.auth))
	for _, a := range e.auth {
		if r.events[a].rejected {
			return fmt.Errorf("%w: auth event %s rejected", errRejected, r.events[a].id)
		}
		authPDUs = append(authPDUs, r.events[a].pdu)
	}
	if err := r.allowed(e.pdu, authPDUs); err != nil {
		return err
	}
	state := r.authState(e.pdu, before)
	if sameEvents(state, authPDUs) {
		return nil // the same check again: the auth events are the state's entries
	}
	return r.allowed(e.pdu, state)
}

// allowed checks pdu against authPDUs. The outcomes of state events and redactions
// go through the resolver's Cache, where state resolution's iterative auth checks
// find them (most check an event against its own auth events). For a plain event
// (neither a state event nor a redaction) the authorization rules (Matrix spec
// v1.19, room versions 10-12, "Authorisation rules", the rules after the membership
// ones) read only its type, its sender and the auth events (the sender's
// membership, the power levels, the create event), so one outcome serves every
// plain event with the same three.
func (r *room) allowed(pdu gomatrixserverlib.PDU, authPDUs []gomatrixserverlib.PDU) error {
	if pdu.StateKey() != nil || pdu.Type() == spec.MRoomRedaction {
		if !r.resCache.Authorized(pdu, authPDUs) {
			return fmt.Errorf("%w: %s against %d auth events", errRejected, pdu.EventID(), len(authPDUs))
		}
		return nil
	}
	// The key: type, sender and the auth events' indices, sorted (one key per
	// set of auth events).
	key := make([]byte, 0, 128)
	key = append(append(key, pdu.Type()...), 0)
	key = append(append(key, pdu.SenderID()...), 0)
	idx := make([]int32, len(authPDUs))
	for i, a := range authPDUs {
		idx[i] = r.byID[a.EventID()]
	}
	slices.Sort(idx)
	for _, x := range idx {
		key = binary.LittleEndian.AppendUint32(key, uint32(x))
	}
	if err, ok := r.plainAllowed[string(key)]; ok {
		return err
	}
	err := allowed(pdu, authPDUs)
	r.plainAllowed[string(key)] = err
	return err
}

// sameEvents reports whether a and b hold the same events (each list has at most
// one event per state key, so no duplicates).
func sameEvents(a, b []gomatrixserverlib.PDU) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.ContainsFunc(b, func(y gomatrixserverlib.PDU) bool { return y.EventID() == x.EventID() }) {
			return false
		}
	}
	return true
}

// authState is the part of a state the authorisation rules read for pdu.
func (r *room) authState(pdu gomatrixserverlib.PDU, st pmap) []gomatrixserverlib.PDU {
	var out []gomatrixserverlib.PDU
	for _, t := range gomatrixserverlib.StateNeededForAuth([]gomatrixserverlib.PDU{pdu}).Tuples() {
		if idx, ok := st.get(stateKey(t.EventType, t.StateKey)); ok {
			out = append(out, r.events[idx].pdu)
		}
	}
	return out
}

func allowed(p gomatrixserverlib.PDU, authPDUs []gomatrixserverlib.PDU) error {
	ae, err := gomatrixserverlib.NewAuthEvents(authPDUs)
	if err != nil {
		return fmt.Errorf("%w: %v", errRejected, err)
	}
	if err := gomatrixserverlib.Allowed(p, ae, pdu.UserIDForSender); err != nil {
		return fmt.Errorf("%w: %v", errRejected, err)
	}
	return nil
}

// softFails reports whether an accepted event fails against the origin's current
// state (the resolution of the states after its forward extremities). Only the
// keys the authorisation rules read for the event matter: where every extremity's
// state has the same entry for each of them, those keys are unconflicted and the
// current state has that entry, so no resolution is needed. (Soft failure only
// steers which events the origin builds on; replay does not see it.)
func (r *room) softFails(e *event) (failed bool) {
	defer func() {
		if rec := recover(); rec != nil {
			failed = true
		}
	}()
	if len(r.servers[0].extrem) == 0 {
		return false
	}
	prevs := r.prevEvents(r.servers[0])
	needed := gomatrixserverlib.StateNeededForAuth([]gomatrixserverlib.PDU{e.pdu}).Tuples()
	first := r.afterOf(prevs[0])
	cur := first
	if slices.ContainsFunc(needed, func(t gomatrixserverlib.StateKeyTuple) bool {
		k := stateKey(t.EventType, t.StateKey)
		want, wok := first.get(k)
		return slices.ContainsFunc(prevs[1:], func(p int32) bool {
			got, ok := r.afterOf(p).get(k)
			return ok != wok || got != want
		})
	}) {
		r.stats.softFailChecks++
		cur = r.resolve(prevs)
	}
	state := r.authState(e.pdu, cur)
	if sameEvents(state, r.pdus(e.auth)) {
		return false // authorise already allowed it against these very events
	}
	return r.allowed(e.pdu, state) != nil
}
