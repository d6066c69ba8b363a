package roomrules

import (
	"fmt"
	"strings"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/mtxdb/mtxdb/authrules"
)

// Authorize checks ev against authEvents, the state events it is checked against
// (the state before it, or the auth events it will cite; at most one per (type,
// state_key), the last counts), with mtxdb's authorization rules of ev's room
// version (spec, Room Versions, "Authorization rules"; authrules.Authorize). It
// returns nil when ev is allowed, else the rejection: a *authrules.RuleError
// naming the rule where mtxdb's rules decided, gomatrixserverlib's error otherwise,
// or an error wrapping ErrPanic. userIDForSender is used only for room versions
// outside 1-12 (package doc).
func Authorize(ev gomatrixserverlib.PDU, authEvents []gomatrixserverlib.PDU, userIDForSender spec.UserIDForSender) (err error) {
	defer recoverAuth(ev, &err)
	if authrules.Rules(string(ev.Version())) == nil {
		return allowedOther(ev, authEvents, userIDForSender)
	}
	return authrules.Authorize(ev, authEvents)
}

// Allowed is Authorize with the auth events taken from an AuthEventProvider, the
// form gomatrixserverlib.Allowed takes: for each state key the rules may read for
// ev (gomatrixserverlib.StateNeededForAuth), the provider's event. Same results as
// Authorize.
func Allowed(ev gomatrixserverlib.PDU, provider gomatrixserverlib.AuthEventProvider, userIDForSender spec.UserIDForSender) (err error) {
	defer recoverAuth(ev, &err)
	list, err := neededFrom(ev, provider)
	if err != nil {
		return err
	}
	return Authorize(ev, list, userIDForSender)
}

// AuthorizeReceived checks an event received over federation against its own
// auth_events: authEvents are the events its auth_events name that the server has,
// rejected ones included. It applies the rules on the auth_events list
// (authrules.CheckAuthEvents; in room version 12 with the create event the room ID
// names, from authEvents or src.Load), then Authorize against the entries.
// src.Rejected tells rejected entries. Results as Authorize. For room versions
// outside 1-12 it is gomatrixserverlib's Allowed against the entries not rejected,
// as Dendrite checked them.
func AuthorizeReceived(ev gomatrixserverlib.PDU, authEvents []gomatrixserverlib.PDU, src Source) (err error) {
	defer recoverAuth(ev, &err)
	rejected := func(id string) bool { return src.Rejected != nil && src.Rejected(id) }
	if authrules.Rules(string(ev.Version())) == nil {
		accepted := make([]gomatrixserverlib.PDU, 0, len(authEvents))
		for _, a := range authEvents {
			if !rejected(a.EventID()) {
				accepted = append(accepted, a)
			}
		}
		return allowedOther(ev, accepted, userIDForSender(src))
	}
	create, err := impliedCreate(ev, authEvents, src)
	if err != nil {
		return err
	}
	if err := authrules.CheckAuthEvents(ev, authEvents, rejected, create); err != nil {
		return err
	}
	list := authEvents
	if create != nil {
		list = append(append(make([]gomatrixserverlib.PDU, 0, len(authEvents)+1), create), authEvents...)
	}
	return authrules.Authorize(ev, list)
}

// impliedCreate returns, in room version 12, the create event the room ID names
// (from authEvents, else src.Load; nil when the server does not have it, which
// CheckAuthEvents rejects); nil in other versions and for the create event itself.
func impliedCreate(ev gomatrixserverlib.PDU, authEvents []gomatrixserverlib.PDU, src Source) (gomatrixserverlib.PDU, error) {
	verImpl, err := gomatrixserverlib.GetRoomVersion(ev.Version())
	if err != nil || !verImpl.DomainlessRoomIDs() || ev.Type() == spec.MRoomCreate && ev.StateKeyEquals("") {
		return nil, nil
	}
	id := "$" + strings.TrimPrefix(ev.RoomID().String(), "!")
	for _, a := range authEvents {
		if a.EventID() == id {
			return a, nil
		}
	}
	if src.Load == nil {
		return nil, nil
	}
	got, err := src.Load([]string{id})
	if err != nil {
		return nil, fmt.Errorf("roomrules: loading create event %s: %w", id, err)
	}
	for _, p := range got {
		if p.EventID() == id {
			return p, nil
		}
	}
	return nil, nil
}

// neededFrom lists the provider's events for the state keys the rules may read
// for ev.
func neededFrom(ev gomatrixserverlib.PDU, provider gomatrixserverlib.AuthEventProvider) ([]gomatrixserverlib.PDU, error) {
	var list []gomatrixserverlib.PDU
	add := func(p gomatrixserverlib.PDU, err error) error {
		if err != nil {
			return err
		}
		if p != nil {
			list = append(list, p)
		}
		return nil
	}
	needed := gomatrixserverlib.StateNeededForAuth([]gomatrixserverlib.PDU{ev})
	// The create event is read in every version (v12: its content names the
	// creators; the create event check of the room ID is AuthorizeReceived's).
	if err := add(provider.Create()); err != nil {
		return nil, err
	}
	if needed.PowerLevels {
		if err := add(provider.PowerLevels()); err != nil {
			return nil, err
		}
	}
	if needed.JoinRules {
		if err := add(provider.JoinRules()); err != nil {
			return nil, err
		}
	}
	for _, m := range needed.Member {
		if err := add(provider.Member(spec.SenderID(m))); err != nil {
			return nil, err
		}
	}
	for _, t := range needed.ThirdPartyInvite {
		if err := add(provider.ThirdPartyInvite(t)); err != nil {
			return nil, err
		}
	}
	return list, nil
}

// allowedOther is gomatrixserverlib's Allowed, for room versions mtxdb's rules do
// not cover (package doc).
func allowedOther(ev gomatrixserverlib.PDU, authEvents []gomatrixserverlib.PDU, userIDForSender spec.UserIDForSender) error {
	ae, err := gomatrixserverlib.NewAuthEvents(authEvents)
	if err != nil {
		return err
	}
	if userIDForSender == nil {
		userIDForSender = senderIsUserID
	}
	return gomatrixserverlib.Allowed(ev, ae, userIDForSender)
}

// recoverAuth turns a panic while checking ev into an error wrapping ErrPanic.
func recoverAuth(ev gomatrixserverlib.PDU, err *error) {
	if rec := recover(); rec != nil {
		*err = fmt.Errorf("%w: authorising event %s: %v", ErrPanic, ev.EventID(), rec)
	}
}
