package main

import (
	"fmt"
	"io"
	"strings"
)

// roomProblem is a room a command walking many rooms did not process (skipped) or
// processed only in part (events left out). The command goes on with the other
// rooms, prints each problem as a "problem room=…" line and exits 2.
type roomProblem struct {
	room, what string
	skipped    bool
}

// roomProblems are the problems of one command's rooms, in the order found.
type roomProblems []roomProblem

// print writes one problem line per room (a JSON object with asJSON).
func (ps roomProblems) print(out io.Writer, asJSON bool) {
	for _, p := range ps {
		printProblem(out, asJSON, p.room, p.what)
	}
}

// skipped returns the rooms not processed at all, by ID.
func (ps roomProblems) skipped() map[string]bool {
	s := map[string]bool{}
	for _, p := range ps {
		if p.skipped {
			s[p.room] = true
		}
	}
	return s
}

// count returns the number of rooms skipped.
func (ps roomProblems) count() int { return len(ps.skipped()) }

// cyclicProblem describes events replay left out because they or an ancestor lie
// on a prev/auth cycle (ids, by arrival): how many, and the first few.
func cyclicProblem(room string, ids []string) roomProblem {
	n, more := len(ids), ""
	if n > maxCyclicShown {
		ids, more = ids[:maxCyclicShown], fmt.Sprintf(" and %d more", n-maxCyclicShown)
	}
	return roomProblem{room: room, what: fmt.Sprintf("%d events left out as outliers: they or an ancestor lie on a cycle of prev_events and auth_events (%s%s)",
		n, strings.Join(ids, ", "), more)}
}

// maxCyclicShown bounds the cyclic events a problem line names.
const maxCyclicShown = 5
