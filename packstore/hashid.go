package packstore

import "crypto/sha256"

// HashID returns the first len(ID) bytes of the SHA-256 of the concatenated
// parts as a record ID: the
// content addresses and derived record IDs that roomstate and the Dendrite
// state tables (modules of their own) compute, in one place.
func HashID(parts ...[]byte) ID {
	h := sha256.New()
	for _, p := range parts {
		h.Write(p)
	}
	var id ID
	copy(id[:], h.Sum(nil))
	return id
}
