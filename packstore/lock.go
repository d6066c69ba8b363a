package packstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// lockFile is the name of the advisory lock file in a store directory.
const lockFile = "LOCK"

// ErrLocked is returned by Open when another PackfileStorage, in this or
// another process, holds the store directory. The error Open returns reads
// "packstore: store DIR is in use by another process (pid N)" and matches
// ErrLocked with errors.Is.
var ErrLocked = errors.New("packstore: store is in use by another process")

// lockedError is ErrLocked with the directory and the holder's pid.
type lockedError struct {
	dir string
	pid int // 0 when the LOCK file holds no readable pid, or the holders are readers
	// readers: the holders are read-only opens (a shared lock), which write no
	// pid: the LOCK file's pid is then the last writer's, not a holder's.
	readers bool
}

func (e *lockedError) Error() string {
	if e.readers {
		return fmt.Sprintf("packstore: store %s is in use by another process reading it (a read-only open: mtxdb verify, stats, state or rooms)", e.dir)
	}
	if e.pid == 0 {
		return fmt.Sprintf("packstore: store %s is in use by another process", e.dir)
	}
	if e.pid == os.Getpid() { // flock is per open file: a second Open in one process
		return fmt.Sprintf("packstore: store %s is already open in this process (pid %d); close it first", e.dir, e.pid)
	}
	return fmt.Sprintf("packstore: store %s is in use by another process (pid %d)", e.dir, e.pid)
}

func (e *lockedError) Is(target error) bool { return target == ErrLocked }

// dirLock is an exclusive flock(2) on dir/LOCK, held for the life of a
// PackfileStorage. It is taken before Open looks at any other file, so that
// two processes never recover, truncate or append to the same store. flock
// locks belong to the open file description: a second Open in the same
// process conflicts too, and the kernel drops the lock when the process
// dies (kill -9 included), so a stale LOCK file never blocks a later Open.
type dirLock struct{ f *os.File }

// lockDir takes the lock without waiting and writes this process's pid
// into the LOCK file (for the holder's identity in ErrLocked only; the
// lock itself is the flock). With shared (a read-only open) it opens an
// existing LOCK read-only, takes a shared lock and writes nothing; without
// a LOCK file it takes no lock (nil, nil). A new LOCK file gets mode perm.
func lockDir(dir string, shared bool, perm os.FileMode) (*dirLock, error) {
	path := filepath.Join(dir, lockFile)
	flag, how := os.O_RDWR|os.O_CREATE, unix.LOCK_EX
	if shared {
		if _, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("packstore: read-only open: %w", err)
		}
		flag, how = os.O_RDONLY, unix.LOCK_SH
	}
	f, err := os.OpenFile(path, flag, perm)
	if shared && errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("packstore: lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			if !shared && onlyReaders(path) {
				return nil, &lockedError{dir: dir, readers: true}
			}
			b, _ := os.ReadFile(path)
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			return nil, &lockedError{dir: dir, pid: pid}
		}
		return nil, fmt.Errorf("packstore: lock %s: %w", path, err)
	}
	if shared {
		return &dirLock{f: f}, nil
	}
	pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt(pid, 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("packstore: lock %s: %w", path, err)
	}
	return &dirLock{f: f}, nil
}

// release drops the lock. The LOCK file stays (removing it would race with
// a process that has just opened it).
func (l *dirLock) release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// onlyReaders reports whether the lock on path that refused an exclusive lock
// is held shared only (read-only opens): a shared lock is then granted.
func onlyReaders(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB) != nil {
		return false
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return true
}
