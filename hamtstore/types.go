package hamtstore

import (
	"crypto/sha256"
	"errors"
	"fmt"
)

// NodeID names one encoded node: the first 16 bytes of SHA-256 over the node's
// encoding (see doc.go). The all-zero ID is EmptyRoot.
type NodeID [16]byte

// String returns the ID as 32 lowercase hex digits.
func (id NodeID) String() string { return fmt.Sprintf("%x", id[:]) }

// IsEmpty reports whether id is EmptyRoot.
func (id NodeID) IsEmpty() bool { return id == EmptyRoot }

// Value is the 16-byte value stored under a key (for room state: a hash of an
// event ID). hamtstore gives it no meaning.
type Value [16]byte

// EmptyRoot is the root of the empty map. It is never stored, never read from a
// NodeStore, and is what Apply returns when the last key is deleted.
var EmptyRoot NodeID

// EncodedNode is one node ready for a NodeStore: ID == NodeIDOf(Data).
type EncodedNode struct {
	ID   NodeID
	Data []byte
}

// NodeStore holds encoded nodes by ID. hamtstore never modifies a slice returned
// by GetNode, and keeps referring to it (decoded keys alias it), so a store must
// not reuse that memory either.
type NodeStore interface {
	// GetNode returns the encoding stored under id. If there is none, the error
	// wraps ErrNotFound (or a store-specific not-found error wrapped the same way).
	GetNode(id NodeID) ([]byte, error)
	// PutNodes stores one batch of nodes. Storing an ID that already exists is
	// not an error (the content is the same, being content-addressed).
	PutNodes(nodes []EncodedNode) error
}

// Errors.
var (
	// ErrCorrupt is returned (wrapped) when a node fails to decode or to
	// validate: bad magic or version, lengths that overrun the node, bitmaps
	// that disagree with the entry or child counts, a key on the wrong hash
	// path, a non-canonical shape, or an ID that is not the hash of the data.
	// The wrapping error names the node ID and what failed.
	ErrCorrupt = errors.New("hamtstore: corrupt node")
	// ErrNotFound is returned (wrapped) by MemNodeStore.GetNode, and should be
	// wrapped by other stores, when a node is absent.
	ErrNotFound = errors.New("hamtstore: node not found")
	// ErrKeyTooLong is returned by Apply for a key longer than MaxKeyLen.
	ErrKeyTooLong = errors.New("hamtstore: key too long")
)

// MaxKeyLen is the longest key, in bytes, that Apply accepts and that a decoder
// accepts in a node. It bounds a node at about 32*(MaxKeyLen+19) bytes. A Matrix
// event, and hence its (type, state_key), is at most 65536 bytes.
const MaxKeyLen = 1 << 16

// Change is one element of a batch for Apply: set Key to Value, or, with Delete,
// remove Key (a no-op if absent; Value is then ignored).
type Change struct {
	Key    []byte
	Value  Value
	Delete bool
}

// NodeIDOf returns the ID of an encoded node: SHA-256(data)[:16].
func NodeIDOf(data []byte) NodeID {
	sum := sha256.Sum256(data)
	var id NodeID
	copy(id[:], sum[:len(id)])
	return id
}

// corruptf builds an error wrapping ErrCorrupt that names the node and the problem.
func corruptf(id NodeID, format string, args ...any) error {
	return fmt.Errorf("%w: node %x: %s", ErrCorrupt, id[:], fmt.Sprintf(format, args...))
}
