package gen

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Generate simulates one room with opts and writes it to dir. progress, if set, is
// called with the number of events created so far. The files are written to a
// new directory beside dir and renamed to dir at the end (see publish): a run that
// fails or is killed leaves no partial room at dir, and of two runs on one dir the
// second to finish fails.
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
	var meta *Meta
	err = publish(dir, func(tmp string) (err error) {
		meta, err = r.write(tmp, filepath.Base(dir))
		return err
	})
	return meta, err
}

// publish has write fill a new directory beside dir (".<name>.gen-*", removed if
// anything fails) and renames it to dir, which must not exist or be empty.
func publish(dir string, write func(tmp string) error) error {
	dir = filepath.Clean(dir)
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".gen-")
	if err != nil {
		return err
	}
	if err := write(tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	// os.Rename refuses an existing directory: remove dir if it is empty (Remove
	// fails on one with files; of two runs, the second's Rename then fails).
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		os.RemoveAll(tmp)
		return fmt.Errorf("gen: %s: %w (another run's output?)", dir, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("gen: %s: %w (another run's output?)", dir, err)
	}
	return nil
}

// RoomName is the directory name of room i of a multi-room run.
func RoomName(i int) string { return fmt.Sprintf("room%03d", i+1) }
