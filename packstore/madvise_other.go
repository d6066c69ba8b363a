//go:build !linux

package packstore

// madvise is a no-op outside Linux: the read-ahead hints were measured there
// only (Options.ReadAhead).
var madvise = func(b []byte, advice int) error { return nil }

const (
	madvRandom     = 0
	madvSequential = 0
	madvWillneed   = 0
	madvDontneed   = 0
)
