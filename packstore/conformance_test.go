package packstore_test

import (
	"errors"
	"testing"

	"github.com/mtxdb/mtxdb/internal/storage/enginetest"
	"github.com/mtxdb/mtxdb/packstore"
)

// The interface conformance suite (package enginetest, which pgstore runs too)
// on both engines of this package.

func TestConformancePackfile(t *testing.T) {
	open := func(t *testing.T, dir string) enginetest.Engine {
		o := packstore.DefaultOptions(dir)
		o.MaxShardBytes = 64 << 10
		s, err := packstore.Open(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := s.Check(); errors.Is(err, packstore.ErrClosed) {
				return
			} else if err != nil {
				t.Errorf("Check: %v", err)
			}
			s.Close()
		})
		return s
	}
	dirs := map[enginetest.Engine]string{}
	enginetest.Run(t, func(t *testing.T) enginetest.Engine {
		dir := t.TempDir()
		e := open(t, dir)
		dirs[e] = dir
		return e
	}, func(t *testing.T, e enginetest.Engine) enginetest.Engine {
		if err := e.(*packstore.PackfileStorage).Check(); err != nil {
			t.Fatalf("Check before reopen: %v", err)
		}
		if err := e.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		n := open(t, dirs[e])
		dirs[n] = dirs[e]
		return n
	})
}

func TestConformanceMem(t *testing.T) {
	enginetest.Run(t, func(t *testing.T) enginetest.Engine { return packstore.NewMemStorage() }, nil)
}
