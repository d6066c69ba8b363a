// Package storage holds what every storage engine shares: the record IDs, the
// Engine interface, the repack plan and the sentinel errors. It imports only
// the standard library, so a second engine (pgstore) implements the interface
// without linking the packfile engine's mmap, zstd, ristretto and Prometheus.
//
// packstore re-exports each name (packstore.ID, packstore.StorageEngine,
// packstore.ErrNotFound, ...) as an alias or the same value; code outside this
// repository names them there. The errors keep the "packstore: " prefix of the
// package that documents the engines' contract.
package storage

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
)

// ID is a 16-byte identifier: a collection ID or a record ID. Engines do not
// derive IDs; callers supply them.
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

// Engine is the interface every storage engine implements (packstore's
// PackfileStorage and MemStorage, pgstore's Store): every operation is scoped
// to one collection.
//
// Writing an ID that already exists in the collection (Put or PutMany)
// SUPERSEDES it: the newest write wins and the old record becomes garbage,
// reclaimed by a later repack. Within one PutMany batch, the last occurrence
// of an ID wins.
//
// The implementations in this repository are safe for concurrent use by
// multiple goroutines.
type Engine interface {
	// Get returns an owned copy of the record's payload, or ErrNotFound.
	Get(coll, id ID) ([]byte, error)
	// GetMany returns one entry per requested ID, in request order; an entry
	// is nil when the record is absent. A record that cannot be read does not
	// fail the batch: the others are returned with an error naming it
	// (packstore.RecordErrors for the packfile engine).
	GetMany(coll ID, ids []ID) ([][]byte, error)
	// Put writes one record (superseding an existing record of that ID).
	Put(coll, id ID, data []byte) error
	// PutMany writes the records as one batch.
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

// CollectionPlan lists, in output order, the records of one collection that
// a repack keeps. Records not listed are dropped.
type CollectionPlan struct {
	Collection ID
	Records    []ID
}

// RepackPlan is a batch of collection plans executed as one repack. A
// collection may appear at most once and a record at most once within its
// collection plan.
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

// Errors returned by reads.
var (
	// ErrNotFound is returned by Get when the collection holds no record with
	// the requested ID.
	ErrNotFound = errors.New("packstore: record not found")
)

// RepackMissingError is the error of a Repack whose plan lists records a
// collection does not hold (a damaged frame or index, or a planner that read
// something else): the repack fails before it changes anything. Record is
// the first such record when the engine names one (zero otherwise); Missing
// counts them when the engine counts them (0 otherwise). It wraps
// ErrNotFound.
type RepackMissingError struct {
	Collection, Record ID
	Missing            int
}

// Error names the collection and the record or the count.
func (e *RepackMissingError) Error() string {
	switch {
	case e.Record != ID{}:
		return fmt.Sprintf("repack plan for collection %s lists record %s, which the collection does not hold: %v", e.Collection, e.Record, ErrNotFound)
	case e.Missing > 0:
		return fmt.Sprintf("repack plan for collection %s lists %d records that the collection does not hold: %v", e.Collection, e.Missing, ErrNotFound)
	}
	return fmt.Sprintf("repack plan for collection %s lists records that the collection does not hold: %v", e.Collection, ErrNotFound)
}

// Unwrap returns ErrNotFound.
func (e *RepackMissingError) Unwrap() error { return ErrNotFound }

// Errors returned by writes.
var (
	// ErrReadOnly is returned by the writes of a store opened read-only.
	ErrReadOnly = errors.New("packstore: store opened read-only")
	// ErrConflict is returned (wrapped) by ConditionalPutter.PutManyIf when the
	// condition record no longer holds what the caller read: another writer
	// changed it first. Nothing of the batch is written; re-read and retry.
	ErrConflict = errors.New("packstore: record changed by another writer")
)

// Errors returned by any operation.
var (
	// ErrClosed is returned by every operation after Close.
	ErrClosed = errors.New("packstore: storage closed")
	// ErrCorrupt marks corrupt stored data; an engine wraps it with what it
	// found and where ("packstore: corrupt data: shard N (file) offset O:
	// what" from the packfile engine).
	ErrCorrupt = errors.New("packstore: corrupt data")
)
