package packstore

import (
	"errors"
	"fmt"

	"github.com/mtxdb/mtxdb/internal/storage"
)

// Errors returned by reads.
var (
	// ErrNotFound is returned by Get when the collection holds no record with
	// the requested ID (storage.ErrNotFound: every engine returns it).
	ErrNotFound = storage.ErrNotFound
)

// Errors returned by writes.
var (
	// ErrShardLimit is returned when a write would need a new shard while
	// all 4096 pack IDs (the index slot has 12 bits for the shard) are held
	// by shards that are still referenced; retired shards free theirs, and
	// the write first retires any shard nothing references. Nothing of the
	// failing batch is written.
	ErrShardLimit = errors.New("packstore: shard limit reached (4096 shards)")
	// ErrTooLarge is returned when a payload cannot fit in one shard
	// (Options.MaxShardBytes minus the shard header and the frame overhead).
	ErrTooLarge = errors.New("packstore: record too large for a shard")
	// ErrReadOnly is returned by Put, PutMany, DeleteCollection and Repack
	// on a store opened with Options.ReadOnly (storage.ErrReadOnly, which
	// pgstore returns too).
	ErrReadOnly = storage.ErrReadOnly
	// ErrRepackApplied is wrapped (together with the cause) by the error
	// Repack returns when the repack has taken effect, its copies and reset
	// markers durable and its new index live, but a later step failed:
	// retiring the shards it emptied, or writing the index checkpoint or
	// delta. The returned RepackStats is complete; what was left undone
	// costs disk space or a longer next Open, never records, and the next
	// Repack, Sync or Close retries it. A Repack error that does not match
	// ErrRepackApplied left the in-memory index as it was.
	ErrRepackApplied = errors.New("packstore: repack applied, but a later step failed")
	// ErrConflict is storage.ErrConflict, returned (wrapped) by
	// ConditionalPutter.PutManyIf when another writer changed the condition
	// record first.
	ErrConflict = storage.ErrConflict
)

// Errors returned by any operation.
var (
	// ErrClosed is returned by every operation after Close
	// (storage.ErrClosed).
	ErrClosed = storage.ErrClosed
	// ErrCorrupt marks corruption found on disk. Errors carrying it are
	// wrapped as "packstore: corrupt data: shard N (file) offset O: what"
	// and are recognised by IsCorruption (storage.ErrCorrupt).
	ErrCorrupt = storage.ErrCorrupt
)

// IsCorruption reports whether err (or any error it wraps) marks on-disk
// corruption.
func IsCorruption(err error) bool { return errors.Is(err, ErrCorrupt) }

// RepackCorruptError is the error of a Repack that met a corrupt frame while
// copying the records of Collection; the repack changed nothing (the copies
// written are removed), so the caller may leave that collection out of the
// plan and repack the others. It wraps Err (IsCorruption holds).
type RepackCorruptError struct {
	Collection ID
	Err        error
}

// Error names the collection and the corruption.
func (e *RepackCorruptError) Error() string {
	return fmt.Sprintf("collection %s: %v", e.Collection, e.Err)
}

// Unwrap returns the corruption error.
func (e *RepackCorruptError) Unwrap() error { return e.Err }
