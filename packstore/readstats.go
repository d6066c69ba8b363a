package packstore

import "sync"

// ReadKind is a caller-supplied tag naming what a read is for (packstore does
// not know what records are: roomstate tags HAMT nodes, PDUs and metadata).
// ReadUntagged is what Get, GetMany and View count under.
type ReadKind uint8

// ReadUntagged is the kind of reads issued without a tag.
const ReadUntagged ReadKind = 0

// ReadPageSize is the page size of the read statistics: 4 KiB.
const ReadPageSize = 4096

// ReadCounters is the read budget of one read kind since the last reset.
//
// A physical read is one frame read from a shard (a cache miss; a frame
// read on a tag collision counts too); Bytes are its frame bytes (framing
// included, payload as stored). Pages counts the distinct 4 KiB pages of the
// shard files the physical reads covered. A physical read is a seek when it
// does not start in the pages of the previous physical read (of any kind) or
// the page after them, in the same shard; the first read after a reset is a
// seek. CacheHits are reads answered by the node cache: no physical read, no
// pages, no seek.
//
// MemStorage counts Reads and Bytes (payload bytes) only.
type ReadCounters struct {
	Reads     int64
	Bytes     int64
	Pages     int64
	Seeks     int64
	CacheHits int64
}

// Add returns the sum of two counters.
func (c ReadCounters) Add(o ReadCounters) ReadCounters {
	return ReadCounters{c.Reads + o.Reads, c.Bytes + o.Bytes, c.Pages + o.Pages, c.Seeks + o.Seeks, c.CacheHits + o.CacheHits}
}

// KindGetter is implemented by engines that count reads by kind
// (PackfileStorage, MemStorage). GetKind is Get with a tag.
type KindGetter interface {
	GetKind(coll, id ID, kind ReadKind) ([]byte, error)
	// ReadStats returns the counters of every kind read since the last
	// reset (kinds never read are absent).
	ReadStats() map[ReadKind]ReadCounters
	// ReadStatsTotal returns the counters of all kinds together: Pages are
	// the distinct pages any kind touched (not the sum over kinds).
	ReadStatsTotal() ReadCounters
	// ResetReadStats zeroes the counters, forgets the pages seen and the
	// position of the previous read.
	ResetReadStats()
}

var (
	_ KindGetter = (*PackfileStorage)(nil)
	_ KindGetter = (*MemStorage)(nil)
)

// readStats accumulates ReadCounters. One mutex: a read costs a lock and a
// few increments. The distinct-page sets are bitmaps per (kind, shard),
// allocated when first touched (at most 8 KiB per shard and kind: memory is
// bounded by the store size, not by the number of reads).
type readStats struct {
	mu    sync.Mutex
	kinds map[ReadKind]*kindStats
	total kindStats // all kinds: distinct pages over every kind
	// previous physical read: shard and page range; valid when have.
	have                bool
	lastShard           uint16
	lastFirst, lastLast uint32
}

type kindStats struct {
	c     ReadCounters
	pages map[uint16][]uint64
}

func (r *readStats) kind(k ReadKind) *kindStats {
	if r.kinds == nil {
		r.kinds = map[ReadKind]*kindStats{}
	}
	ks := r.kinds[k]
	if ks == nil {
		ks = &kindStats{pages: map[uint16][]uint64{}}
		r.kinds[k] = ks
	}
	return ks
}

// physical counts a read of size bytes at (shard, off).
func (r *readStats) physical(k ReadKind, shard uint16, off int64, size int) {
	first := uint32(off / ReadPageSize)
	last := uint32((off + int64(max(size, 1)) - 1) / ReadPageSize)
	r.mu.Lock()
	defer r.mu.Unlock()
	seek := !r.have || r.lastShard != shard || first < r.lastFirst || first > r.lastLast+1
	r.have, r.lastShard, r.lastFirst, r.lastLast = true, shard, first, last
	if r.total.pages == nil {
		r.total.pages = map[uint16][]uint64{}
	}
	for _, ks := range []*kindStats{r.kind(k), &r.total} {
		ks.c.Reads++
		ks.c.Bytes += int64(size)
		if seek {
			ks.c.Seeks++
		}
		bm := ks.pages[shard]
		if need := int(last/64) + 1; len(bm) < need {
			bm = append(bm, make([]uint64, need-len(bm))...)
		}
		for p := first; p <= last; p++ {
			w, b := p/64, uint64(1)<<(p%64)
			if bm[w]&b == 0 {
				bm[w] |= b
				ks.c.Pages++
			}
		}
		ks.pages[shard] = bm
	}
}

// logical counts a read with no page position (MemStorage).
func (r *readStats) logical(k ReadKind, size int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ks := range []*kindStats{r.kind(k), &r.total} {
		ks.c.Reads++
		ks.c.Bytes += int64(size)
	}
}

func (r *readStats) cacheHit(k ReadKind) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kind(k).c.CacheHits++
	r.total.c.CacheHits++
}

func (r *readStats) snapshot() map[ReadKind]ReadCounters {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[ReadKind]ReadCounters, len(r.kinds))
	for k, ks := range r.kinds {
		out[k] = ks.c
	}
	return out
}

func (r *readStats) totals() ReadCounters {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total.c
}

func (r *readStats) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kinds = nil
	r.total = kindStats{}
	r.have = false
}

// GetKind is Get counting the read under kind (see ReadCounters).
func (s *PackfileStorage) GetKind(coll, id ID, kind ReadKind) ([]byte, error) {
	defer s.releaseIfDue()
	var data []byte
	err := s.find(coll, id, func(l loc) (bool, error) {
		d, ok, err := s.readRecord(l, coll, id, kind)
		data = d
		return ok, err
	})
	if err != nil {
		return nil, err
	}
	return data, nil
}

// ReadStats returns the read counters by kind since the last ResetReadStats.
func (s *PackfileStorage) ReadStats() map[ReadKind]ReadCounters { return s.reads.snapshot() }

// ReadStatsTotal returns the counters of all kinds together (distinct pages
// over every kind).
func (s *PackfileStorage) ReadStatsTotal() ReadCounters { return s.reads.totals() }

// ResetReadStats zeroes the read counters.
func (s *PackfileStorage) ResetReadStats() { s.reads.reset() }

// GetKind is Get counting the read (Reads and payload Bytes) under kind.
func (m *MemStorage) GetKind(coll, id ID, kind ReadKind) ([]byte, error) {
	d, err := m.Get(coll, id)
	if err == nil {
		m.reads.logical(kind, len(d))
	}
	return d, err
}

// ReadStats returns the read counters by kind since the last ResetReadStats.
func (m *MemStorage) ReadStats() map[ReadKind]ReadCounters { return m.reads.snapshot() }

// ReadStatsTotal returns the counters of all kinds together.
func (m *MemStorage) ReadStatsTotal() ReadCounters { return m.reads.totals() }

// ResetReadStats zeroes the read counters.
func (m *MemStorage) ResetReadStats() { m.reads.reset() }
