package e2e

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"maunium.net/go/mautrix"
)

// TestMetricsScraped starts the patched Dendrite with Prometheus metrics on
// (global.metrics.enabled, basic auth metrics:metrics, as generate-config
// writes it), makes a room, and scrapes /metrics: the state store's metrics
// (dendrite_mtxdb_state_*) count the snapshots the room wrote, and on SQLite
// the packstore engine's collector (dendrite_mtxdb_packstore_*: shard bytes,
// sync latency) is there with its store label. On PostgreSQL, where the state
// is in Dendrite's own database, the engine's collector is absent.
func TestMetricsScraped(t *testing.T) {
	forBackends(t, "test-dendrite-e2e", func(t *testing.T, bin, backend, pg string) {
		dbURL := ""
		if backend == "postgres" {
			dbURL = pgDatabase(t, pg, "e2e_metrics")
		}
		s := configureServer(t, filepath.Join(t.TempDir(), "metrics"), "metrics", "localhost", bin, dbURL, nil, func(cfg string) string {
			cfg = strings.Replace(cfg, "disable_federation: false", "disable_federation: true", 1)
			if !strings.Contains(cfg, "metrics:\n    enabled: false") {
				t.Fatalf("generate-config wrote no metrics section to turn on:\n%s", cfg)
			}
			cfg = strings.Replace(cfg, "metrics:\n    enabled: false", "metrics:\n    enabled: true", 1)
			return setLogLevel(cfg, "warn")
		})
		if err := s.start(); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		c := client(t, s)
		r := m(c.RegisterDummy(ctx, &mautrix.ReqRegister[any]{Username: "alice", Password: "alice-password-1"})).or(t, "register alice")
		c.SetCredentials(r.UserID, r.AccessToken)
		m(c.CreateRoom(ctx, &mautrix.ReqCreateRoom{Preset: "public_chat", Name: "metrics", Topic: "a topic"})).or(t, "create room")

		req, err := http.NewRequest(http.MethodGet, s.url+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.SetBasicAuth("metrics", "metrics")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
		}
		samples := parseSamples(string(body))
		if n := samples[`dendrite_mtxdb_state_snapshots_total{outcome="written"}`]; n < 1 {
			t.Errorf("state snapshots written: %v", n)
		}
		if n := samples["dendrite_mtxdb_state_write_duration_seconds_count"]; n < 1 {
			t.Errorf("state write latency samples: %v", n)
		}
		if n := samples["dendrite_mtxdb_state_write_bytes_total"]; n <= 0 {
			t.Errorf("state write bytes: %v", n)
		}
		var engine []string
		for name := range samples {
			if strings.HasPrefix(name, "dendrite_mtxdb_packstore_") {
				engine = append(engine, name)
			}
		}
		if backend == "postgres" {
			if len(engine) > 0 {
				t.Errorf("a PostgreSQL Dendrite has a packstore engine's metrics: %v", engine)
			}
			return
		}
		var shards, syncs float64
		for name, v := range samples {
			if strings.HasPrefix(name, "dendrite_mtxdb_packstore_shard_bytes{") && strings.Contains(name, `store="`) {
				shards += v
			}
			if strings.HasPrefix(name, "dendrite_mtxdb_packstore_sync_duration_seconds_count{") {
				syncs += v
			}
		}
		if shards <= 0 || syncs < 1 {
			t.Errorf("packstore collector: shard bytes %v, syncs %v; engine metrics %v", shards, syncs, engine)
		}
	})
}

// parseSamples reads Prometheus text exposition: "name{labels} value" per
// sample line, comments skipped.
func parseSamples(text string) map[string]float64 {
	out := map[string]float64{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] += v
		}
	}
	return out
}
