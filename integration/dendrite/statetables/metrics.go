package statetables

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mtxdb/mtxdb/packstore"
)

// The metrics of the state stores of this process, named as Dendrite names its
// own (namespace dendrite, subsystem mtxdb). RegisterMetrics registers them.
var (
	snapshotsInserted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "dendrite", Subsystem: "mtxdb", Name: "state_snapshots_total",
		Help: "InsertState calls by outcome: written (a new snapshot) or existing (the room already had that state).",
	}, []string{"outcome"})
	stateWriteBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "dendrite", Subsystem: "mtxdb", Name: "state_write_bytes_total",
		Help: "Payload bytes of the records InsertState wrote (HAMT nodes, snapshot and root records, leases).",
	})
	stateWriteDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "dendrite", Subsystem: "mtxdb", Name: "state_write_duration_seconds",
		Help:    "Wall time of InsertState calls that wrote a new snapshot, until it was durable (or written in Dendrite's transaction on PostgreSQL).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 17),
	})
)

// observeWrite records one InsertState that wrote recs as a new snapshot.
func observeWrite(start time.Time, recs []packstore.Record) {
	n := 0
	for _, r := range recs {
		n += len(r.Data)
	}
	snapshotsInserted.WithLabelValues("written").Inc()
	stateWriteBytes.Add(float64(n))
	stateWriteDuration.Observe(time.Since(start).Seconds())
}

// RegisterMetrics registers, with reg, the state store metrics of this process
// (once; a second call registers nothing new) and, for a store in a packstore
// directory, its engine's collector (packstore.Collector: shards and bytes,
// index, cache, sync latency), named dendrite_mtxdb_packstore_* and labelled
// store=<directory>. Close unregisters the engine's collector when it closes
// the engine.
func RegisterMetrics(reg prometheus.Registerer, s *Store) error {
	for _, c := range []prometheus.Collector{snapshotsInserted, stateWriteBytes, stateWriteDuration} {
		if err := reg.Register(c); err != nil && !alreadyRegistered(err) {
			return err
		}
	}
	if s.eng == nil {
		return nil
	}
	registryMu.Lock()
	defer registryMu.Unlock()
	if s.metricsReg != nil {
		return nil
	}
	wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"store": s.dir},
		prometheus.WrapRegistererWithPrefix("dendrite_mtxdb_", reg))
	c := packstore.NewCollector(s.eng)
	if err := wrapped.Register(c); err != nil && !alreadyRegistered(err) {
		return err
	}
	s.metricsReg, s.metricsColl = wrapped, c
	return nil
}

func alreadyRegistered(err error) bool {
	var are prometheus.AlreadyRegisteredError
	return errors.As(err, &are)
}
