// Package statetables implements Dendrite v0.13.8's two roomserver state tables,
// tables.StateSnapshot and tables.StateBlock (roomserver/storage/tables), over
// mtxdb's hamtstore (CHAMP maps) in a packstore directory or, for a PostgreSQL
// Dendrite, in pgstore's tables inside Dendrite's own database, so that a Dendrite
// fork keeps its room state in mtxdb and every other table in its SQL. It imports
// neither mtxdb's core module nor its gomatrixserverlib: only packstore, hamtstore,
// pgstore (modules of their own) and Dendrite's own types.
//
// # Model
//
// A Dendrite state is a set of (event type NID, state key NID) -> event NID entries.
// Dendrite writes it as a snapshot that lists state blocks, merged in list order,
// the last entry for a key winning (roomserver/state LoadStateAtSnapshot). Here:
//
//   - a snapshot is exactly one HAMT root; its NID names (room NID, root), so two
//     equal states of a room always share a NID, and a snapshot lists one block,
//     itself (its block NID equals its snapshot NID), or no block when empty;
//   - a block from BulkInsertStateData is a delta held in memory only (bounded,
//     oldest dropped first) until InsertState folds it into a snapshot: Dendrite
//     hands such a block NID only to the InsertState of the same AddState call.
//     Inside one delta, as in Dendrite's SQL (entries sorted by event NID, the last
//     per key winning), the highest event NID of a key wins;
//   - InsertState folds its blocks in the order given (not sorted, unlike Dendrite's
//     SQL: see README "Block order");
//   - a snapshot is stored in one of two ways ("Records"). A checkpoint (snapshot
//     record version 1) has its HAMT nodes in the room's collection. A chained
//     snapshot (version 2) is one InsertState made of exactly one earlier
//     snapshot P of the room's own seqs followed by delta blocks only, at chain
//     position n = P's position + 1 (a checkpoint is at position 0) while n <
//     ChainLimit (K = 16384): its record holds the entries that turn the state of
//     a base snapshot into its own, and none of its nodes are written. The base is
//     the snapshot at position chainBase(n) = n - 16^k, k the place of n's lowest
//     nonzero hexadecimal digit, on P's base chain (P, P's base, its base, ...:
//     it is always on it). So a state is at most 48 records from its checkpoint
//     (position 0x3fff: 15 + 15 + 15 + 3); for a line of one-entry changes the
//     records of a state at position n hold n entries in all, and a record about
//     3.5 on average. Any other InsertState (a delta alone, several snapshots: what
//     Dendrite stores for the state after several prev events) is chained the same
//     way to the room's snapshot this Store wrote last (P then) when the caller's
//     view finds P's record (on PostgreSQL its transaction may have rolled back)
//     and the two states differ in at most MergeChainLimit (1024) entries. What is
//     left (P a migrated NID, n = K, a state further from the last, a Store's
//     first snapshot of a room) is a checkpoint, whose new nodes (those the chain
//     made since the last checkpoint) are written then;
//   - reading a chained snapshot materialises it: its base is materialised first
//     (recursively, down to the checkpoint), then its entries are applied with
//     hamtstore.Apply into an in-memory layer over the base's, and the result
//     must be the root its record names (else ErrCorrupt naming the snapshot).
//     Every read of a snapshot's nodes (State, BulkSelectStateBlockEntries,
//     InsertState's folds, DiffStates, StateLookup) goes through the layers of
//     the snapshots it reads, then the collection. A Store keeps materialised
//     layers by snapshot NID in a cache bounded to 64 MiB of nodes (a node ID
//     names its bytes, so a layer is valid wherever its snapshot is); nothing
//     depends on a layer staying cached.
//
// NIDs (int64, never 0, never reused):
//
//	snapshot (and its block)  room NID << 32 | seq   seq = 1, 2, ... per room; room NID 1 .. 2^31-2
//	migrated snapshot         the SQL NID            1 .. 2^32-1 (mtxdb-dendrite-migrate)
//	delta block (memory)      (2^31-1) << 32 | seq   seq = 1 .. 2^32-1 per process
//
// so a NID names its room (a migrated one through its LegacyCollection record),
// snapshot NIDs of a room grow with time (on PostgreSQL, those of one Store: each
// takes a range of its own), and no kind can be taken for another.
//
// # Records
//
// Every room is one collection (of the packstore engine, or rows of pgstore's
// mtxdb_records sharing coll), ID = SHA-256("mtxdb/dendrite/state/room\x00"
// || u64le(room NID))[:16]. It holds the room's HAMT nodes (record ID = node ID,
// payload = hamtstore's node encoding) and three kinds of NID records, whose IDs are
// SHA-256 over a domain-separated input truncated to 16 bytes; payloads start with a
// kind byte and a version byte (1, or 2 for a chained snapshot); integers are
// little-endian:
//
//	record    ID                                                payload
//	snapshot  H("mtxdb/dendrite/state/nid\x00"  || u32le(seq))        'S' 1 | root (16 B)               (checkpoint)
//	snapshot  H("mtxdb/dendrite/state/nid\x00"  || u32le(seq))        'S' 2 | root (16 B) | chained ... (chained)
//	root      H("mtxdb/dendrite/state/root\x00" || root)              'R' 1 | snapshot NID u64
//	lease     H("mtxdb/dendrite/state/lease")                         'L' 1 | end u32
//	migrated  H("mtxdb/dendrite/state/legacy-nid\x00" || u64le(NID)) 'S' 1 | root (16 B)
//
// Snapshot record versions: 1, the root of a state whose nodes are in the
// collection (every record of stores written before version 2 existed, read as
// they are); 2 added chained snapshots ("Model"), laid out as
//
//	offset  size  field
//	0       1     'S'
//	1       1     2
//	2       16    root: the HAMT root of the state (checked after materialising)
//	18      1-5   uvarint(own seq - base seq): the base, the snapshot its changes
//	              apply to, has seq 1 <= base < own seq
//	..      1-3   uvarint(position): 1 .. MaxChainLimit-1 (2^16-1); the base's
//	              position must be chainBase(position) (0: a checkpoint)
//	..      1-10  change count, uvarint
//	..      3-30  per change, in hamtstore key-hash order: uvarint(event type NID),
//	              uvarint(state key NID), uvarint(v): v = 0 removes the key, v >= 1
//	              sets it to event NID v-1
//
// and nothing after the last change. A decoder checks each field (count against
// the bytes left, three bytes at least per change, before allocating). Example:
// the snapshot of seq 7 at position 3 whose base is seq 6, changing member 100
// (type NID 5, state key NID 100) to event 1000, is
//
//	53 02 <root: 16 B> 01 03 01 05 64 e907
//
// (25 bytes; v = 1001 = e9 07). Uvarints are canonical (shortest form). The root record is written for a chained snapshot
// too, so that equal states of a room keep one NID.
//
// and one more collection, LegacyCollection = H("mtxdb/dendrite/state/legacy"),
// holds per migrated NID a record of the same ID with payload 'M' 1 | room NID u64.
//
// HAMT keys are uvarint(event type NID) || uvarint(state key NID) (prefix-free, so
// unambiguous); values are u64le(event NID) followed by 8 zero bytes. A seq is
// handed out only below the room's lease end; on packstore the lease record moves
// the end forward by LeaseStep in the same append batch as the snapshot that needs
// it (PostgreSQL: "Where the records are"), so a
// reopen starts at the lease end and never hands out a seq twice (at most LeaseStep
// seqs are skipped per restart).
//
// # Where the records are
//
// A SQLite Dendrite's store is a packstore directory beside its database file
// (file + ".mtxdb-state": DirFor). A PostgreSQL Dendrite's store is its roomserver
// database itself: pgstore's tables (mtxdb_schema, mtxdb_records: pgstore's package
// doc), created there on first open, one row per record above. They are read and
// written through Dendrite's own *sql.DB and transactions (lib/pq) with
// pgstore.SQLView: no second connection pool, no connection string to find.
// $MTXDB_DENDRITE_STATE_DIR puts either kind in a directory instead. A PostgreSQL
// database with no mtxdb rows whose store directory of earlier versions
// ($MTXDB_DENDRITE_STATE_BASE/pg-HOST-PORT-DB) exists is refused at start
// (ErrStoreInDirectory), naming the variable that keeps using it.
//
// Leases differ: on packstore the lease record is appended in the batch of the
// snapshot that needs it (one process per directory: packstore locks it). On
// PostgreSQL any number of Stores (processes, or Dendrite opening the database
// twice) may share a room, so a Store takes LeaseStep seqs at a time: it reads the
// lease record (the room's next free seq; absent: 1) and moves it forward by
// compare-and-set (pgstore.SQLView.PutIf: UPDATE ... WHERE data = old, or INSERT
// ... ON CONFLICT DO NOTHING), committed on its own; on a conflict it reads again.
// Two Stores never hold one seq; the unused rest of a range is skipped when a Store
// closes. The compare-and-set runs on a connection of Dendrite's pool of its own
// while the caller's transaction holds another: a pool whose every connection is
// held by transactions that all need a new range at once (at most once per
// LeaseStep snapshots of a room and Store) waits for one to be freed, forever if
// none is (a deadlock; Dendrite's default database.max_open_conns is 90, and no
// test here has come near it).
//
// # Durability and Dendrite's SQL transaction
//
// On packstore, InsertState returns a NID only once the nodes and records naming it
// are durable (packstore Sync). Syncs are group commits: every writer that appended
// before a sync started is covered by it, so concurrent writers (of any room) share
// fsyncs. The store sits outside Dendrite's SQL transaction (txn is ignored): the
// SQL rows that name a snapshot NID (roomserver_events, roomserver_rooms) commit
// after the NID is durable here. A crash between the two leaves a snapshot no SQL
// row names: garbage, harmless, and found again (same NID) if the same state is
// written again. The reverse, SQL naming a NID this store lost, cannot happen
// unless the store's directory is lost or swapped.
//
// On PostgreSQL a commit is as durable as the server makes it (synchronous_commit,
// synchronous replicas). What is atomic with Dendrite's transaction txn (txn not
// nil):
//
//   - InsertState writes the snapshot's new HAMT nodes (none for a chained
//     snapshot), its snapshot record and its root record in txn; the base records a
//     chained snapshot is made from are read through txn: they commit or roll back with Dendrite's rows. Dendrite
//     v0.13.8 hands InsertState (through RoomUpdater.AddState) the room updater's
//     transaction on its input path (roomserver/internal/input: the state before an
//     event, given or calculated through the updater, then SetState, which writes
//     the NID into roomserver_events, in the same transaction): there a snapshot and
//     the rows naming it commit together, and a crash leaves both or neither.
//   - Reads with a txn (InsertState's folds, BulkSelectStateBlockNIDs,
//     BulkSelectStateBlockEntries) go through it, so a transaction sees the
//     snapshots it wrote; which NIDs exist (snapshot records, and the (room, root)
//     -> NID dedup) is cached only from what is read or written outside one (the
//     transaction may roll back). What is cached by NID or node ID once the
//     caller's view found the snapshot's record may come from inside one: the
//     materialised layers, a snapshot's event NIDs, and the HAMT nodes read from
//     PostgreSQL (64 MiB, as the layers; packstore has a cache of its own). A NID
//     is never handed out twice and a node ID names its bytes, so what a
//     transaction that rolled back left there is never used for another snapshot.
//   - A room's purge (PurgeAfterSQL) deletes its rows but the lease record in
//     Dendrite's purge transaction.
//
// What is not:
//
//   - The lease record (NID allocation) is committed on its own before a seq of its
//     range is handed out, as a PostgreSQL sequence is: a rolled-back or crashed
//     transaction skips its seq, which is never handed out again. A crash between
//     the lease commit and Dendrite's commit leaves only that gap.
//   - Where Dendrite's caller holds no transaction (Database.AddState: backfill, and
//     state stored outside a room updater), sqlutil's Writer.Do opens one around
//     BulkInsertStateData and InsertState alone and commits it when they return;
//     the rows naming the NID are written later, in other transactions. There the
//     snapshot commits first: a crash before the naming rows commit leaves a
//     snapshot no row names (garbage, as on packstore), never a row naming a
//     missing snapshot. Given txn nil, InsertState writes its records in one
//     transaction of its own, committed before the NID is returned.
//   - BulkInsertStateData keeps its delta block in memory on both engines (Model):
//     nothing is written, txn is not used; a crash loses only blocks no snapshot
//     was made of yet.
//   - ImportSnapshot (the migration) writes in transactions of its own.
//
// # Concurrency
//
// Writers of different rooms do not share a lock (each room has its own mutex over
// its seq counter and dedup; on PostgreSQL it is released before the write, which
// may wait for another transaction's row locks, so no Go lock is held while the
// database waits); the NID -> root and (room, root) -> NID caches,
// the per-snapshot event NID cache and the materialised layer cache are bounded
// LRUs.
//
// # Not supported
//
// BulkSelectStateForHistoryVisibility and BulkSelectMembershipForHistoryVisibility
// return tables.OptimisationNotSupportedError, as Dendrite's SQLite backend does;
// Dendrite's callers then take their general path.
package statetables
