package packstore

import (
	"fmt"
)

// ReleaseMapped drops the pages of every shard mapping from this process's
// resident set (madvise MADV_DONTNEED on the read-only mappings). The data stays
// in the kernel's page cache and later reads fault it back in; nothing is lost or
// written. A long scan that touches most of a store (a replay reads every PDU)
// calls it now and then, so that the file-backed part of its RSS stays bounded
// instead of growing to the size of the store. A no-op outside Linux. Safe for
// concurrent use with reads and writes.
func (s *PackfileStorage) ReleaseMapped() error {
	for i := range s.shards {
		sh := s.shards[i].Load()
		if sh == nil {
			continue
		}
		sh.mu.RLock()
		var err error
		if !sh.gone && len(sh.mm) > 0 {
			err = madvise(sh.mm, madvDontneed)
		}
		sh.mu.RUnlock()
		if err != nil {
			return fmt.Errorf("packstore: madvise(MADV_DONTNEED) %s: %w", sh.path, err)
		}
	}
	return nil
}

// releaseIfDue calls ReleaseMapped when the frames read since the last release
// reach Options.ReleaseEvery (see there). It runs at the end of a public read,
// with no shard lock held. The release is advisory: its error is dropped (the
// read it follows succeeded, and madvise on a live mapping fails only when the
// range is not mapped).
func (s *PackfileStorage) releaseIfDue() {
	every := s.opts.ReleaseEvery
	if every == 0 {
		every = DefaultReleaseEvery
	}
	if every < 0 {
		return
	}
	if n := s.mappedReads.Load(); n >= uint64(every) && s.mappedReads.CompareAndSwap(n, 0) {
		_ = s.ReleaseMapped()
	}
}
