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

// checkOurRules applies this package's authorization rules (CheckAuthEvents when
// onReceipt, for the events p cites; then CheckRules) to p against events, which
// hold one event per key unless CheckAuthEvents has refused them. It returns nil or
// an *AuthRuleError.
func (r *Resolver) checkOurRules(p gomatrixserverlib.PDU, events []gomatrixserverlib.PDU, create gomatrixserverlib.PDU, onReceipt bool) error {
	if onReceipt {
		if err := CheckAuthEvents(p, events, r.Rejected, create); err != nil {
			return err
		}
	}
	byKey := make(map[Key]gomatrixserverlib.PDU, len(events)+1)
	for _, e := range events {
		if e.StateKey() != nil {
			byKey[keyOf(e)] = e
		}
	}
	if create != nil {
		byKey[Key{spec.MRoomCreate, ""}] = create
	}
	_, err := CheckRules(p, byKey, create)
	return err
}
