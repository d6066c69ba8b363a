//go:build linux

package packstore

import "golang.org/x/sys/unix"

// madvise is unix.Madvise; a variable so that tests can inject its failure.
var madvise = unix.Madvise

const (
	madvRandom     = unix.MADV_RANDOM
	madvSequential = unix.MADV_SEQUENTIAL
	madvWillneed   = unix.MADV_WILLNEED
	madvDontneed   = unix.MADV_DONTNEED
)
