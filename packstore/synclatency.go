package packstore

import (
	"sync/atomic"
	"time"
)

// syncBuckets are the upper bounds, in seconds, of the Sync latency histogram:
// 100 µs doubling to 6.55 s (17 buckets), from a page-cache-only sync to a
// disk stalled behind other writers.
var syncBuckets = func() []float64 {
	b := make([]float64, 17)
	for i := range b {
		b[i] = 0.0001 * float64(uint(1)<<i)
	}
	return b
}()

// latencyHist counts durations by syncBuckets without a lock: counts[i] is the
// number of durations in bucket i (not cumulative), the last entry those above
// every bound.
type latencyHist struct {
	counts [18]atomic.Uint64
	sumNs  atomic.Uint64
}

func (h *latencyHist) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(syncBuckets) && s > syncBuckets[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sumNs.Add(uint64(max(d, 0)))
}

// snapshot returns the count, the sum in seconds and the cumulative count per
// upper bound, as Prometheus histograms give them.
func (h *latencyHist) snapshot() (count uint64, sum float64, cumulative map[float64]uint64) {
	cumulative = make(map[float64]uint64, len(syncBuckets))
	for i, ub := range syncBuckets {
		count += h.counts[i].Load()
		cumulative[ub] = count
	}
	count += h.counts[len(syncBuckets)].Load()
	return count, float64(h.sumNs.Load()) / 1e9, cumulative
}
