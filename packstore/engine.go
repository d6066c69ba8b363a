package packstore

import "github.com/mtxdb/mtxdb/internal/storage"

// The types every engine shares are defined in package storage
// (github.com/mtxdb/mtxdb/internal/storage), which imports only the standard
// library; these aliases are their names for packstore's users.
type (
	// ID is a 16-byte identifier: a collection ID or a record ID. packstore
	// does not derive IDs; callers supply them.
	ID = storage.ID
	// Record is one record of a collection: its ID, its opaque payload and
	// the Dense hint (compress without zstd's entropy stage).
	Record = storage.Record
	// StorageEngine is the interface every storage engine implements; every
	// operation is scoped to one collection, and writing an existing ID
	// supersedes it (storage.Engine has the contract).
	StorageEngine = storage.Engine
	// ConditionalPutter is implemented by engines that several processes
	// write at once (pgstore): PutManyIf is PutMany under a compare-and-set
	// of one record (storage.ConditionalPutter).
	ConditionalPutter = storage.ConditionalPutter
	// CollectionPlan lists, in output order, the records of one collection
	// that a repack keeps (see PackfileStorage.Repack).
	CollectionPlan = storage.CollectionPlan
	// RepackPlan is a batch of collection plans executed through one output
	// stream.
	RepackPlan = storage.RepackPlan
	// RepackStats reports what a repack did.
	RepackStats = storage.RepackStats
	// RepackMissingError is the error of a Repack whose plan lists a record
	// the collection does not hold; it wraps ErrNotFound
	// (storage.RepackMissingError).
	RepackMissingError = storage.RepackMissingError
)

var (
	_ StorageEngine = (*PackfileStorage)(nil)
	_ StorageEngine = (*MemStorage)(nil)
)

// Stats is a point-in-time summary of a PackfileStorage.
type Stats struct {
	Shards        int    // shard files on disk
	DiskBytes     int64  // sum of shard file sizes
	Collections   int    // collections with at least one live record
	LiveRecords   int    // records reachable through the indexes
	LiveBytes     int64  // frame bytes (framing included) of the live records
	TagCollisions uint64 // index tag matches whose frame held another ID
}
