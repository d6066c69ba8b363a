package gen

import (
	"fmt"
	"path/filepath"
)

// Generate simulates one room with opts and writes it to dir. progress, if set, is
// called with the number of events created so far.
func Generate(opts Options, dir string, progress func(done int)) (*Meta, error) {
	if err := opts.normalise(); err != nil {
		return nil, err
	}
	r, err := newRoom(opts)
	if err != nil {
		return nil, err
	}
	if err := r.run(progress); err != nil {
		return nil, err
	}
	return r.write(dir, filepath.Base(dir))
}

// RoomName is the directory name of room i of a multi-room run.
func RoomName(i int) string { return fmt.Sprintf("room%03d", i+1) }
