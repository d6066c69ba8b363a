package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCLIRefusesStoreWithoutShards: a store whose shard files are gone but whose
// index files remain is refused by writing and reading commands alike, instead
// of a write command starting a new empty store in it.
func TestCLIRefusesStoreWithoutShards(t *testing.T) {
	store := filepath.Join(t.TempDir(), "store")
	if out, code := run(t, "import", "--store", store, room("room003")); code != 0 {
		t.Fatalf("import: exit %d\n%s", code, out)
	}
	shards, _ := filepath.Glob(filepath.Join(store, "shard-*.mtdb"))
	for _, f := range append(shards, filepath.Join(store, "index.ckpt")) {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	for _, cmd := range []string{"replay", "verify", "repack"} {
		out, code := run(t, cmd, "--store", store)
		if code != 1 || !strings.Contains(out, "no shard file") {
			t.Errorf("%s: exit %d, want 1 naming the lost shards\n%s", cmd, code, out)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(store, "shard-*.mtdb")); len(m) != 0 {
		t.Errorf("a command created %v in the store", m)
	}
}
