// Package roomstatetest opens the stores that tests of roomstate, and of the
// packages above it, import rooms into.
package roomstatetest

import (
	"context"
	"testing"

	"github.com/mtxdb/mtxdb/hamtstore"
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

// Entries returns the snapshot root of room as "type\x00state_key" -> event ID,
// the form tests compare with other servers' state maps.
func Entries(ctx context.Context, room *roomstate.Room, rd *hamtstore.Reader, root hamtstore.NodeID) (map[string]string, error) {
	m, err := room.State(ctx, rd, root)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(m))
	for k, id := range m {
		out[k.Type+"\x00"+k.StateKey] = id
	}
	return out, nil
}
