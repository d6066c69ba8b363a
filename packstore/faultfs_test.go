package packstore

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// errCrashed is returned by every faultFS operation after crash().
var errCrashed = errors.New("faultfs: crashed")

// faultFS wraps the real filesystem (so mmap keeps working) and injects
// faults: a write hook that can write a prefix and fail (short write,
// ENOSPC mid-frame), fsync and rename hooks, and a crash that, once the
// store is closed, cuts every file back to its last fsynced size (or a
// chosen length between that and its current size). It also models lost
// directory entries: a creation, rename or removal is durable only once its
// directory is fsynced (SyncDir); the crash undoes the others, newest
// first (a created file vanishes, a renamed file is back under its old
// name, a removed file is back).
type faultFS struct {
	osFS
	mu     sync.Mutex       // guards every field below
	synced map[string]int64 // path -> data end (below) at its last fsync
	// dataEnd is the end of the last write of a nonzero byte: the zeros
	// the writer writes ahead of its frames (preallocLocked) past it are
	// not data, so a crash may lose every write after the last fsync
	// whether or not it only overwrote such zeros.
	dataEnd map[string]int64
	renamed map[string]string // old path of a file renamed while open -> new path
	dirOps  []dirOp           // directory changes not yet made durable by SyncDir
	// ignoreDirSync makes SyncDir succeed without making anything durable
	// (to show that the tests notice a missing directory fsync).
	ignoreDirSync bool
	crashed       bool
	// Hooks; nil means no fault. write returns how many bytes of the
	// write to perform and the error to return after them.
	write  func(path string, off int64, n int) (int, error)
	sync   func(path string) error
	rename func(oldpath, newpath string) error
}

// dirOp is one directory change a crash can undo.
type dirOp struct {
	kind     byte   // 'c' create, 'r' rename, 'd' remove
	path     string // created or removed path; rename target
	old      string // rename source
	prev     []byte // content the rename target or removed file had
	hadPrev  bool
	prevSync int64 // its synced size
}

func newFaultFS() *faultFS {
	return &faultFS{synced: make(map[string]int64), dataEnd: make(map[string]int64), renamed: make(map[string]string)}
}

// name returns the file's current path (it may have been renamed). Callers
// hold fs.mu.
func (f *faultFile) name() string {
	if n, ok := f.fs.renamed[f.path]; ok {
		return n
	}
	return f.path
}

type faultFile struct {
	osFile
	fs   *faultFS
	path string
}

func (fs *faultFS) OpenFile(name string, flag int, perm os.FileMode) (vfile, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.crashed {
		return nil, errCrashed
	}
	_, statErr := os.Stat(name)
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	if statErr != nil && flag&os.O_CREATE != 0 {
		fs.dirOps = append(fs.dirOps, dirOp{kind: 'c', path: name})
		// A new file under a name an earlier file was renamed away from
		// (index.ckpt.tmp, or a shard's .tmp once pack IDs are reused) is
		// not that file: its fsyncs count under its own name.
		delete(fs.renamed, name)
	}
	if _, ok := fs.synced[name]; !ok || flag&os.O_TRUNC != 0 {
		fi, _ := f.Stat()
		fs.synced[name] = fi.Size()
		if flag&os.O_CREATE != 0 && flag&os.O_TRUNC != 0 {
			fs.synced[name] = 0
		}
	}
	if _, ok := fs.dataEnd[name]; !ok || flag&os.O_TRUNC != 0 {
		fi, _ := f.Stat()
		fs.dataEnd[name] = fi.Size()
	}
	return &faultFile{osFile: osFile{f}, fs: fs, path: name}, nil
}

func (fs *faultFS) Rename(oldpath, newpath string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.crashed {
		return errCrashed
	}
	if fs.rename != nil {
		if err := fs.rename(oldpath, newpath); err != nil {
			return err
		}
	}
	op := dirOp{kind: 'r', path: newpath, old: oldpath}
	if b, err := os.ReadFile(newpath); err == nil {
		op.prev, op.hadPrev, op.prevSync = b, true, fs.synced[newpath]
	}
	if err := os.Rename(oldpath, newpath); err != nil {
		return err
	}
	fs.dirOps = append(fs.dirOps, op)
	fs.synced[newpath] = fs.synced[oldpath]
	delete(fs.synced, oldpath)
	fs.dataEnd[newpath] = fs.dataEnd[oldpath]
	delete(fs.dataEnd, oldpath)
	fs.renamed[oldpath] = newpath
	return nil
}

func (fs *faultFS) Remove(name string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.crashed {
		return errCrashed
	}
	op := dirOp{kind: 'd', path: name}
	if b, err := os.ReadFile(name); err == nil {
		op.prev, op.hadPrev, op.prevSync = b, true, fs.synced[name]
	}
	if err := os.Remove(name); err != nil {
		return err
	}
	delete(fs.synced, name)
	delete(fs.dataEnd, name)
	fs.dirOps = append(fs.dirOps, op)
	return nil
}

func (fs *faultFS) SyncDir(dir string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.crashed {
		return errCrashed
	}
	if fs.ignoreDirSync {
		return nil
	}
	kept := fs.dirOps[:0]
	for _, op := range fs.dirOps {
		if filepath.Dir(op.path) != filepath.Clean(dir) {
			kept = append(kept, op)
		}
	}
	fs.dirOps = kept
	return nil
}

// undoDirOpsLocked reverts the directory changes no SyncDir made durable,
// newest first. Callers hold fs.mu.
func (fs *faultFS) undoDirOpsLocked() error {
	restore := func(op dirOp) error {
		if !op.hadPrev {
			return nil
		}
		fs.synced[op.path] = op.prevSync
		return os.WriteFile(op.path, op.prev, 0o644)
	}
	for i := len(fs.dirOps) - 1; i >= 0; i-- {
		op := fs.dirOps[i]
		var err error
		switch op.kind {
		case 'c':
			delete(fs.synced, op.path)
			if err = os.Remove(op.path); os.IsNotExist(err) {
				err = nil
			}
		case 'r':
			if err = os.Rename(op.path, op.old); err == nil {
				fs.synced[op.old] = fs.synced[op.path]
				delete(fs.synced, op.path)
				err = restore(op)
			}
		case 'd':
			err = restore(op)
		}
		if err != nil {
			return err
		}
	}
	fs.dirOps = nil
	return nil
}

func (f *faultFile) WriteAt(b []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	if f.fs.crashed {
		f.fs.mu.Unlock()
		return 0, errCrashed
	}
	hook, name := f.fs.write, f.name()
	f.fs.mu.Unlock()
	if hook != nil {
		if n, err := hook(name, off, len(b)); err != nil {
			n, _ = f.osFile.WriteAt(b[:n], off)
			f.noteWrite(b[:n], off)
			// As an os.File's error: it names the file as it was opened.
			return n, &os.PathError{Op: "write", Path: f.path, Err: err}
		}
	}
	n, err := f.osFile.WriteAt(b, off)
	f.noteWrite(b[:n], off)
	return n, err
}

// noteWrite advances the file's data end past a written nonzero byte.
func (f *faultFile) noteWrite(b []byte, off int64) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if end := off + int64(len(b)); !allZero(b) && end > f.fs.dataEnd[f.name()] {
		f.fs.dataEnd[f.name()] = end
	}
}

// Datasync is Sync: the fault model does not tell them apart (and an
// osFile's Datasync would bypass it).
func (f *faultFile) Datasync() error { return f.Sync() }

func (f *faultFile) Sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.crashed {
		return errCrashed
	}
	if f.fs.sync != nil {
		if err := f.fs.sync(f.name()); err != nil {
			return &os.PathError{Op: "sync", Path: f.path, Err: err}
		}
	}
	if err := f.osFile.Sync(); err != nil {
		return err
	}
	f.fs.synced[f.name()] = f.fs.dataEnd[f.name()]
	return nil
}

func (f *faultFile) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.crashed {
		return errCrashed
	}
	if f.fs.synced[f.name()] > size {
		f.fs.synced[f.name()] = size
	}
	if f.fs.dataEnd[f.name()] > size {
		f.fs.dataEnd[f.name()] = size
	}
	return f.osFile.Truncate(size)
}

// crash makes every later operation fail, as if the machine stopped.
func (fs *faultFS) crash() {
	fs.mu.Lock()
	fs.crashed = true
	fs.mu.Unlock()
}

// applyCrash, after the store was closed, cuts every file back to the
// length keep chooses between its fsynced and its current size (nil keeps
// only fsynced bytes).
func (fs *faultFS) applyCrash(keep func(path string, synced, size int64) int64) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if err := fs.undoDirOpsLocked(); err != nil {
		return err
	}
	for path, synced := range fs.synced {
		fi, err := os.Stat(path)
		if err != nil {
			continue
		}
		n, end := synced, fs.dataEnd[path]
		if keep != nil && end > synced {
			n = keep(path, synced, end)
		}
		if n < fi.Size() {
			if err := os.Truncate(path, n); err != nil {
				return err
			}
		}
	}
	return nil
}

// failOnce returns a write hook that fails the first write to a shard file
// at or after armed() with err after writing frac of its bytes.
func failOnce(err error, frac float64, armed func() bool) func(string, int64, int) (int, error) {
	var once sync.Once
	return func(path string, off int64, n int) (int, error) {
		var fail bool
		if strings.HasSuffix(path, ".mtdb") && armed() {
			once.Do(func() { fail = true })
		}
		if fail {
			return int(float64(n) * frac), err
		}
		return n, nil
	}
}

var errENOSPC = syscall.ENOSPC
