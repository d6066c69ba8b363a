// Package roomstate maps Matrix rooms onto the packfile engine and the CHAMP trie:
// PDUs, their prev/auth edges, a state snapshot before and after every event, the
// forward extremities and the current state of each room, one packstore collection
// per room. The records and their formats, to the byte, are package roomrecord's.
//
// # Using it
//
// Open an engine (packstore.Open), wrap it with New, Import PDUs, take a Room, let
// resolver.Replay compute the state before and after every event, then read state:
// Room.State over Room.CurrentState (or StateBefore/StateAfter of an event) gives a
// map from StatePair, which is resolver.Key, to event IDs; Room.Lookup reads one
// entry. A Room follows its room's head across Imports through the same Store.
// Example (in this package's tests) runs that sequence on a real room.
//
// # Forward extremities
//
// Room.Head returns them whole and sorted (Head.ForwardExtremities), whatever
// the head record's version: opening a room reads the forward-extremity chunks
// a version 3 head names and checks them (roomrecord, "Forward extremities").
// Import and StateWriter.Commit lay a new set out through
// roomrecord.ExtremitySet, so that a batch writes the head, its few inline
// extremities and only the chunks that changed, not the whole set (which grows
// to thousands in rooms where rejected events accumulate). Stores whose heads
// are all version 1 or 2 open as before; their next head write moves a large
// set into chunks.
//
// # Concurrency
//
// A Store may be shared by goroutines for reading; writes to one room (Import,
// a StateWriter) must be serialised by the caller.
//
// # Contexts
//
// The calls whose work grows with the room or the store take a context.Context
// first and return its error once it is done: Store.Import (checked before each
// group of PDUs parsed together; what was stored before stays stored and
// synced), Store.Rooms and Store.Room, Room.Check (before each event), the snapshot
// reads Room.State and StateMemo (before the walk), and the writes of a
// StateWriter. The reads of one record or one record
// kind (Meta, Event, EventJSON, EventState, StateAfter, StateBefore, Lookup,
// EventIDs, Graph) take none: they run inside those operations, and the storage
// engines under them take no context either.
package roomstate
