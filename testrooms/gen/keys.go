package gen

import (
	"crypto/ed25519"

	"github.com/mtxdb/mtxdb/pdu"

	"github.com/matrix-org/gomatrixserverlib"
)

// KeyRing returns the public signing keys of the servers of rooms generated with
// opts (every room of GenerateMulti shares them: opts.KeySeed, or else opts.Seed),
// for `mtxdb import --keys` (pdu.LoadKeyRing reads KeyRing.Encode's file).
func KeyRing(opts Options) pdu.KeyRing {
	seed := opts.Seed
	if opts.KeySeed != 0 {
		seed = opts.KeySeed
	}
	k := pdu.KeyRing{}
	for i := range opts.Servers {
		k[serverName(i)] = map[gomatrixserverlib.KeyID]ed25519.PublicKey{
			keyID: deriveKey(seed, i).Public().(ed25519.PublicKey),
		}
	}
	return k
}
