// Package serverdb reads a homeserver's own database, read-only, as mtxdb import
// --from and mtxdb audit need it: every room's PDUs in the order the server
// stored them, and the state the server recorded after each event, its current
// state and forward extremities, in the form package recorded reads.
//
// # Synapse
//
// A Synapse database (SQLite file, or PostgreSQL URL) of main schema versions
// SynapseMinSchema to SynapseMaxSchema (its schema_version table; the layouts
// are those of Synapse's synapse/storage/schema/main/full_schemas/72 and the
// deltas after it, https://github.com/element-hq/synapse/tree/develop/synapse/storage/schema).
// What is read, and nothing else:
//
//	schema_version          version
//	rooms                   room_id, room_version
//	events                  event_id, room_id, stream_ordering, outlier
//	event_json              event_id, json (the PDU as the server stored it)
//	event_to_state_groups   event_id, state_group: the state after the event
//	                        (a rejected event's: the state before it)
//	state_group_edges       state_group, prev_state_group: a group with an edge
//	                        holds only its differences from the previous group
//	state_groups_state      state_group, type, state_key, event_id
//	current_state_events    room_id, type, state_key, event_id
//	event_forward_extremities  room_id, event_id
//
// A room's PDUs are its events rows by stream_ordering (backfilled events have
// negative ones and come first), outliers included. A state group is expanded by
// following its edges to a group without one and applying the differences back
// up; the last 64 expanded groups are kept while a room is read.
//
// A SQLite file is opened read-only (mode=ro, query_only): a running server is
// not disturbed and the file is not changed. Everything is read in one read-only
// transaction (PostgreSQL: READ ONLY, REPEATABLE READ), so the events and states
// read are of one moment even while the server writes.
//
// A database that is not Synapse's (no schema_version table, a table or column
// above missing) or of a version outside the range is refused with an error
// saying which.
package serverdb
