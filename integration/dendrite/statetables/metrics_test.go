package statetables

import (
	"testing"

	"github.com/matrix-org/dendrite/roomserver/types"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestMetrics: a registry that RegisterMetrics filled gathers the state write
// metrics (a new snapshot counted as written, the same state again as existing,
// bytes and a latency sample) and the directory store's packstore collector under
// dendrite_mtxdb_packstore_* with its store label; after Close the collector is
// gone from the registry.
func TestMetrics(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := RegisterMetrics(reg, s); err != nil {
		t.Fatal(err)
	}
	if err := RegisterMetrics(reg, s); err != nil {
		t.Fatalf("second registration: %v", err)
	}
	gather := func() map[string]*dto.MetricFamily {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*dto.MetricFamily{}
		for _, f := range fams {
			out[f.GetName()] = f
		}
		return out
	}
	value := func(f *dto.MetricFamily, label, want string) float64 {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == want {
					return m.GetCounter().GetValue()
				}
			}
		}
		return -1
	}
	before := gather()
	written0 := value(before["dendrite_mtxdb_state_snapshots_total"], "outcome", "written")
	existing0 := value(before["dendrite_mtxdb_state_snapshots_total"], "outcome", "existing")
	hist0 := before["dendrite_mtxdb_state_write_duration_seconds"].GetMetric()[0].GetHistogram().GetSampleCount()

	k := types.StateKeyTuple{EventTypeNID: 1, EventStateKeyNID: 1}
	for range 2 {
		d, err := s.BulkInsertStateData(ctx, nil, types.StateEntries{{StateKeyTuple: k, EventNID: 20}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.InsertState(ctx, nil, 1, types.StateBlockNIDs{d}); err != nil {
			t.Fatal(err)
		}
	}
	got := gather()
	if w := value(got["dendrite_mtxdb_state_snapshots_total"], "outcome", "written"); w != max(written0, 0)+1 {
		t.Errorf("written: %v, before %v", w, written0)
	}
	if e := value(got["dendrite_mtxdb_state_snapshots_total"], "outcome", "existing"); e != max(existing0, 0)+1 {
		t.Errorf("existing: %v, before %v", e, existing0)
	}
	if n := got["dendrite_mtxdb_state_write_duration_seconds"].GetMetric()[0].GetHistogram().GetSampleCount(); n != hist0+1 {
		t.Errorf("write latency samples %d, before %d", n, hist0)
	}
	if got["dendrite_mtxdb_state_write_bytes_total"].GetMetric()[0].GetCounter().GetValue() <= 0 {
		t.Error("no bytes counted")
	}
	for _, name := range []string{"dendrite_mtxdb_packstore_shard_bytes", "dendrite_mtxdb_packstore_sync_duration_seconds",
		"dendrite_mtxdb_packstore_live_records", "dendrite_mtxdb_packstore_collections"} {
		f := got[name]
		if f == nil {
			t.Errorf("no %s", name)
			continue
		}
		store := ""
		for _, l := range f.GetMetric()[0].GetLabel() {
			if l.GetName() == "store" {
				store = l.GetValue()
			}
		}
		if store != s.Dir() {
			t.Errorf("%s: store label %q, want %s", name, store, s.Dir())
		}
	}
	if n := got["dendrite_mtxdb_packstore_sync_duration_seconds"].GetMetric()[0].GetHistogram().GetSampleCount(); n == 0 {
		t.Error("no sync latency sample after a durable InsertState")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if f := gather()["dendrite_mtxdb_packstore_shard_bytes"]; f != nil {
		t.Error("the engine's collector outlived Close")
	}
}
