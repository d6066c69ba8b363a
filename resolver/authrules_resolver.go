package resolver

import (
	"strings"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// impliedCreate returns the create event a v12 room ID names ("!" + the create
// event's reference hash), or nil: in other versions, or when the room holds no
// such event.
func (r *Resolver) impliedCreate(p gomatrixserverlib.PDU) gomatrixserverlib.PDU {
	if ruleVersion(string(p.Version())) < 12 || p.Type() == spec.MRoomCreate && p.StateKeyEquals("") {
		return nil
	}
	c, err := r.pdu("$" + strings.TrimPrefix(p.RoomID().String(), "!"))
	if err != nil || c.Type() != spec.MRoomCreate {
		return nil
	}
	return c
}

// checkRulesList applies CheckRules to p against a list of auth events (the last
// per key counts, as in gomatrixserverlib's NewAuthEvents; in v12 the create event
// among them is the one the room ID names), keeping what it parses in memo.
func checkRulesList(p gomatrixserverlib.PDU, list []gomatrixserverlib.PDU, memo *ruleMemo) error {
	byKey := make(map[Key]gomatrixserverlib.PDU, len(list))
	for _, e := range list {
		if e.StateKey() != nil {
			byKey[keyOf(e)] = e
		}
	}
	_, err := checkRules(p, byKey, byKey[Key{Type: spec.MRoomCreate, StateKey: ""}], memo)
	return err
}
