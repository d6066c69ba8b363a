package packstore

// CollectionStat describes one collection's live records and layout.
type CollectionStat struct {
	Collection    ID
	Records       int   // live records
	Bytes         int64 // frame bytes of the live records
	ShardsSpanned int   // distinct shards holding its live records
	// SpannedBytes is the total frame bytes of the shards it spans: what a
	// sequential pass over those shards reads.
	SpannedBytes int64
	Slots        int // index table size
	ProbeMax     int // longest probe from a record's home bucket (1 = home)
	ProbeSum     int // sum of probe lengths over the live records
}

// ShardStat describes one shard file.
type ShardStat struct {
	ID          uint16
	Bytes       int64 // file size
	LiveRecords int   // index slots (all collections) pointing here
	LiveBytes   int64 // frame bytes of those records
}

// IndexStats walks every collection's index and returns per-collection and
// per-shard figures (the inputs of NeedsRepack).
// It takes the writer lock and reads each live frame's header (from the
// mapping): O(live records). Collections are sorted by ID, shards by pack ID.
func (s *PackfileStorage) IndexStats() ([]CollectionStat, []ShardStat, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return nil, nil, ErrClosed
	}
	shardIdx := map[uint16]int{}
	var shards []ShardStat
	for i := range s.shards {
		if sh := s.shards[i].Load(); sh != nil {
			shardIdx[sh.id] = len(shards)
			shards = append(shards, ShardStat{ID: sh.id, Bytes: sh.size, LiveRecords: sh.live})
		}
	}
	var colls []CollectionStat
	for _, coll := range s.Collections() {
		c := s.collectionLoad(coll)
		if c == nil {
			continue
		}
		t := c.table.Load()
		cs := CollectionStat{Collection: coll, Records: c.live, Bytes: c.liveBytes, Slots: len(t.slots)}
		spanned := map[uint16]bool{}
		for i := range t.slots {
			v := t.slots[i].Load()
			if v == 0 {
				continue
			}
			l := slotLoc(v)
			id, size, err := s.readIDScan(l)
			if err != nil {
				return nil, nil, err
			}
			probe := int((uint64(i)-t.bucket(id))&t.mask()) + 1
			cs.ProbeSum += probe
			cs.ProbeMax = max(cs.ProbeMax, probe)
			spanned[l.shard] = true
			shards[shardIdx[l.shard]].LiveBytes += int64(size)
		}
		cs.ShardsSpanned = len(spanned)
		for id := range spanned {
			cs.SpannedBytes += s.shards[id].Load().size - HeaderSize
		}
		colls = append(colls, cs)
	}
	return colls, shards, nil
}

// NeedsRepack reports whether coll would benefit from a repack, by this
// heuristic (documented, not tuned on real rooms yet): a collection whose
// live records span at least two shards, and whose live bytes are less than
// half of the bytes of the shards it spans (a sequential pass over its
// shards would read mostly garbage or other collections' records). The
// repack is caller-scheduled: nothing polls this. It costs an IndexStats
// walk of that collection.
func (s *PackfileStorage) NeedsRepack(coll ID) (bool, error) {
	colls, _, err := s.IndexStats()
	if err != nil {
		return false, err
	}
	for _, cs := range colls {
		if cs.Collection == coll {
			return needsRepack(cs), nil
		}
	}
	return false, nil
}

func needsRepack(cs CollectionStat) bool {
	return cs.ShardsSpanned >= 2 && cs.Bytes*2 < cs.SpannedBytes
}
