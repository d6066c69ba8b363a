package gen

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Generate simulates one room with opts and writes it to dir. progress, if set, is
// called with the number of events created so far. The files are written to a
// new directory beside dir and renamed to dir at the end (see publish): a run that
// fails or is killed leaves no partial room at dir, and of two runs on one dir the
// second to finish fails.
func Generate(opts Options, dir string, progress func(done int)) (*Meta, error) {
	return GenerateProgress(opts, dir, Progress{Events: progress})
}

// Progress receives a run's progress; either function may be nil.
type Progress struct {
	// Events is called with the number of events created so far.
	Events func(done int)
	// Reference is called, from several goroutines one at a time, with the
	// number of events the reference implementation has checked and the number
	// it checks (reference.go).
	Reference func(done, total int)
}

// GenerateProgress is Generate with progress reports of both phases.
func GenerateProgress(opts Options, dir string, progress Progress) (*Meta, error) {
	if err := opts.normalise(); err != nil {
		return nil, err
	}
	r, err := newRoom(opts)
	if err != nil {
		return nil, err
	}
	name := filepath.Base(dir)
	if abs, err := outPath(dir); err == nil {
		name = filepath.Base(abs) // "--out ." names the directory, not "."
	}
	var meta *Meta
	err = publish(dir, func(tmp string) (err error) {
		defer r.closeLines()
		if err := r.run(tmp, progress.Events); err != nil {
			return err
		}
		r.refProgress = progress.Reference
		if err := r.check(); err != nil {
			return err
		}
		meta, err = r.write(tmp, name)
		return err
	})
	return meta, err
}

// check chooses the events expected_state.jsonl records, rebuilds the states
// the files and the reference read (materializeFor) and, unless
// Options.NoReference, computes their states with the reference implementation
// (reference.go).
func (r *room) check() error {
	r.sample()
	r.materializeFor()
	if r.opts.NoReference {
		return nil
	}
	if err := r.reference(r.sampled); err != nil {
		return err
	}
	r.refDone = true
	return nil
}

// publish has write fill a new directory beside dir (".<name>.gen-<pid>-*",
// removed if anything fails) and renames it to dir, which must not exist or be an
// empty directory (whose permissions the room keeps). A symlink is followed.
// Directories of earlier runs killed before they finished (their process is
// gone) are removed first; TempDirs names this process's, for a signal handler.
func publish(dir string, write func(tmp string) error) error {
	dir, err := outPath(dir)
	if err != nil {
		return err
	}
	mode := fs.FileMode(0o755)
	if fi, err := os.Stat(dir); err == nil {
		mode = fi.Mode().Perm()
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	removeStale(dir)
	tmp, err := os.MkdirTemp(parent, fmt.Sprintf(".%s.gen-%d-", filepath.Base(dir), os.Getpid()))
	if err != nil {
		return err
	}
	if err := write(tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	// os.Rename refuses an existing directory: remove dir if it is empty (Remove
	// fails on one with files; of two runs, the second's Rename then fails).
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		os.RemoveAll(tmp)
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("gen: %s: %w (another run's output?)", dir, err)
		}
		return fmt.Errorf("gen: cannot replace the empty directory %s (%w): give a path that does not exist yet", dir, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("gen: %s: %w (another run's output?)", dir, err)
	}
	return nil
}

// TempDirs returns the directories this process is writing beside dir (for a
// caller that exits on a signal and removes them).
func TempDirs(dir string) []string {
	abs, err := outPath(dir)
	if err != nil {
		return nil
	}
	m, _ := filepath.Glob(filepath.Join(filepath.Dir(abs), fmt.Sprintf(".%s.gen-%d-*", filepath.Base(abs), os.Getpid())))
	return m
}

// outPath is the directory a room for dir is published at: dir made absolute, a
// symlink followed.
func outPath(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if fi, err := os.Lstat(dir); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		if dir, err = filepath.EvalSymlinks(dir); err != nil {
			return "", fmt.Errorf("gen: %w", err)
		}
	}
	return dir, nil
}

// removeStale removes the ".<name>.gen-<pid>-*" directories beside dir whose
// process no longer runs (killed runs).
func removeStale(dir string) {
	m, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+".gen-*"))
	for _, p := range m {
		rest := strings.TrimPrefix(filepath.Base(p), "."+filepath.Base(dir)+".gen-")
		pid, err := strconv.Atoi(rest[:max(0, strings.IndexByte(rest, '-'))])
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(p)
		}
	}
}

// RoomName is the directory name of room i of a multi-room run.
func RoomName(i int) string { return fmt.Sprintf("room%03d", i+1) }
