// Package statetables implements Dendrite v0.13.8's two roomserver state tables,
// tables.StateSnapshot and tables.StateBlock (roomserver/storage/tables), over
// mtxdb's hamtstore (CHAMP maps) in a packstore engine, so that a Dendrite fork
// keeps its room state in mtxdb and every other table in its SQL. It imports
// neither mtxdb's core module nor its gomatrixserverlib: only packstore, hamtstore
// and Dendrite's own types.
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
//     SQL: see README "Block order").
//
// NIDs (int64, never 0, never reused):
//
//	snapshot (and its block)  room NID << 32 | seq   seq = 1, 2, ... per room; room NID 1 .. 2^31-2
//	migrated snapshot         the SQL NID            1 .. 2^32-1 (mtxdb-dendrite-migrate)
//	delta block (memory)      (2^31-1) << 32 | seq   seq = 1 .. 2^32-1 per process
//
// so a NID names its room (a migrated one through its LegacyCollection record),
// snapshot NIDs of a room grow with time, and no kind can be taken for another.
//
// # Records
//
// Every room is one packstore collection, ID = SHA-256("mtxdb/dendrite/state/room\x00"
// || u64le(room NID))[:16]. It holds the room's HAMT nodes (record ID = node ID,
// payload = hamtstore's node encoding) and three kinds of NID records, whose IDs are
// SHA-256 over a domain-separated input truncated to 16 bytes; payloads start with a
// kind byte and a version byte (1); integers are little-endian:
//
//	record    ID                                                payload
//	snapshot  H("mtxdb/dendrite/state/nid\x00"  || u32le(seq))        'S' 1 | root (16 B)
//	root      H("mtxdb/dendrite/state/root\x00" || root)              'R' 1 | snapshot NID u64
//	lease     H("mtxdb/dendrite/state/lease")                         'L' 1 | end u32
//	migrated  H("mtxdb/dendrite/state/legacy-nid\x00" || u64le(NID)) 'S' 1 | root (16 B)
//
// and one more collection, LegacyCollection = H("mtxdb/dendrite/state/legacy"),
// holds per migrated NID a record of the same ID with payload 'M' 1 | room NID u64.
//
// HAMT keys are uvarint(event type NID) || uvarint(state key NID) (prefix-free, so
// unambiguous); values are u64le(event NID) followed by 8 zero bytes. A seq is
// handed out only below the room's lease end; the lease record moves the end
// forward by LeaseStep in the same append batch as the snapshot that needs it, so a
// reopen starts at the lease end and never hands out a seq twice (at most LeaseStep
// seqs are skipped per restart).
//
// # Durability and Dendrite's SQL transaction
//
// InsertState returns a NID only once the nodes and records naming it are durable
// (packstore Sync). Syncs are group commits: every writer that appended before a
// sync started is covered by it, so concurrent writers (of any room) share fsyncs.
// The store sits outside Dendrite's SQL transaction (txn is ignored; on SQLite it
// is nil anyway): the SQL rows that name a snapshot NID (roomserver_events,
// roomserver_rooms) commit after the NID is durable here. A crash between the two
// leaves a snapshot no SQL row names: garbage, harmless, and found again (same
// NID) if the same state is written again. The reverse, SQL naming a NID this store
// lost, cannot happen unless the store's directory is lost or swapped.
//
// # Concurrency
//
// Writers of different rooms do not share a lock (each room has its own mutex over
// its seq counter and dedup); the NID -> root and (room, root) -> NID caches and
// the per-snapshot event NID cache are bounded LRUs.
//
// # Not supported
//
// BulkSelectStateForHistoryVisibility and BulkSelectMembershipForHistoryVisibility
// return tables.OptimisationNotSupportedError, as Dendrite's SQLite backend does;
// Dendrite's callers then take their general path.
package statetables
