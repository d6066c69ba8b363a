// Package roomrules is the seam through which a Dendrite fork resolves room state and
// authorises events with mtxdb's resolver (github.com/mtxdb/mtxdb/resolver) instead
// of gomatrixserverlib's ResolveConflicts, ResolveStateConflicts(V2) and Allowed. It
// speaks gomatrixserverlib's PDUs and nothing of Dendrite, so the patch of Dendrite
// (integration/dendrite/server) calls it where Dendrite called gomatrixserverlib,
// with the events Dendrite already loaded.
//
// # Resolution
//
// Resolve takes the states to resolve one by one (the state after each prev event,
// or each server's answer), not their concatenation: the conflicted state set (spec,
// Server-Server API "Room state resolution", and Room Versions "State resolution")
// holds every key that is missing from some state or differs between them, which a
// flat list cannot tell. It runs resolver.ResolveMaps: state resolution v1 for room
// versions 1, v2 for 2-11, v2.1 for 12. Events the states name and their auth
// chains are read through a Source (Dendrite's event tables).
//
// ResolveSnapshots resolves states a server keeps as snapshots without loading
// them: the caller gives the conflicted keys with each state's event (a diff of
// the snapshots) and a lookup of unconflicted entries, all as the server's numeric
// IDs (NIDs); the auth difference comes from the room's RoomGraph, built from the
// server's event rows (event NID and ID, type and state key, auth event NIDs) and
// grown before each resolution. It runs resolver.ResolveConflicts: room versions
// 2-12 (ErrUseLists for the others), and fails with ErrStaleGraph rather than
// answer from a graph that lacks an event the states name.
//
// # Authorisation
//
// Authorize and Allowed check an event against the state it is sent or received
// into with authrules.Authorize (spec, Room Versions, "Authorization rules": this
// module's rules, which name the rule that rejects, then gomatrixserverlib's Allowed).
// AuthorizeReceived also applies the rules on the event's own auth_events
// (authrules.CheckAuthEvents: duplicates, entries the auth events selection does not
// name, rejected entries, entries of another room; in v12 the create event the room
// ID names), which gomatrixserverlib's Allowed skips. A rejection is an
// *authrules.RuleError whose text names the room version, the rule number, its ID
// and what broke it, for the server's log.
//
// # Room versions outside 1-12
//
// mtxdb's rules cover the spec's room versions 1 to 12. Dendrite also has the
// experimental pseudo-ID version org.matrix.msc4014, whose senders are not user IDs
// (only the caller's UserIDForSender maps them). For a version outside 1-12 both
// Resolve and the authorisation functions use gomatrixserverlib with that mapping
// (ResolveStateConflictsV2 with the spec's split, and Allowed), as Dendrite did.
//
// # Errors and panics
//
// gomatrixserverlib panics on some input (a v12 room ID of the wrong form, fewer
// than two states in its v2.1 entry point). Every function here recovers a panic
// and returns it as an error wrapping ErrPanic and naming the event or room version.
//
// # Concurrency
//
// The functions keep nothing between calls (RoomGraph and Graphs are the state a
// caller keeps for ResolveSnapshots) and are safe for concurrent use when the
// Source's functions are; resolutions of one RoomGraph take turns.
package roomrules
