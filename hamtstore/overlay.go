package hamtstore

import "errors"

// Overlay is a NodeStore that keeps the nodes put into it in memory and reads
// the others from a base store it never writes: for computing snapshots over a
// read-only store (a measuring walk that resolves states, say) without writing
// to it. Safe for concurrent use when the base is.
type Overlay struct {
	base NodeStore
	mem  *MemNodeStore
}

var _ NodeStore = (*Overlay)(nil)

// NewOverlay returns an empty overlay over base.
func NewOverlay(base NodeStore) *Overlay { return &Overlay{base: base, mem: NewMemNodeStore()} }

// GetNode returns a node put into the overlay, else the base store's (errors as
// the base's).
func (o *Overlay) GetNode(id NodeID) ([]byte, error) {
	b, err := o.mem.GetNode(id)
	if errors.Is(err, ErrNotFound) {
		return o.base.GetNode(id)
	}
	return b, err
}

// PutNodes keeps the nodes in memory; the base store is not written.
func (o *Overlay) PutNodes(nodes []EncodedNode) error { return o.mem.PutNodes(nodes) }

// Len returns the number of nodes put into the overlay.
func (o *Overlay) Len() int { return o.mem.Len() }
