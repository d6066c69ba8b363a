package packstore

import (
	"cmp"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/edsrzf/mmap-go"
)

// ReadAheadMode selects the access-pattern hint Open gives the kernel for
// the shard mappings (Options.ReadAhead).
type ReadAheadMode uint8

const (
	// ReadAheadRandom marks every shard mapping MADV_RANDOM, so a page
	// fault reads one 4 KiB page instead of the kernel's read-around
	// window, and does the read-ahead that pays itself: windows of 128 KiB
	// to 1 MiB ahead of forward runs of reads (readAheadLocked),
	// MADV_SEQUENTIAL during a scan at Open (adviseScan) and a prefetch of
	// the frames a repack reads (prefetchLocked). Default (the zero value).
	ReadAheadRandom ReadAheadMode = iota
	// ReadAheadKernel gives no hint: a fault on a cold page reads around it
	// as the kernel sees fit (up to the device's read_ahead_kb: 8 MiB on
	// the measuring VM).
	ReadAheadKernel
)

// String returns "random" or "kernel".
func (m ReadAheadMode) String() string {
	switch m {
	case ReadAheadRandom:
		return "random"
	case ReadAheadKernel:
		return "kernel"
	}
	return fmt.Sprintf("ReadAheadMode(%d)", uint8(m))
}

// adviseMapping applies mode to a fresh mapping of the shard at path.
func adviseMapping(m mmap.MMap, mode ReadAheadMode, path string) error {
	if mode != ReadAheadRandom || len(m) == 0 {
		return nil
	}
	if err := madvise(m, madvRandom); err != nil {
		return fmt.Errorf("packstore: madvise(MADV_RANDOM) %s: %w", path, err)
	}
	return nil
}

// adviseScan marks the mapped bytes from off on MADV_SEQUENTIAL before a
// scan (start), so that the kernel reads them ahead in large windows, and
// MADV_RANDOM again after it. It does nothing for ReadAheadKernel. The
// writer calls it (s.mu held).
func (s *shard) adviseScan(off int64, start bool) error {
	if s.raMode != ReadAheadRandom || off >= int64(len(s.mm)) {
		return nil
	}
	advice, name := madvRandom, "MADV_RANDOM"
	if start {
		advice, name = madvSequential, "MADV_SEQUENTIAL"
	}
	// madvise wants a page-aligned start.
	if err := madvise(s.mm[off&^(ReadPageSize-1):], advice); err != nil {
		return fmt.Errorf("packstore: madvise(%s) %s from %d: %w", name, s.path, off, err)
	}
	return nil
}

// raWindowState is a shard's detector of sequential reads (see
// readAheadLocked): the offset of the previous mapped read, the end of the
// last MADV_WILLNEED range and the size of the window last asked for. All
// are hints; races between readers only cost a redundant or a missing
// madvise.
type raWindowState struct {
	prev, ahead, size atomic.Int64
}

// readAheadLocked is called before a mapped read at off (s.mu held for
// reading). When the read follows the previous one within seqGap bytes it
// asks the kernel (MADV_WILLNEED) to read ahead from off's page: a window
// of raMinWindow bytes, doubling on each further window of the same forward
// run up to raMaxWindow, asked for again when the read passes the middle of
// the last one. A forward walk then costs one I/O per window instead of one
// fault per page. Reads that do not follow the previous one issue no system
// call.
func (s *shard) readAheadLocked(off int64) error {
	if s.raMax == 0 {
		return nil
	}
	prev := s.ra.prev.Swap(off)
	if off <= prev || off-prev > seqGap {
		return nil
	}
	page := off &^ (ReadPageSize - 1)
	a, w := s.ra.ahead.Load(), s.ra.size.Load()
	inRun := a > page && a-2*w <= page // a belongs to this forward run
	if inRun && off+w/2 <= a {
		return nil
	}
	start := page
	if inRun {
		// a may be the unaligned end of a shorter, earlier mapping.
		start, w = a&^(ReadPageSize-1), min(2*w, s.raMax)
	} else {
		w = min(raMinWindow, s.raMax)
	}
	end := min(page+w, int64(len(s.mm)))
	if start >= end {
		return nil
	}
	s.ra.ahead.Store(end)
	s.ra.size.Store(w)
	if err := madvise(s.mm[start:end], madvWillneed); err != nil {
		return fmt.Errorf("packstore: madvise(MADV_WILLNEED) %s [%d, %d): %w", s.path, start, end, err)
	}
	return nil
}

const (
	// seqGap is the largest forward distance from the previous read that
	// still counts as sequential for readAheadLocked, and the largest gap
	// between two frames that prefetchLocked reads through rather than
	// skipping. On the virtio disk this was measured on, a 4 KiB read at
	// queue depth 1 took about 70 us, the time to transfer about 40 KiB
	// sequentially (about 600 MB/s).
	seqGap = 32 << 10
	// raMinWindow is the first read-ahead window of a forward run.
	raMinWindow = 128 << 10
	// raMaxWindow is the largest.
	raMaxWindow = 1 << 20
)

// readAheadMax returns the largest read-ahead window of a forward run, 0
// when the explicit read-ahead is off (ReadAheadKernel leaves read-ahead to
// the kernel).
func (o *Options) readAheadMax() int64 {
	switch {
	case o.ReadAhead != ReadAheadRandom || o.raMax < 0:
		return 0
	case o.raMax > 0:
		return o.raMax
	}
	return raMaxWindow
}

// prefetchLocked asks the kernel (MADV_WILLNEED) to read the mapped frames
// at locs ahead of the caller's reads: bytes [off, off+sizes[i]), or with
// nil sizes the frame's first two pages (enough for its head). The ranges
// are sorted and merged when at most seqGap apart, so a repack that reads
// in another order than the file's reads its input in a few large I/Os
// instead of one fault per page. It does nothing for ReadAheadKernel. The
// writer calls it (s.mu held): the mappings do not change.
func (s *PackfileStorage) prefetchLocked(locs []loc, sizes []int) error {
	type span struct {
		sh         *shard
		start, end int64
	}
	spans := make([]span, 0, len(locs))
	for i, l := range locs {
		sh := s.shards[l.shard].Load()
		if sh == nil || sh.raMax == 0 {
			continue
		}
		start := int64(l.off) &^ (ReadPageSize - 1)
		end := start + 2*ReadPageSize
		if sizes != nil {
			end = int64(l.off) + int64(sizes[i])
		}
		if end = min(end, int64(len(sh.mm))); start < end {
			spans = append(spans, span{sh, start, end})
		}
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Or(cmp.Compare(a.sh.id, b.sh.id), cmp.Compare(a.start, b.start)) })
	for k := 0; k < len(spans); {
		r := spans[k]
		for k++; k < len(spans) && spans[k].sh == r.sh && spans[k].start-r.end <= seqGap; k++ {
			r.end = max(r.end, spans[k].end)
		}
		// The kernel reads at most max(read_ahead_kb, the device's optimal
		// I/O size) per MADV_WILLNEED call: ask in windows.
		for p := r.start; p < r.end; p += raMaxWindow {
			q := min(p+raMaxWindow, r.end)
			if err := madvise(r.sh.mm[p:q], madvWillneed); err != nil {
				return fmt.Errorf("packstore: madvise(MADV_WILLNEED) %s [%d, %d): %w", r.sh.path, p, q, err)
			}
		}
	}
	return nil
}
