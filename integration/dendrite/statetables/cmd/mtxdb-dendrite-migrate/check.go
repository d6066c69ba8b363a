package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/matrix-org/dendrite/roomserver/types"
)

// check checks the roomserver database conn of a patched Dendrite against its
// store (-check): every snapshot NID the SQL names must be in the store, and
// every event NID of those states a row of roomserver_events. It returns the
// summary line, or an error naming the first failures.
func check(ctx context.Context, conn, storeDir string) (string, error) {
	db, sqlite, err := openDB(ctx, conn, true)
	if err != nil {
		return "", err
	}
	defer db.Close()
	refs, err := snapshotRefs(ctx, db)
	if err != nil {
		return "", fmt.Errorf("-db %q %w", conn, err)
	}
	events := map[types.EventNID]bool{}
	rows, err := db.QueryContext(ctx, "SELECT event_nid FROM roomserver_events")
	if err != nil {
		return "", fmt.Errorf("roomserver_events: %w", err)
	}
	for rows.Next() {
		var nid int64
		if err := rows.Scan(&nid); err != nil {
			rows.Close()
			return "", fmt.Errorf("roomserver_events: %w", err)
		}
		events[types.EventNID(nid)] = true
	}
	err = rows.Err()
	rows.Close()
	if err != nil {
		return "", fmt.Errorf("roomserver_events: %w", err)
	}

	s, err := openStore(ctx, db, sqlite, storeDir)
	if err != nil {
		return "", err
	}
	defer s.Close()
	var failures []string
	entries := 0
	for nid, ref := range refs {
		table := ref.table
		st, err := s.State(nid)
		if err != nil {
			failures = append(failures, fmt.Sprintf("snapshot %d (named in %s): %v", nid, table, err))
			continue
		}
		entries += len(st)
		for _, e := range st {
			if !events[e.EventNID] {
				failures = append(failures, fmt.Sprintf("snapshot %d (named in %s): event NID %d of (%d, %d) is not in roomserver_events",
					nid, table, e.EventNID, e.EventTypeNID, e.EventStateKeyNID))
				break
			}
		}
	}
	sum := fmt.Sprintf("checked snapshots=%d entries=%d events=%d store=%q failures=%d", len(refs), entries, len(events), s.Where(), len(failures))
	if len(failures) > 0 {
		if len(failures) > 10 {
			failures = append(failures[:10], fmt.Sprintf("... %d more", len(failures)-10))
		}
		return "", fmt.Errorf("%s:\n  %s", sum, strings.Join(failures, "\n  "))
	}
	return sum, nil
}
