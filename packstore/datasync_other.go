//go:build !linux

package packstore

// Datasync is fsync where fdatasync is not wired up.
func (f osFile) Datasync() error { return f.Sync() }
