package resolver

import (
	"errors"
	"strings"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// failingSource fails to load any PDU, as a store whose read fails would.
type failingSource struct{}

var errStoreRead = errors.New("store read failed")

func (failingSource) Event(string) (gomatrixserverlib.PDU, error) { return nil, errStoreRead }
func (failingSource) Rejected(string) bool                        { return false }

// TestSenderPowerLevelLoadError: when the power levels auth event of an event
// being ordered is known only by its head and its PDU cannot be loaded, the
// sender's power level is an error naming the event (errNoEvent), not the level
// 0 of a sender whose power levels do not parse: a read failure must not reorder
// the resolution silently.
func TestSenderPowerLevelLoadError(t *testing.T) {
	room, err := spec.NewRoomID("!r:example.org")
	if err != nil {
		t.Fatal(err)
	}
	head := func(id, typ, sender string, auth ...string) *eventHead {
		return &eventHead{id: id, typ: typ, sender: sender, authIDs: auth, room: *room, version: gomatrixserverlib.RoomVersionV10}
	}
	// Every event is known by its light form only (as the Resolver's headOf gives
	// them), and no PDU loads.
	st := newStateRes(failingSource{})
	st.plCache, st.cache = map[string]*gomatrixserverlib.PowerLevelContent{}, NewCache()
	st.heads = map[string]gomatrixserverlib.PDU{
		"$create": head("$create", spec.MRoomCreate, "@a:example.org"),
		"$pl":     head("$pl", spec.MRoomPowerLevels, "@a:example.org", "$create"),
		"$topic":  head("$topic", "m.room.topic", "@b:example.org", "$create", "$pl"),
	}
	p, err := st.event("$topic")
	if err != nil {
		t.Fatal(err)
	}
	level, err := st.senderPowerLevel(p)
	if !errors.Is(err, errNoEvent) || !strings.Contains(err.Error(), "$pl") {
		t.Fatalf("senderPowerLevel with the power levels event unreadable: level %d, error %v; want an errNoEvent", level, err)
	}
}
