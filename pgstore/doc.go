// Package pgstore is a storage engine (storage.Engine, which packstore names
// StorageEngine) over PostgreSQL (through github.com/jackc/pgx/v5), for
// deployments that already run PostgreSQL and put several server processes on
// one database.
//
// # Why a module of its own
//
// pgstore is a nested module (github.com/mtxdb/mtxdb/pgstore, go.mod beside
// this file, like packstore and hamtstore), not a package of the core module,
// because the Dendrite state tables (integration/dendrite/statetables) link
// it into a Dendrite v0.13.8 build: the core module requires a
// gomatrixserverlib that Dendrite v0.13.8 does not compile against, and
// minimal version selection would impose it on any build that requires the
// core. This module requires only internal (for package storage: the Engine
// interface, the IDs and the errors every engine shares, with no dependency
// outside the standard library) and pgx, which is pure Go (no cgo) and small
// (pgx, puddle, pgpassfile, pgservicefile, x/text, x/sync). The core module requires it
// (replace ./pgstore) so the CLI opens postgres:// stores wherever it opens a
// directory. The benchmark engines stay in bench/ because they need cgo; this
// one does not.
//
// # Schema (version 1)
//
//	mtxdb_schema  (version INT PRIMARY KEY, created TIMESTAMPTZ)   -- one row per schema version applied
//	mtxdb_records (coll BYTEA, id BYTEA, data BYTEA,                -- one row per live record
//	               PRIMARY KEY (coll, id), both 16 bytes (CHECK))
//
// A collection is the set of rows sharing coll; there is no collection table
// (Collections walks the primary key, one index probe per collection). Open
// creates the tables (CREATE TABLE IF NOT EXISTS) and records version 1 unless
// Options.NoCreate; a database whose newest recorded version is above
// SchemaVersion is refused, so an older binary never writes a newer layout.
//
// # Operations
//
//   - Put and PutMany are upserts (INSERT ... ON CONFLICT (coll, id) DO UPDATE
//     ... WHERE data IS DISTINCT FROM excluded.data): re-inserting a
//     content-addressed record (HAMT node, PDU) with the same bytes is a no-op
//     that writes no new row version, and a mutable record written with other
//     bytes supersedes the old one, as the StorageEngine contract says.
//     PutMany is one transaction of multi-row INSERT ... SELECT FROM unnest(...)
//     statements of at most batchRows rows or batchBytes payload bytes each;
//     the last occurrence of an ID in a batch wins.
//   - PutManyIf (storage.ConditionalPutter) is PutMany under a compare-and-set
//     of one record: UPDATE ... WHERE data = old (or INSERT ... ON CONFLICT DO
//     NOTHING for an absent one) must change exactly one row, else the
//     transaction rolls back with storage.ErrConflict. Under READ COMMITTED a
//     concurrent writer of the same row waits for the first to commit and then
//     finds the old bytes gone; under SERIALIZABLE (CockroachDB's default) the
//     loser gets a serialization failure, reported as ErrConflict as well.
//   - Get is one SELECT; GetMany is one round trip (WHERE coll = $1 AND id =
//     ANY($2)), answers in request order, nil where absent.
//   - DeleteCollection is one DELETE of the collection's rows.
//   - Sync returns nil: every write is committed before it returns, so its
//     durability is the server's (synchronous_commit, synchronous replicas).
//   - RefreshCollection is a no-op: nothing is cached in the process.
//   - Repack keeps the records a plan lists and deletes the others of each
//     listed collection, in one transaction, validating the plan first (an
//     unknown record fails it with ErrNotFound before anything changes). It
//     does not move rows: a database has no shard to rewrite or retire, and
//     physical order is the server's business (VACUUM reclaims deleted rows'
//     space; CLUSTER could order them, but it is PostgreSQL-only and locks the
//     table). RepackStats.RecordsCopied counts the records kept in place;
//     BytesCopied, ShardsRetired and BytesRetired are 0.
//
// # In another program's transaction: SQLView
//
// SQLView (sqlview.go) is the same records over database/sql, for a program
// that already holds a transaction on the database with another driver: the
// Dendrite state tables write a snapshot's records in the *sql.Tx (lib/pq)
// Dendrite hands them, so the records commit or roll back with Dendrite's own
// rows. Its statements take []byte parameters only (IN lists and multi-row
// VALUES instead of arrays); PrepareSQL is Open's schema step over such a
// handle. It has no Repack, ConditionalPutter or Stats: Store has them.
//
// # SQL kept to what CockroachDB and YugabyteDB accept
//
// Only tables, a composite primary key, CHECK constraints, INSERT ... ON
// CONFLICT DO UPDATE/DO NOTHING, UPDATE/DELETE with = ANY(array), unnest of
// parallel arrays, WITH RECURSIVE, and (SQLView) IN lists and multi-row VALUES. That rules out: advisory locks
// (pg_advisory_lock; CockroachDB has none), LISTEN/NOTIFY, COPY into a temporary
// table for PutMany (temporary tables are experimental in CockroachDB), CLUSTER
// and BRIN indexes, large objects, table inheritance and partitioning DDL,
// triggers and stored procedures, and size functions such as
// pg_total_relation_size (Stats asks for it and reports -1 where it fails).
// Neither alternative has been run against this package here; see the README.
//
// # Concurrency
//
// A Store is safe for concurrent use by multiple goroutines (a pgxpool.Pool), and
// any number of processes may open the same database: immutable records need no
// coordination, mutable ones go through PutManyIf.
package pgstore
