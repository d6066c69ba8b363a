package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestPlotFile(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "dendrite.json")
	js := `{"runs": [{"database": "sqlite", "build": "stock", "users": 3, "state_bytes": 2048, "event_json_bytes": 4096, "state_write_p50_ms": 10},
		{"database": "sqlite", "build": "mtxdb", "users": 3, "state_bytes": 3072, "event_json_bytes": 4096, "state_write_p50_ms": 8}],
		"fork_runs": [{"database": "postgres", "build": "mtxdb", "members": 10, "recv_to_visible_p50_ms": 150}]}`
	if err := os.WriteFile(in, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.png")
	if err := plotFile(in, out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("\x89PNG\r\n")) {
		t.Fatalf("%s is not a PNG (%d bytes)", out, len(b))
	}
	if err := os.WriteFile(in, []byte(`{"date": "x"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := plotFile(in, out); err == nil {
		t.Fatal("plotFile of a JSON without runs: no error")
	}
}
