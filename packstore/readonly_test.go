package packstore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/mtxdb/mtxdb/internal/dirsum"
)

// TestReadOnlyOpenChangesNothing: with the index files
// gone and a torn tail on the last shard (half a frame, as a crash mid-write
// leaves), a read-only Open serves every whole frame, reports the tail
// without cutting it, writes no file (not even LOCK's pid, nor a
// checkpoint at Close), refuses writes with ErrReadOnly, shares its lock
// with other read-only opens and excludes a read-write one. A read-write
// Open afterwards cuts the tail.
func TestReadOnlyOpenChangesNothing(t *testing.T) {
	dir, opts := filledStore(t)
	for _, f := range []string{checkpointFile, deltaFile} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	frame := appendFrameCRC(nil, 0, 500, ID{1}, idN(2, 60), bytes.Repeat([]byte{60}, 500), true)
	last, _ := filepath.Glob(filepath.Join(dir, "shard-*.mtdb"))
	f, err := os.OpenFile(last[len(last)-1], os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(frame[:300]); err != nil {
		t.Fatal(err)
	}
	f.Close()
	before := dirsum.Must(t, dir)

	ro := opts
	ro.ReadOnly = true
	s := openStore(t, ro)
	r := s.OpenReport()
	if !r.TailNotCut || r.TruncatedBytes != 300 || r.TruncatedFile != filepath.Base(last[len(last)-1]) {
		t.Fatalf("OpenReport: TailNotCut %v, %d bytes of %s at %d", r.TailNotCut, r.TruncatedBytes, r.TruncatedFile, r.TruncatedAt)
	}
	for i := range 60 {
		mustGet(t, s, ID{1}, idN(2, i), bytes.Repeat([]byte{byte(i)}, 500))
	}
	mustCheck(t, s)
	for what, err := range map[string]error{
		"Put":              s.Put(ID{1}, idN(2, 99), []byte("x")),
		"DeleteCollection": s.DeleteCollection(ID{1}),
		"Repack":           func() error { _, err := s.Repack(RepackPlan{}); return err }(),
	} {
		if !errors.Is(err, ErrReadOnly) {
			t.Errorf("%s on a read-only store: %v", what, err)
		}
	}
	if err := s.Sync(); err != nil {
		t.Errorf("Sync on a read-only store: %v", err)
	}
	s2, err := Open(ro)
	if err != nil {
		t.Fatalf("second read-only Open: %v", err)
	}
	if _, err := Open(opts); !errors.Is(err, ErrLocked) {
		t.Fatalf("read-write Open beside a read-only one: %v", err)
	}
	s2.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if after := dirsum.Must(t, dir); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("a read-only open changed the store:\nbefore %v\nafter  %v", before, after)
	}

	s = openStore(t, opts)
	if _, err := Open(ro); !errors.Is(err, ErrLocked) {
		t.Fatalf("read-only Open beside a read-write one: %v", err)
	}
	if r := s.OpenReport(); r.TailNotCut || r.TruncatedBytes != 300 {
		t.Fatalf("read-write Open after: TailNotCut %v, cut %d bytes", r.TailNotCut, r.TruncatedBytes)
	}
	s.Close()
}
