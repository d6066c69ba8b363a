// Package testrooms holds room histories for tests, the demo and benchmarks:
// real/ holds 190 anonymised real rooms (see real/README.md for their source
// note; each room's meta.json names the repository, path and commit it came
// from), peer/ruma Ruma's state-resolution vectors, gen/ the room generator and
// smallroom/ random small rooms for the differential fuzzer. Each room
// directory has the layout package recorded reads (events.jsonl,
// expected_state.jsonl, current_state.json, meta.json).
package testrooms

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
)

// Dir returns the testrooms directory of this source tree (for tests and the demo
// run from a checkout).
func Dir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "testrooms"
	}
	return filepath.Dir(file)
}

// ImportReplayed imports a room directory's events.jsonl into eng and replays it:
// the set-up most end-to-end tests share. It returns the (single) room imported.
func ImportReplayed(eng packstore.StorageEngine, dir string) (*roomstate.Room, error) {
	f, err := os.Open(filepath.Join(dir, "events.jsonl"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ctx := context.Background()
	st := roomstate.New(eng)
	res, err := st.Import(ctx, f, dir, roomstate.ImportOptions{})
	if err != nil {
		return nil, err
	}
	if len(res.Rooms) != 1 {
		return nil, fmt.Errorf("testrooms: %s holds %d rooms, want 1", dir, len(res.Rooms))
	}
	room, err := st.Room(ctx, res.Rooms[0])
	if err != nil {
		return nil, err
	}
	if _, err := resolver.Replay(ctx, room, resolver.ReplayOptions{}); err != nil {
		return nil, err
	}
	return room, nil
}
