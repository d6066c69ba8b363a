// Package roomrecord holds the formats of the records a room is stored as, to
// the byte: their identifiers, payloads and versions, the HAMT key and value of a
// state snapshot, and the room's DAG in dense form (Graph) that the graph
// records hold. It does no I/O: roomstate reads and writes these records through
// a packstore engine; resolver, repackplan and the Dendrite adapter use the
// types and identifiers.
//
// # Identifiers
//
// Every room is one packstore collection. All identifiers are the first 16 bytes of
// SHA-256 over a domain-separated input, so record kinds can never collide:
//
//	collection ID        = H("mtxdb/room\x00"  || room_id)
//	event record ID (E)  = H("mtxdb/event\x00" || event_id)
//	metadata record ID   = H("mtxdb/meta\x00"  || E)      (16 raw bytes of E)
//	state record ID      = H("mtxdb/state\x00" || E)
//	room head ID         = H("mtxdb/head")                 (one per collection)
//	arrival log chunk i  = H("mtxdb/log\x00"   || u32le(i))
//	graph record i       = H("mtxdb/graph\x00" || u32le(i))  (one per log chunk)
//	extremity chunk      = H("mtxdb/fwd\x00"   || payload)  (content-addressed)
//	HAMT node ID         = H(encoded node)                 (hamtstore)
//
// A state snapshot is a hamtstore root. Its keys are StateKey(event_type, state_key)
// = uvarint(len(event_type)) || event_type || state_key, which is unambiguous for any
// bytes; its values are the event record IDs (E) of the state events. The metadata
// record of E carries the event ID, so a value resolves to an event ID with one small
// read.
//
// # Record payloads
//
// Every payload starts with a kind byte and a version byte; integers are
// little-endian, strings are u32 length + bytes (internal/bin). The packfile frame
// around each payload carries the CRC-32C.
//
//	event     'E' 1 | event_id str | PDU JSON as received (rest of payload)
//	metadata  'M' 1 | seq u32 | depth u64 | flags u8 (bit0 state event, bit1 redacted
//	          because its content hash failed) | event_id str | type str |
//	          state_key str | prev_events strs | auth_events strs
//	state     'S' 1 | flags u8 (bit0 rejected) | before 16B | after 16B | reason str
//	head      'H' 1 | room_id str | room_version str | events u32 | log_chunks u32 |
//	          replayed u8 | current_state 16B | forward_extremities strs
//	head v2   'H' 2 | the fields of version 1 | state_every u32 (K >= 1) |
//	          state_kept_below u32 (<= events)   (written only when K > 0)
//	head v3   'H' 3 | room_id str | room_version str | events u32 | log_chunks u32 |
//	          replayed u8 | current_state 16B | inline forward_extremities strs
//	          (sorted) | chunks u32 (>= 1) | chunks x (record ID 16B | count u32
//	          (>= 1)) | state_every u32 | state_kept_below u32 (0 0: no rule)
//	          (written only when the head names extremity chunks)
//	extremity chunk 'F' 1 | event_ids strs      (sorted, distinct, at least one)
//	log chunk 'L' 1 | event_ids strs            (arrival order, one chunk per import batch)
//	graph     'G' 1 | base u32 | count u32 | count x entry   (the events of log chunk i)
//	  entry   flags u8 (bit0 state event, bit1 redacted) | [type str | state_key str]
//	          (state events only) | prev count u32 | prev u32 each | auth count u32 |
//	          auth u32 each | missing strs
//
// # Forward extremities
//
// A version 1 or 2 head holds the room's forward extremities inline. A version
// 3 head holds some inline and names chunk records that hold the others; the
// set is their union (disjoint, each part sorted), and the head's count per chunk
// and its events bound the set before any chunk is read. A chunk's ID is the
// hash of its payload, so the chunks an old head names stay as they were when a
// new head names new ones: a torn batch leaves the old head describing a
// consistent set, and a repack keeps only the chunks the head names
// (roomstate.Room.RoomRecords). A reader checks each chunk against its ID and
// count and the union for repeats (ErrCorruptRecord names the chunk).
//
// Why: import rewrites the head once per batch, and in a room whose
// extremities accumulate (events nothing points at: rejected and soft-failed
// ones, 9,883 of them at the end of the generated 1M-event room, 445 KB of
// head) writing, compressing and sorting the whole set per batch cost about 9
// ms a batch. Most of the set never changes again once written; the churn is
// at the frontier. So the layout (roomrecord.ExtremitySet, a write policy the
// format does not fix) keeps new extremities inline, seals them into a chunk
// when more than MaxInlineExtremities (64) are inline, rewrites a chunk only when
// one of its members stops being an extremity, merges chunks below half of
// ExtremityChunkTarget (512) once eight have accumulated, and puts everything
// inline again when no more than 32 are left. A head without chunks is written
// as version 1 or 2, byte for byte as before version 3 existed, so rooms with
// few extremities (real rooms, and every room after replay) keep the old
// format. Chunks by arrival, not by hash of the event ID: a batch's new
// extremities and most of its removals fall in the inline part, where a hash
// partition would touch every chunk every batch. A delta scheme (base set plus
// inline changes) would need a periodic full rewrite of the set; chunks need
// none.
//
// # Graph records (the room's auth index)
//
// Beside each arrival-log chunk, import writes a graph record: the DAG of the
// chunk's events in dense form, edges as arrival indexes (base is the index of
// the chunk's first event), state keys in full. An edge to an event the room did
// not hold at import (AnyOrder) is 0xFFFFFFFF and its event ID follows, in
// prev-then-auth order, in missing; loading resolves it when the event has
// arrived since. roomstate.Room.Graph loads a room's whole graph with one read per import
// batch (1,000 events by default) instead of a metadata read per event; the
// resolver builds its auth index (auth children, same-key lineages with jump
// pointers, auth depths) from it. Why a CSR sidecar and not Synapse's chain cover:
// the questions state resolution asks of the graph here (auth difference from the
// conflicted events' chains cut at the unconflicted map's lineages, the v2.1
// conflicted subgraph by lockstep walks, same-key ancestry) are answered by short
// walks over dense arrays and O(log) jump pointers; a chain cover answers
// arbitrary reachability in O(chains) but must be maintained as chains and links
// on every insert, and the walks it would replace are not what replay
// spends its time on (docs/bench/replay.md). A room imported before graph records
// existed has none (graph record 0 absent): its graph comes from the metadata
// records, and imports into it write none. Verify (roomstate.Room.Check) compares every
// event's graph entry with its metadata record; RoomRecords lists the graph
// records so that a repack keeps them.
//
// For a rejected event, after == before: it does not change the room state (Matrix
// spec v1.19, Server-Server API, "Rejection").
//
// # Keep rule (every-k repack)
//
// A version 2 head carries the keep rule of an every-k repack (docs/library.md;
// Head.KeepsState): of the events with arrival index below
// state_kept_below, only state events, the head's forward extremities, rejected
// events and those whose arrival index is a multiple of state_every keep their state
// record; the others may have none. roomstate.Room.StateBefore and StateAfter of such an event
// return roomstate.ErrStateNotKept, Check counts it in NotKept, and Replay takes it as an
// accepted event (see resolver.Replay).
package roomrecord
