package packstore

import (
	"bytes"
	"encoding/hex"
)

// ID is a 16-byte identifier: a collection ID or a record ID. packstore does
// not derive IDs; callers supply them.
type ID [16]byte

// String returns the ID as 32 lowercase hex digits.
func (id ID) String() string { return hex.EncodeToString(id[:]) }

// Compare orders IDs bytewise; it returns -1, 0 or +1.
func (id ID) Compare(o ID) int { return bytes.Compare(id[:], o[:]) }

// Record is one record of a collection: its ID and its opaque payload.
type Record struct {
	ID   ID
	Data []byte
	// Dense marks data made mostly of hashes and IDs (HAMT nodes): the packfile
	// engine compresses it without zstd's entropy stage, whose Huffman tables
	// cannot shrink such bytes (the frames come out byte-identical; measured on
	// 63,092 nodes of a 20,000-member state) and which cost three quarters of the
	// encode time. A hint only: the stored bytes and format are the same either
	// way, and other engines ignore it.
	Dense bool
}

// StorageEngine is the interface every storage engine implements: every
// operation is scoped to one collection.
//
// Writing an ID that already exists in the collection (Put or PutMany)
// SUPERSEDES it: the newest write wins and the old frame becomes garbage,
// reclaimed by a later repack. Within one PutMany batch, the last occurrence
// of an ID wins.
//
// Implementations in this package are safe for concurrent use by multiple
// goroutines.
type StorageEngine interface {
	// Get returns an owned copy of the record's payload, or ErrNotFound.
	Get(coll, id ID) ([]byte, error)
	// GetMany returns one entry per requested ID, in request order; an entry
	// is nil when the record is absent. Physical reads are issued in
	// (shard, offset) order. A record that cannot be read does not fail the
	// batch: the others are returned with a *RecordErrors naming it.
	GetMany(coll ID, ids []ID) ([][]byte, error)
	// Put appends one record (superseding an existing record of that ID).
	Put(coll, id ID, data []byte) error
	// PutMany appends the records as one append batch.
	PutMany(coll ID, recs []Record) error
	// DeleteCollection logically deletes every record of the collection.
	DeleteCollection(coll ID) error
	// Sync makes every write that returned before it durable.
	Sync() error
	// RefreshCollection re-reads a collection's state from disk.
	RefreshCollection(coll ID) error
	// Collections returns the IDs of collections holding at least one live
	// record, sorted bytewise.
	Collections() []ID
	// Close releases all resources; later calls return ErrClosed.
	Close() error
}

// ConditionalPutter is implemented by engines that several processes write at
// once (pgstore): PutManyIf writes recs as one atomic PutMany only if the
// record cond of coll still holds exactly old (nil old: cond must be absent);
// recs must include cond's new value. Otherwise nothing is written and the
// error wraps ErrConflict. Mutable records (a room head, a NID counter) go
// through it so two writers never lose an update. Engines without it
// (PackfileStorage, MemStorage) have one writer per store (the directory
// lock), and callers use PutMany.
type ConditionalPutter interface {
	PutManyIf(coll ID, recs []Record, cond ID, old []byte) error
}

var (
	_ StorageEngine = (*PackfileStorage)(nil)
	_ StorageEngine = (*MemStorage)(nil)
)

// CollectionPlan lists, in output order, the records of one collection that
// a repack keeps (see PackfileStorage.Repack). Records not listed are dropped.
type CollectionPlan struct {
	Collection ID
	Records    []ID
}

// RepackPlan is a batch of collection plans executed through one output
// stream. A collection may appear at most once and a record at most once
// within its collection plan.
type RepackPlan struct {
	Collections []CollectionPlan
}

// RepackStats reports what a repack did.
type RepackStats struct {
	CollectionsRepacked int   // collection plans executed
	RecordsCopied       int   // records written to the output stream
	BytesCopied         int64 // frame bytes written (MemStorage: payload bytes)
	ShardsRetired       int   // shard files deleted
	BytesRetired        int64 // size of the deleted shard files
	RecordsDropped      int   // live records of repacked collections not listed
}

// Stats is a point-in-time summary of a PackfileStorage.
type Stats struct {
	Shards        int    // shard files on disk
	DiskBytes     int64  // sum of shard file sizes
	Collections   int    // collections with at least one live record
	LiveRecords   int    // records reachable through the indexes
	LiveBytes     int64  // frame bytes (framing included) of the live records
	TagCollisions uint64 // index tag matches whose frame held another ID
}
