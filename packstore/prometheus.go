package packstore

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports a PackfileStorage's figures as Prometheus metrics; a
// server registers it if it wants (prometheus.MustRegister(NewCollector(s))).
// A scrape takes the writer lock for an IndexStats walk (O(live records)).
// Safe for concurrent use.
type Collector struct {
	s                                      *PackfileStorage
	load, probeMean, probeMax, collisions  *prometheus.Desc
	cacheHits, cacheMisses, cacheRatio     *prometheus.Desc
	shardBytes, shardLive, repackProgress  *prometheus.Desc
	needsRepack, liveRecords, collectionsD *prometheus.Desc
	syncDuration                           *prometheus.Desc
}

// NewCollector returns a Collector for s.
func NewCollector(s *PackfileStorage) *Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("packstore_"+name, help, labels, nil)
	}
	return &Collector{s: s,
		load:           d("index_load_factor", "Used index slots over all slots, all collections."),
		probeMean:      d("index_probe_length_mean", "Mean probe length (1 = home bucket) over live records."),
		probeMax:       d("index_probe_length_max", "Longest probe length over live records."),
		collisions:     d("tag_collision_reads_total", "Frame reads whose 24-bit tag matched but the record ID did not."),
		cacheHits:      d("cache_hits_total", "Node cache hits."),
		cacheMisses:    d("cache_misses_total", "Node cache misses."),
		cacheRatio:     d("cache_hit_ratio", "Node cache hits over lookups since open."),
		shardBytes:     d("shard_bytes", "Shard file size in bytes.", "shard"),
		shardLive:      d("shard_live_bytes", "Frame bytes of live records in the shard.", "shard"),
		repackProgress: d("repack_progress", "Index of the collection plan a running repack is copying; -1 when idle."),
		needsRepack:    d("collections_needing_repack", "Collections for which NeedsRepack holds."),
		liveRecords:    d("live_records", "Records reachable through the indexes."),
		collectionsD:   d("collections", "Collections with at least one live record."),
		syncDuration:   d("sync_duration_seconds", "Wall time of Sync calls (lock wait, fsync and index delta), since open."),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.load, c.probeMean, c.probeMax, c.collisions, c.cacheHits, c.cacheMisses,
		c.cacheRatio, c.shardBytes, c.shardLive, c.repackProgress, c.needsRepack, c.liveRecords, c.collectionsD, c.syncDuration} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	ch <- prometheus.MustNewConstMetric(c.collisions, prometheus.CounterValue, float64(c.s.collisions.Load()))
	g(c.repackProgress, float64(c.s.repackProgress.Load()))
	n, sum, buckets := c.s.syncLatency.snapshot()
	ch <- prometheus.MustNewConstHistogram(c.syncDuration, n, sum, buckets)
	if nc := c.s.cache; nc != nil {
		h, m := nc.hits.Load(), nc.misses.Load()
		ch <- prometheus.MustNewConstMetric(c.cacheHits, prometheus.CounterValue, float64(h))
		ch <- prometheus.MustNewConstMetric(c.cacheMisses, prometheus.CounterValue, float64(m))
		if h+m > 0 {
			g(c.cacheRatio, float64(h)/float64(h+m))
		}
	}
	colls, shards, err := c.s.IndexStats()
	if err != nil {
		return
	}
	var used, slots, probeSum, probeMax, need int
	for _, cs := range colls {
		used += cs.Records
		slots += cs.Slots
		probeSum += cs.ProbeSum
		probeMax = max(probeMax, cs.ProbeMax)
		if needsRepack(cs) {
			need++
		}
	}
	if slots > 0 {
		g(c.load, float64(used)/float64(slots))
	}
	if used > 0 {
		g(c.probeMean, float64(probeSum)/float64(used))
	}
	g(c.probeMax, float64(probeMax))
	g(c.needsRepack, float64(need))
	g(c.liveRecords, float64(used))
	g(c.collectionsD, float64(len(colls)))
	for _, sh := range shards {
		id := strconv.Itoa(int(sh.ID))
		g(c.shardBytes, float64(sh.Bytes), id)
		g(c.shardLive, float64(sh.LiveBytes), id)
	}
}

var _ prometheus.Collector = (*Collector)(nil)
