package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestPlotFile draws a two-walk, two-layout file with a zero and a 1000x spread (log
// panel) and checks one PNG per room; a JSON without cells is an error.
func TestPlotFile(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "repack-t.json")
	js := `{"machine":"m","cold_runs":3,"rooms":[{"label":"generated g/1","events":10}],"cells":[
 {"room":"generated g/1","walk":"auth-chain","layout":"before","total":{"Pages":400,"Seeks":359},"cold_ms_median":3.5},
 {"room":"generated g/1","walk":"auth-chain","layout":"mixed","total":{"Pages":87,"Seeks":1},"cold_ms_median":1.1},
 {"room":"generated g/1","walk":"backfill","layout":"before","total":{"Pages":10,"Seeks":0},"cold_ms_median":2},
 {"room":"generated g/1","walk":"backfill","layout":"mixed","total":{"Pages":12,"Seeks":3},"cold_ms_median":2.5}]}`
	if err := os.WriteFile(in, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	files, err := plotFile(in, "")
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(dir, "repack-t-generated-g-1.png")
	if len(files) != 1 || files[0] != want {
		t.Fatalf("wrote %v, want %s", files, want)
	}
	b, err := os.ReadFile(want)
	if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Fatalf("not a PNG: %v", err)
	}
	if err := os.WriteFile(in, []byte(`{"rooms":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := plotFile(in, ""); err == nil {
		t.Fatal("a JSON without cells plotted")
	}
}
