package main

import (
	"fmt"
	"io"

	"github.com/mtxdb/mtxdb/roomstate"
)

// printRejected prints every event replay rejected, room by room in arrival order,
// with the reason its state record keeps (resolver.Authorize's error: the
// authorization rule's version, number and ID); with asJSON, each as a
// {"kind":"rejected","room","event","reason"} object.
func printRejected(rooms []*roomstate.Room, out io.Writer, asJSON bool) error {
	for _, r := range rooms {
		ids, err := r.EventIDs()
		if err != nil {
			return err
		}
		for _, id := range ids {
			st, ok, err := r.EventState(id)
			if err != nil {
				return err
			}
			switch {
			case !ok || !st.Rejected:
			case asJSON:
				printLine(out, true, "rejected", kv{"room", r.ID()}, kv{"event", id}, kv{"reason", st.Reason})
			default:
				fmt.Fprintf(out, "rejected room=%s event=%s: %s\n", r.ID(), id, st.Reason)
			}
		}
	}
	return nil
}
