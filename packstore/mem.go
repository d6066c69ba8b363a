package packstore

import (
	"fmt"
	"slices"
	"sync"
)

// MemStorage is an in-memory StorageEngine for tests. It keeps owned
// copies of payloads. It is safe for concurrent use.
type MemStorage struct {
	mu     sync.RWMutex // guards colls and closed
	colls  map[ID]map[ID][]byte
	closed bool
	reads  readStats // read budget by kind (readstats.go)
}

// NewMemStorage returns an empty MemStorage.
func NewMemStorage() *MemStorage { return &MemStorage{colls: make(map[ID]map[ID][]byte)} }

// Get returns a copy of the record's payload or ErrNotFound.
func (m *MemStorage) Get(coll, id ID) ([]byte, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, ErrClosed
	}
	d, ok := m.colls[coll][id]
	if !ok {
		return nil, ErrNotFound
	}
	return append([]byte{}, d...), nil
}

// GetMany returns copies of the payloads in request order, nil where absent.
func (m *MemStorage) GetMany(coll ID, ids []ID) ([][]byte, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, ErrClosed
	}
	out := make([][]byte, len(ids))
	for i, id := range ids {
		if d, ok := m.colls[coll][id]; ok {
			out[i] = append([]byte{}, d...)
		}
	}
	return out, nil
}

// Put stores a copy of data, superseding an existing record.
func (m *MemStorage) Put(coll, id ID, data []byte) error {
	return m.PutMany(coll, []Record{{ID: id, Data: data}})
}

// PutMany stores copies of the records in order (last duplicate wins).
func (m *MemStorage) PutMany(coll ID, recs []Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if len(recs) == 0 {
		return nil
	}
	c := m.colls[coll]
	if c == nil {
		c = make(map[ID][]byte)
		m.colls[coll] = c
	}
	for _, r := range recs {
		c[r.ID] = append([]byte{}, r.Data...)
	}
	return nil
}

// DeleteCollection forgets the collection.
func (m *MemStorage) DeleteCollection(coll ID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	delete(m.colls, coll)
	return nil
}

// Sync is a no-op.
func (m *MemStorage) Sync() error { return m.closedErr() }

// RefreshCollection is a no-op.
func (m *MemStorage) RefreshCollection(coll ID) error { return m.closedErr() }

func (m *MemStorage) closedErr() error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	return nil
}

// Collections returns the collections with at least one record, sorted.
func (m *MemStorage) Collections() []ID {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []ID
	for id := range m.colls {
		out = append(out, id)
	}
	slices.SortFunc(out, ID.Compare)
	return out
}

// Close makes later calls return ErrClosed.
func (m *MemStorage) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.closed = true
	return nil
}

// CollectionRecords returns the record IDs of coll (any order).
func (m *MemStorage) CollectionRecords(coll ID) ([]ID, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, ErrClosed
	}
	var out []ID
	for id := range m.colls[coll] {
		out = append(out, id)
	}
	return out, nil
}

// Repack applies a plan with the same validation and semantics as
// PackfileStorage.Repack: unlisted records are dropped. Byte counts are
// payload bytes; nothing is retired.
func (m *MemStorage) Repack(plan RepackPlan) (RepackStats, error) {
	var st RepackStats
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return st, ErrClosed
	}
	seenColl := make(map[ID]bool)
	for _, cp := range plan.Collections {
		if seenColl[cp.Collection] {
			return st, fmt.Errorf("packstore: repack: collection %s listed twice", cp.Collection)
		}
		seenColl[cp.Collection] = true
		seen := make(map[ID]bool)
		for _, id := range cp.Records {
			if seen[id] {
				return st, fmt.Errorf("packstore: repack: collection %s: record %s listed twice", cp.Collection, id)
			}
			seen[id] = true
			if _, ok := m.colls[cp.Collection][id]; !ok {
				return st, fmt.Errorf("packstore: repack: %w", &RepackMissingError{Collection: cp.Collection, Record: id})
			}
		}
	}
	for _, cp := range plan.Collections {
		old := m.colls[cp.Collection]
		if old == nil && len(cp.Records) == 0 {
			continue
		}
		st.CollectionsRepacked++
		st.RecordsDropped += len(old) - len(cp.Records)
		if len(cp.Records) == 0 {
			delete(m.colls, cp.Collection)
			continue
		}
		nc := make(map[ID][]byte, len(cp.Records))
		for _, id := range cp.Records {
			nc[id] = old[id]
			st.RecordsCopied++
			st.BytesCopied += int64(len(old[id]))
		}
		m.colls[cp.Collection] = nc
	}
	return st, nil
}
