package roomstate

import (
	"sync"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
)

// writeBehind is the node store of a StateWriter in write-behind mode: PutNodes
// queues the nodes (GetNode finds them at once), and flush writes what is
// queued, after it the records given, with one PutMany on a goroutine of its
// own while the caller goes on. At most one write runs at a time; a flush or
// wait first waits for the one before and returns its error. The nodes stay
// readable from memory until their write has returned.
//
// PutNodes, flush and wait are called by the StateWriter's one caller; GetNode
// may be called from other goroutines too (it locks).
type writeBehind struct {
	base nodeStore

	mu sync.Mutex
	// pending holds the nodes queued or being written, by ID.
	pending map[hamtstore.NodeID][]byte
	queued  []packstore.Record
	// running is the write under way (nil: none); it yields its error once.
	running chan error
}

func newWriteBehind(base nodeStore) *writeBehind {
	return &writeBehind{base: base, pending: map[hamtstore.NodeID][]byte{}}
}

// GetNode returns a node queued or being written, else the store's.
func (b *writeBehind) GetNode(id hamtstore.NodeID) ([]byte, error) {
	b.mu.Lock()
	data, ok := b.pending[id]
	b.mu.Unlock()
	if ok {
		return data, nil
	}
	return b.base.GetNode(id)
}

// PutNodes queues nodes for the next flush.
func (b *writeBehind) PutNodes(nodes []hamtstore.EncodedNode) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, nd := range nodes {
		if _, ok := b.pending[nd.ID]; ok {
			continue
		}
		b.pending[nd.ID] = nd.Data
		b.queued = append(b.queued, packstore.Record{ID: packstore.ID(nd.ID), Data: nd.Data, Dense: true})
	}
	return nil
}

// flush waits for the write under way, then starts writing the queued nodes
// followed by recs. It returns the error of the write waited for.
func (b *writeBehind) flush(recs []packstore.Record) error {
	if err := b.wait(); err != nil {
		return err
	}
	b.mu.Lock()
	batch := append(b.queued, recs...)
	nodes := len(b.queued)
	b.queued = nil
	b.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	done := make(chan error, 1)
	b.running = done
	go func() {
		err := b.base.eng.PutMany(b.base.coll, batch)
		if err == nil { // else the nodes stay readable until the error is returned
			b.mu.Lock()
			for _, rec := range batch[:nodes] {
				delete(b.pending, hamtstore.NodeID(rec.ID))
			}
			b.mu.Unlock()
		}
		done <- err
	}()
	return nil
}

// wait waits for the write under way, if any, and returns its error.
func (b *writeBehind) wait() error {
	if b.running == nil {
		return nil
	}
	err := <-b.running
	b.running = nil
	return err
}
