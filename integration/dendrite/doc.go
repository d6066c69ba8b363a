// Package dendrite implements Dendrite v0.13.8's roomserver/state.StateResolutionStorage
// over mtxdb's roomstate (events, per-event state snapshots as HAMT roots) so that a
// Dendrite fork's state.NewStateResolution reads and writes room state in mtxdb.
// See README.md for how a fork wires it in and what is not covered. The patched
// Dendrite that make dendrite builds (server/) does not link this package: it keeps
// its state in statetables and resolves and authorises through roomrules (README.md,
// "The patched server").
//
// # NIDs
//
// Dendrite names everything by int64 NIDs; mtxdb names events by ID and states by
// HAMT root. Storage keeps one NID space per kind, assigned densely from a counter
// on first use and persisted in a dedicated packstore collection of the same engine,
// so a NID is stable across restarts and never reused:
//
//	kind        name (bytes)                       first assigned NID
//	room     r  room ID                            1
//	type     t  event type                         8 (1-7 fixed: Dendrite's well-known types)
//	key      k  state key                          2 (1 fixed: the empty state key)
//	event    e  u64le(room NID) || event ID        1
//	snapshot s  u64le(room NID) || HAMT root (16B) 1
//
// NIDs are not derived by hashing: Dendrite needs the reverse mapping (NID back to
// event ID or root) and a snapshot root does not fit in 63 bits, so a table is
// needed anyway. Event type and state key NIDs are shared by all rooms, as in
// Dendrite; event and snapshot NIDs carry their room, and a RoomStorage refuses
// those of another room. Because a snapshot NID names a root and roots are content
// addresses, two equal states always get the same snapshot NID.
//
// State blocks: Dendrite stores a snapshot as a list of blocks (deltas); here every
// snapshot is exactly one block whose NID equals the snapshot NID. AddState with
// several blocks folds them into one root.
//
// # NID records
//
// Collection ID = SHA-256("mtxdb/dendrite/nids")[:16]. Record IDs are SHA-256 over
// a domain-separated input, truncated to 16 bytes; payloads start with a record kind
// byte and a version byte (1); integers are little-endian u64. The packfile frame
// around each payload carries the CRC-32C.
//
//	record   ID                                         payload
//	forward  H("mtxdb/dendrite/fwd\x00"  || kind || name) 'F' 1 | nid u64
//	reverse  H("mtxdb/dendrite/rev\x00"  || kind || u64le(nid)) 'R' 1 | name
//	counter  H("mtxdb/dendrite/next\x00" || kind)       'C' 1 | next nid u64
//
// One assignment writes forward, reverse and counter in one PutMany batch. If a
// crash keeps the first two but not the counter, reopening moves the counter past
// every NID that has a reverse record, so no NID is handed out twice. On an engine
// several processes write (packstore.ConditionalPutter: pgstore), the batch is a
// compare-and-set of the counter as stored now (PutManyIf), and a process that
// loses the race reads the name and the counter again: processes sharing one
// database never hand out a NID twice nor give a name two
// (TestNIDsTwoProcessesPostgres).
//
// # Concurrency
//
// Storage and RoomStorage are safe for concurrent use (one lock over the NID
// tables, one per RoomStorage over its room and HAMT reader). Writes to a room's
// events and state records (import, replay) must still be serialised by the caller,
// as roomstate requires.
package dendrite
