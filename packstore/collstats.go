package packstore

// CollectionStats returns the live records of a collection and their frame bytes
// (payload plus FrameOverhead each, as they lie in the shards); ok is false for a
// collection with no live record. It takes the writer lock; a read-only store
// answers too. For `mtxdb rooms` (bytes per room).
func (s *PackfileStorage) CollectionStats(coll ID) (records int, liveBytes int64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.collectionLoad(coll)
	if c == nil {
		return 0, 0, false
	}
	return c.live, c.liveBytes, true
}

// RepackProgress returns the index of the collection plan a running Repack is
// copying (0-based, in RepackPlan.Collections order), or -1 when no repack runs.
// It takes no lock: for progress reports from another goroutine.
func (s *PackfileStorage) RepackProgress() int { return int(s.repackProgress.Load()) }
