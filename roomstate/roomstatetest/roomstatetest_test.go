package roomstatetest

import (
	"errors"
	"testing"

	"github.com/mtxdb/mtxdb/packstore"
)

// TestOpen: a store opened in a test is written, closed by the test, opened
// again on the same directory with what was written, and closed at the end.
func TestOpen(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	var second *packstore.PackfileStorage
	t.Run("use", func(t *testing.T) {
		eng, st := Open(t, dir)
		if rooms, err := st.Rooms(ctx); err != nil || len(rooms) != 0 {
			t.Fatalf("a new store's rooms: %d, %v", len(rooms), err)
		}
		if err := eng.Put(packstore.ID{1}, packstore.ID{2}, []byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := eng.Close(); err != nil {
			t.Fatal(err)
		}
		second, _ = Open(t, dir)
		if got, err := second.Get(packstore.ID{1}, packstore.ID{2}); err != nil || string(got) != "x" {
			t.Fatalf("reopened store: Get = %q, %v", got, err)
		}
	})
	if _, err := second.Get(packstore.ID{1}, packstore.ID{2}); !errors.Is(err, packstore.ErrClosed) {
		t.Fatalf("after the test: Get = %v, want ErrClosed (closed at cleanup)", err)
	}
}
