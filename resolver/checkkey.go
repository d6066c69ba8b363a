package resolver

import (
	"hash/maphash"

	"github.com/matrix-org/gomatrixserverlib"
)

// checkKey names one authorization check in the caches of its outcome
// (Cache.allowed, Cache.plain, the prefetcher's plain): a 128-bit hash of
// its parts, two 64-bit halves from hash/maphash under two seeds drawn when
// the process starts. The parts that name the event (its ID, or a plain
// event's room, type and sender) are hashed in order; the IDs of the auth
// events are hashed one by one and added, so the key does not depend on
// their order and needs no sorted copy of them. Two different checks get
// the same key with a probability of about n^2 / 2^129 for n checks kept,
// against seeds no input can know.
type checkKey [2]uint64

var checkSeeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}

// newCheckKey starts the key of a check named by parts.
func newCheckKey(parts ...string) checkKey {
	var k checkKey
	for i := range k {
		var h maphash.Hash
		h.SetSeed(checkSeeds[i])
		for _, s := range parts {
			h.WriteString(s)
			h.WriteByte(0)
		}
		k[i] = h.Sum64()
	}
	return k
}

// addAuthEvent adds the ID of one of the check's auth events to k.
func (k *checkKey) addAuthEvent(id string) {
	k[0] += maphash.String(checkSeeds[0], id)
	k[1] += maphash.String(checkSeeds[1], id)
}

// authCheckKey names the check of the event id against the auth events of
// byKey.
func authCheckKey(id string, byKey map[Key]gomatrixserverlib.PDU) checkKey {
	k := newCheckKey(id)
	for _, e := range byKey {
		k.addAuthEvent(e.EventID())
	}
	return k
}

// plainCheckKey names the check of a plain event (see allowedOnce): its room,
// type and sender and the IDs of its auth events.
func plainCheckKey(p gomatrixserverlib.PDU, ids []string) checkKey {
	k := newCheckKey(p.RoomID().String(), p.Type(), string(p.SenderID()))
	for _, id := range ids {
		k.addAuthEvent(id)
	}
	return k
}
