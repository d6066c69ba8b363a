package hamtstore

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// MemNodeStore is a map-backed NodeStore for tests and benchmarks. It counts
// GetNode calls, PutNodes calls and nodes put. It is safe for concurrent use.
type MemNodeStore struct {
	mu    sync.RWMutex
	nodes map[NodeID][]byte // guarded by mu; values are private copies, never modified

	gets     atomic.Int64
	putCalls atomic.Int64
	puts     atomic.Int64
}

var _ NodeStore = (*MemNodeStore)(nil)

// NewMemNodeStore returns an empty store.
func NewMemNodeStore() *MemNodeStore {
	return &MemNodeStore{nodes: make(map[NodeID][]byte)}
}

// GetNode returns the stored bytes (shared, not copied: callers must not modify
// them), or an error wrapping ErrNotFound.
func (s *MemNodeStore) GetNode(id NodeID) ([]byte, error) {
	s.gets.Add(1)
	s.mu.RLock()
	data, ok := s.nodes[id]
	s.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w: %x", ErrNotFound, id[:])
	}
	return data, nil
}

// PutNodes copies each node into the store; existing IDs are left as they are.
func (s *MemNodeStore) PutNodes(nodes []EncodedNode) error {
	s.putCalls.Add(1)
	s.puts.Add(int64(len(nodes)))
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range nodes {
		if _, ok := s.nodes[n.ID]; ok {
			continue
		}
		s.nodes[n.ID] = append([]byte(nil), n.Data...)
	}
	return nil
}

// Gets returns the number of GetNode calls so far.
func (s *MemNodeStore) Gets() int64 { return s.gets.Load() }

// PutCalls returns the number of PutNodes calls so far.
func (s *MemNodeStore) PutCalls() int64 { return s.putCalls.Load() }

// Puts returns the number of nodes passed to PutNodes so far (including ones
// that already existed).
func (s *MemNodeStore) Puts() int64 { return s.puts.Load() }

// ResetCounters sets Gets, PutCalls and Puts to zero.
func (s *MemNodeStore) ResetCounters() {
	s.gets.Store(0)
	s.putCalls.Store(0)
	s.puts.Store(0)
}

// Len returns the number of distinct nodes stored.
func (s *MemNodeStore) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.nodes)
}

// Raw returns the stored bytes for id without counting a Get (for tests that
// inspect or damage nodes); ok is false if absent.
func (s *MemNodeStore) Raw(id NodeID) (data []byte, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	data, ok = s.nodes[id]
	return data, ok
}

// Replace overwrites the bytes stored under id without any check (for
// corruption tests).
func (s *MemNodeStore) Replace(id NodeID, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodes[id] = append([]byte(nil), data...)
}
