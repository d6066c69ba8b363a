package packstore

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStorePermissions: a new store's directory is 0700
// and its files 0600 (shards hold private rooms' events); Options.Perm
// widens both; an existing store readable by others opens with a warning
// in OpenReport.Warnings, its modes unchanged.
func TestStorePermissions(t *testing.T) {
	modes := func(dir string) map[string]os.FileMode {
		out := map[string]os.FileMode{}
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		out["."] = fi.Mode().Perm()
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			fi, err := e.Info()
			if err != nil {
				t.Fatal(err)
			}
			out[e.Name()] = fi.Mode().Perm()
		}
		return out
	}
	fill := func(opts Options) {
		s := openStore(t, opts)
		if err := s.Put(ID{1}, ID{2}, []byte("private room event")); err != nil {
			t.Fatal(err)
		}
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
		if w := s.OpenReport().Warnings; len(w) != 0 {
			t.Errorf("warnings on a new store: %q", w)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}

	dir := filepath.Join(t.TempDir(), "store")
	fill(Options{Dir: dir, MaxShardBytes: 16 << 10})
	got := modes(dir)
	for name, m := range got {
		want := os.FileMode(0o600)
		if name == "." {
			want = 0o700
		}
		if m != want {
			t.Errorf("default modes: %s is %04o, want %04o", name, m, want)
		}
	}
	if len(got) < 4 { // ., LOCK, a shard, index files
		t.Fatalf("modes: %v", got)
	}

	wide := filepath.Join(t.TempDir(), "store")
	fill(Options{Dir: wide, Perm: 0o640})
	for name, m := range modes(wide) {
		want := os.FileMode(0o640)
		if name == "." {
			want = 0o750
		}
		if m&^0o022 != want&^0o022 || m&0o077 == 0 { // the umask may narrow, not widen
			t.Errorf("Perm 0640: %s is %04o, want %04o", name, m, want)
		}
	}

	// A store an older version made: directory 0755, files 0644.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shard := shardPath(dir, 0)
	if err := os.Chmod(shard, 0o644); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, Options{Dir: dir, MaxShardBytes: 16 << 10})
	w := strings.Join(s.OpenReport().Warnings, "\n")
	s.Close()
	if !strings.Contains(w, dir+" has mode 0755") || !strings.Contains(w, "shard-00000.mtdb 0644") {
		t.Fatalf("warnings for a 0755/0644 store: %q", w)
	}
	if m := modes(dir); m["."] != 0o755 || m["shard-00000.mtdb"] != 0o644 {
		t.Fatalf("Open changed the modes: %v", m)
	}
}
