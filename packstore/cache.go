package packstore

import (
	"sync/atomic"

	"github.com/dgraph-io/ristretto/v2"
)

// nodeCache is the byte-bounded cache of decoded payloads, a ristretto v2
// cache keyed by stream position (shard sequence number, offset). Frames
// are immutable and a position is never reused (sequence numbers only grow, even where a new
// shard takes a retired shard's pack ID; a failed write's bytes are never
// indexed), so entries need no invalidation: a superseded or deleted record is simply
// no longer reached through the index. Each entry keeps the frame's
// collection and record ID, checked on every hit. Safe for concurrent use.
type nodeCache struct {
	c            *ristretto.Cache[uint64, *cacheEntry]
	hits, misses atomic.Uint64
}

type cacheEntry struct {
	coll, id ID
	data     []byte // immutable once cached
}

// cacheEntryOverhead approximates the bytes an entry costs beyond its payload.
const cacheEntryOverhead = 96

func newNodeCache(maxBytes int64) (*nodeCache, error) {
	c, err := ristretto.NewCache(&ristretto.Config[uint64, *cacheEntry]{
		NumCounters: max(1<<12, maxBytes/64), // ~10x the entries of 640-byte nodes
		MaxCost:     maxBytes,
		BufferItems: 64,
	})
	if err != nil {
		return nil, err
	}
	return &nodeCache{c: c}, nil
}

func cacheKey(p pos) uint64 { return uint64(p.seq)<<32 | uint64(p.off) }

// get returns the cached entry at p, counting a hit or a miss.
func (nc *nodeCache) get(p pos) (*cacheEntry, bool) {
	e, ok := nc.c.Get(cacheKey(p))
	if ok {
		nc.hits.Add(1)
	} else {
		nc.misses.Add(1)
	}
	return e, ok
}

// put caches a private copy of data for the frame at p.
func (nc *nodeCache) put(p pos, coll, id ID, data []byte) {
	e := &cacheEntry{coll: coll, id: id, data: append([]byte{}, data...)}
	nc.c.Set(cacheKey(p), e, int64(len(data))+cacheEntryOverhead)
}

func (nc *nodeCache) close() { nc.c.Close() }
