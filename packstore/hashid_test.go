package packstore

import (
	"crypto/sha256"
	"testing"
)

// TestHashID: the ID is the SHA-256 (its first len(ID) bytes) of the parts' concatenation, so splitting
// the input differently gives the same ID (callers rely on that to keep the
// record IDs they wrote before).
func TestHashID(t *testing.T) {
	sum := sha256.Sum256([]byte("room\x00event"))
	var want ID
	copy(want[:], sum[:])
	if got := HashID([]byte("room"), []byte{0}, []byte("event")); got != want {
		t.Fatalf("HashID = %x, want %x", got, want)
	}
	if HashID([]byte("room\x00event")) != HashID([]byte("room"), []byte("\x00event")) {
		t.Fatal("HashID depends on how the input is split")
	}
}
