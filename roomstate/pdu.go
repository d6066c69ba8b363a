package roomstate

import "errors"

// Errors of import's placement of PDUs and of Store.Room. Each is returned
// wrapped in an *ImportError (or a plain error naming the event) so that
// errors.Is works.
var (
	// ErrMissingPrevEvent is returned when a PDU names a prev_event that is neither in
	// the store nor earlier in the input.
	ErrMissingPrevEvent = errors.New("roomstate: prev_event not found")
	// ErrMissingAuthEvent is the same for auth_events.
	ErrMissingAuthEvent = errors.New("roomstate: auth_event not found")
	// ErrNoCreateEvent is returned for a PDU of a room the store does not know, when
	// the PDU is not that room's m.room.create.
	ErrNoCreateEvent = errors.New("roomstate: room has no m.room.create yet")
	// ErrConflictingEvent is returned when a v1/v2-format PDU reuses the event ID of a
	// stored event with a different content hash.
	ErrConflictingEvent = errors.New("roomstate: event ID already stored with different content")
	// ErrUnknownRoom is returned by Store.Room for a room that was never imported.
	ErrUnknownRoom = errors.New("roomstate: unknown room")
)
