// Package roomstatetest opens the stores that tests of roomstate, and of the
// packages above it, import rooms into.
package roomstatetest

import (
	"testing"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomstate"
)

// Open opens the packfile store in dir, creating it, with packstore's
// DefaultOptions, and returns it with the roomstate.Store over it; t fails when
// the store does not open. The engine is closed when the test ends (its error
// ignored): a test may close it before, to open dir again.
func Open(t testing.TB, dir string) (*packstore.PackfileStorage, *roomstate.Store) {
	t.Helper()
	eng, err := packstore.Open(packstore.DefaultOptions(dir))
	if err != nil {
		t.Fatalf("open store %s: %v", dir, err)
	}
	t.Cleanup(func() { eng.Close() })
	return eng, roomstate.New(eng)
}
