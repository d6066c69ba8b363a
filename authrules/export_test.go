package authrules

import "github.com/matrix-org/gomatrixserverlib"

// Key is a state event's (event_type, state_key), for the tests.
type Key = key

// Decision is the rule that decided an event, for the tests.
type Decision = decision

// CheckRules applies the rules other than the auth_events ones (checkRules) and
// keeps nothing between calls.
func CheckRules(p gomatrixserverlib.PDU, byKey map[Key]gomatrixserverlib.PDU, create gomatrixserverlib.PDU) (Decision, error) {
	return checkRules(p, byKey, create, nil)
}

// ForAllowed is a fresh ruleMemo's forAllowed: the auth events list handed to
// gomatrixserverlib's Allowed, its power levels event slimmed to the users the
// check reads.
func ForAllowed(p gomatrixserverlib.PDU, list []gomatrixserverlib.PDU) []gomatrixserverlib.PDU {
	return newRuleMemo().forAllowed(p, list)
}
