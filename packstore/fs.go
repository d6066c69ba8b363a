package packstore

import (
	"fmt"
	"io"
	"os"

	"github.com/edsrzf/mmap-go"
)

// vfs is the small filesystem the engine does all its I/O through, so that
// tests can inject faults (short writes, ENOSPC, fsync and rename errors, a
// crash that drops unsynced bytes; see faultfs_test.go). osFS is the real
// one. Implementations must be safe for concurrent use.
type vfs interface {
	OpenFile(name string, flag int, perm os.FileMode) (vfile, error)
	Remove(name string) error
	Rename(oldpath, newpath string) error
	ReadDir(dir string) ([]os.DirEntry, error)
	MkdirAll(dir string, perm os.FileMode) error
	// SyncDir fsyncs a directory, making creations, renames and removals
	// in it durable.
	SyncDir(dir string) error
}

// vfile is an open file of a vfs. ReadAt may be called concurrently with
// everything; the other methods are called by the single writer.
type vfile interface {
	io.ReaderAt
	io.WriterAt
	Sync() error
	Truncate(size int64) error
	Close() error
	Size() (int64, error)
	// Map maps the first size bytes read-only.
	Map(size int) (mmap.MMap, error)
}

// datasyncer is a vfile with fdatasync(2).
type datasyncer interface{ Datasync() error }

// datasync fdatasyncs f if it can, else fsyncs it.
func datasync(f vfile) error {
	if d, ok := f.(datasyncer); ok {
		return d.Datasync()
	}
	return f.Sync()
}

// osFS is the operating system's filesystem.
type osFS struct{}

type osFile struct{ *os.File }

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (vfile, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) Remove(name string) error                    { return os.Remove(name) }
func (osFS) Rename(oldpath, newpath string) error        { return os.Rename(oldpath, newpath) }
func (osFS) ReadDir(dir string) ([]os.DirEntry, error)   { return os.ReadDir(dir) }
func (osFS) MkdirAll(dir string, perm os.FileMode) error { return os.MkdirAll(dir, perm) }

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (f osFile) Size() (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func (f osFile) Map(size int) (mmap.MMap, error) {
	return mmap.MapRegion(f.File, size, mmap.RDONLY, 0, 0)
}

// pathless returns err without the *os.PathError (or, from a rename,
// *os.LinkError) the os package wraps it in. That names the file as it was
// opened, which for a file published through publishFile is its temporary
// name, gone since the rename (or removed after the failure); callers name
// the file themselves.
func pathless(err error) error {
	switch e := err.(type) {
	case *os.PathError:
		return e.Err
	case *os.LinkError:
		return e.Err
	}
	return err
}

// syncDir fsyncs dir through fs, naming it in the error.
func syncDir(fs vfs, dir string) error {
	if err := fs.SyncDir(dir); err != nil {
		return fmt.Errorf("packstore: fsync %s: %w", dir, err)
	}
	return nil
}
