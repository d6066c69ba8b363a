package authrules

import (
	"errors"
	"fmt"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/mtxdb/mtxdb/pdu"
)

// ErrRejected is wrapped by the error Authorize returns when gomatrixserverlib's
// Allowed panicked on an event: the event counts as not allowed.
var ErrRejected = errors.New("authrules: event rejected")

// key is a state event's (event_type, state_key).
type key struct{ Type, StateKey string }

// keyOf returns a state event's key.
func keyOf(p gomatrixserverlib.PDU) key { return key{Type: p.Type(), StateKey: *p.StateKey()} }

// Authorize checks a PDU against the given auth events (at most one per state
// key; the last counts): this package's rules (all but the rules on the event's
// own auth_events list, which CheckAuthEvents applies), then gomatrixserverlib's
// Allowed. It keeps nothing between calls. It returns nil when the event is
// allowed, else an error (a *RuleError where this package's rules decided); a
// panic in gomatrixserverlib is returned as an error wrapping ErrRejected.
func Authorize(p gomatrixserverlib.PDU, authEvents []gomatrixserverlib.PDU) error {
	return authorize(p, authEvents, nil)
}

// NewAuthorizer returns Authorize keeping what the rules parse of power levels
// and create events (by room and event ID) from one call to the next: for one
// event source, in which an event ID names one event (a room's events; never
// fixtures of several rooms). A check against a power levels event with
// thousands of users otherwise parses all of them. The function is not safe for
// concurrent use.
func NewAuthorizer() func(p gomatrixserverlib.PDU, authEvents []gomatrixserverlib.PDU) error {
	memo := newRuleMemo()
	return func(p gomatrixserverlib.PDU, authEvents []gomatrixserverlib.PDU) error {
		return authorize(p, authEvents, memo)
	}
}

// authorize is Authorize with what the rules parse kept in memo (nil: nothing).
func authorize(p gomatrixserverlib.PDU, list []gomatrixserverlib.PDU, memo *ruleMemo) (err error) {
	defer func() {
		if rec := recover(); rec != nil {
			err = fmt.Errorf("%w: event %s: gomatrixserverlib panicked: %v", ErrRejected, p.EventID(), rec)
		}
	}()
	// This package's rules against the list (the last event per key counts, as
	// in gomatrixserverlib's NewAuthEvents; in v12 the create event among them is
	// the one the room ID names), then gomatrixserverlib's.
	byKey := make(map[key]gomatrixserverlib.PDU, len(list))
	for _, e := range list {
		if e.StateKey() != nil {
			byKey[keyOf(e)] = e
		}
	}
	if _, err := checkRules(p, byKey, byKey[key{Type: spec.MRoomCreate, StateKey: ""}], memo); err != nil {
		return err
	}
	ae, err := gomatrixserverlib.NewAuthEvents(memo.forAllowed(p, list))
	if err != nil {
		return err
	}
	return gomatrixserverlib.Allowed(p, ae, pdu.UserIDForSender)
}
