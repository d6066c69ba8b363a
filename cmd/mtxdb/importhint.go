package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/mtxdb/mtxdb/pdu"
	"github.com/mtxdb/mtxdb/roomstate"
)

// refusalTally sorts an import's refusals by what would have avoided them, for the
// hint import prints.
type refusalTally struct {
	anyOrder bool
	total    int
	order    int // a prev/auth event not stored before it, or no m.room.create first
	version  int // with --any-order: a room whose version is not known yet
	cascaded int // a prev/auth event that was itself refused
	unnamed  int // refused as too large, its event ID not known (a line over the line limit)
	other    int // refused for anything else (malformed, unknown room version, ...)
	refused  map[string]bool
}

func (t *refusalTally) add(r *roomstate.ImportError) {
	if t.refused == nil {
		t.refused = map[string]bool{}
	}
	t.total++
	if r.EventID == "" && errors.Is(r.Err, pdu.ErrTooLarge) {
		t.unnamed++
	}
	switch {
	case r.Missing != "" && t.refused[r.Missing]:
		t.cascaded++
	case errors.Is(r.Err, roomstate.ErrNoCreateEvent) && t.anyOrder:
		t.version++
	case errors.Is(r.Err, roomstate.ErrMissingPrevEvent), errors.Is(r.Err, roomstate.ErrMissingAuthEvent), errors.Is(r.Err, roomstate.ErrNoCreateEvent):
		t.order++
	default:
		t.other++
	}
	if r.EventID != "" {
		t.refused[r.EventID] = true
	}
}

// hint says which flag would have helped and which refusals follow from others;
// empty when none applies.
func (t *refusalTally) hint() string {
	var parts []string
	if t.order > 0 {
		unnamed := ""
		if t.unnamed > 0 {
			unnamed = fmt.Sprintf(" (the event may be one of the %d refused as too large whose event ID could not be read)", t.unnamed)
		}
		refusedAbove := ""
		if t.other > 0 {
			// A line refused as malformed or of an unknown room version may be
			// the event (or the m.room.create) they need, its ID unread.
			refusedAbove = fmt.Sprintf(": first look at the %d refused above for another reason (a malformed line, an unknown room version): an event they name, or their room's m.room.create, may be among them, and --any-order does not help then; otherwise", t.other)
		} else {
			refusedAbove = ":"
		}
		parts = append(parts, fmt.Sprintf("%d refused for a prev or auth event not stored before it%s (or no m.room.create first)%s if the input is not in arrival order (a backfill, a shuffled export), import it with --any-order (and --room-version V for rooms whose m.room.create is not first)", t.order, unnamed, refusedAbove))
	}
	if t.version > 0 {
		parts = append(parts, fmt.Sprintf("%d refused because their room's m.room.create came later or not at all: give its room version with --room-version V", t.version))
	}
	if t.cascaded > 0 {
		parts = append(parts, fmt.Sprintf("%d refused only because an event they name was refused before them (its reason is above)", t.cascaded))
	}
	return strings.Join(parts, "; ")
}
