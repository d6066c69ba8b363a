//go:build linux

package packstore

import "golang.org/x/sys/unix"

// Datasync is fdatasync(2), retried on EINTR.
func (f osFile) Datasync() error {
	for {
		err := unix.Fdatasync(int(f.Fd()))
		if err != unix.EINTR {
			return err
		}
	}
}
