package packstore

import "fmt"

// Check walks every collection's index and verifies the engine's
// invariants: every slot points at a valid frame (CRC checked) of that
// collection and record, each record is found from its home bucket at its
// slot, table load stays at or below 75%, and the per-shard reference counts
// and per-collection live counts agree with the tables. It takes the writer
// lock and reads every live frame; tests call it after each scenario.
func (s *PackfileStorage) Check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return ErrClosed
	}
	refs := make(map[uint16]int)
	var err error
	s.colls.Range(func(k, v any) bool {
		coll, c := k.(ID), v.(*collection)
		t := c.table.Load()
		used := 0
		var bytes int64
		t.each(func(l loc) {
			if err != nil {
				return
			}
			used++
			refs[l.shard]++
			sh := s.shards[l.shard].Load()
			if sh == nil {
				err = fmt.Errorf("packstore: check: collection %s references missing shard %d", coll, l.shard)
				return
			}
			var id ID
			err = sh.withFrame(int64(l.off), false, func(fv frameView) error {
				if fv.Flags&FlagReset != 0 || fv.Coll != coll {
					return sh.corruptf(int64(l.off), "index of %s points at a frame of %s (flags %02x)", coll, fv.Coll, fv.Flags)
				}
				id = fv.ID
				bytes += int64(fv.Size)
				return nil
			})
			if err != nil {
				return
			}
			got, _, found, lerr := s.lookupLocked(c, id)
			switch {
			case lerr != nil:
				err = lerr
			case !found || got != l:
				err = fmt.Errorf("packstore: check: collection %s record %s at %v is not reachable from its bucket", coll, id, l)
			}
		})
		if err != nil {
			return false
		}
		switch {
		case used != t.count:
			err = fmt.Errorf("packstore: check: collection %s table count %d, used slots %d", coll, t.count, used)
		case used != c.live || bytes != c.liveBytes:
			err = fmt.Errorf("packstore: check: collection %s live %d/%d bytes, index holds %d/%d", coll, c.live, c.liveBytes, used, bytes)
		case used == 0:
			err = fmt.Errorf("packstore: check: collection %s is empty but listed", coll)
		case used*4 > len(t.slots)*3:
			err = fmt.Errorf("packstore: check: collection %s table over 75%% load", coll)
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	for i := range s.shards {
		sh := s.shards[i].Load()
		if sh == nil {
			continue
		}
		if sh.live != refs[sh.id] {
			return fmt.Errorf("packstore: check: shard %d live count %d, index references %d", sh.id, sh.live, refs[sh.id])
		}
		delete(refs, sh.id)
	}
	if len(refs) > 0 {
		return fmt.Errorf("packstore: check: index references missing shards %v", refs)
	}
	return nil
}
