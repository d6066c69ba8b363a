package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/mtxdb/mtxdb/internal/pagecache"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/repackplan"
	"github.com/mtxdb/mtxdb/resolver"
)

// walkBudget is what one walk over one room read, by kind, and how long it took.
type walkBudget struct {
	Walk   repackplan.WalkKind               `json:"walk"`
	Kinds  map[string]packstore.ReadCounters `json:"kinds"`
	Total  packstore.ReadCounters            `json:"total"`
	Events int                               `json:"events"` // distinct events the walk visited
	Wall   time.Duration                     `json:"wall_ns"`
	Cold   bool                              `json:"cold"`
	// Resident counts the shard pages in the page cache just before the walk
	// (after eviction in a cold run: should be 0).
	Resident int64 `json:"resident_pages_before"`
}

// shardFiles lists the store's shard files.
func shardFiles(dir string) ([]string, error) {
	return filepath.Glob(filepath.Join(dir, "shard-*.mtdb"))
}

// evictShards drops the shard files' clean pages from the page cache
// (posix_fadvise DONTNEED). Pages a live mapping holds are not dropped: call it
// with the store closed, and again after reopening (before any read).
func evictShards(dir string) error {
	files, err := shardFiles(dir)
	if err != nil {
		return err
	}
	return pagecache.Evict(files...)
}

// residentPages counts the shard files' pages in the page cache (mincore).
func residentPages(dir string) (int64, error) {
	files, err := shardFiles(dir)
	if err != nil {
		return 0, err
	}
	return pagecache.Resident(files...)
}

// measureWalk opens the store, runs one walk over roomID and returns its read
// budget. The store is opened afresh for every walk (empty node cache); cold
// evicts the shard files from the page cache first.
func measureWalk(ctx context.Context, dir, roomID string, walk repackplan.WalkKind, limit int, cold bool) (walkBudget, error) {
	wb := walkBudget{Walk: walk, Cold: cold, Resident: -1}
	if cold {
		if err := evictShards(dir); err != nil {
			return wb, err
		}
	}
	se, st, err := openStoreMode(dir, false, true)
	if err != nil {
		return wb, err
	}
	defer se.Close()
	eng, ok := se.(*packstore.PackfileStorage)
	if !ok {
		return wb, fmt.Errorf("walk read budgets need a packfile store")
	}
	room, err := st.Room(ctx, roomID)
	if err != nil {
		return wb, err
	}
	if cold {
		if err := evictShards(dir); err != nil { // what Open and the head read brought in
			return wb, err
		}
		if wb.Resident, err = residentPages(dir); err != nil {
			return wb, err
		}
	}
	eng.ResetReadStats()
	start := time.Now()
	ws, err := repackplan.Walk(ctx, room, walk, limit, resolver.ResolveForwardExtremities)
	wb.Wall = time.Since(start)
	if err != nil {
		return wb, fmt.Errorf("walk %s of %s: %w", walk, roomID, err)
	}
	wb.Events = ws.Events
	wb.Kinds = map[string]packstore.ReadCounters{}
	for k, c := range eng.ReadStats() {
		wb.Kinds[roomrecord.ReadKindName(k)] = c
	}
	wb.Total = eng.ReadStatsTotal()
	return wb, nil
}

// printBudget writes one walk's budget: a total line, then one line per kind.
func printBudget(out io.Writer, prefix string, wb walkBudget) {
	line := func(kind string, c packstore.ReadCounters) string {
		return fmt.Sprintf("%-8s reads=%-7d bytes=%-10d pages=%-7d seeks=%-7d cache_hits=%d", kind, c.Reads, c.Bytes, c.Pages, c.Seeks, c.CacheHits)
	}
	fmt.Fprintf(out, "%swalk %s: events=%d wall=%s\n", prefix, wb.Walk, wb.Events, wb.Wall.Round(time.Microsecond))
	fmt.Fprintf(out, "%s  %s\n", prefix, line("total", wb.Total))
	for _, k := range roomrecord.ReadKinds {
		name := roomrecord.ReadKindName(k)
		if c, ok := wb.Kinds[name]; ok {
			fmt.Fprintf(out, "%s  %s\n", prefix, line(name, c))
		}
	}
	if c, ok := wb.Kinds[roomrecord.ReadKindName(packstore.ReadUntagged)]; ok {
		fmt.Fprintf(out, "%s  %s\n", prefix, line("untagged", c))
	}
}

// parseWalks parses a comma-separated walk list ("" or "all": every walk).
func parseWalks(s string) ([]repackplan.WalkKind, error) {
	if s == "" || s == "all" {
		return repackplan.WalkKinds, nil
	}
	var out []repackplan.WalkKind
	for _, w := range strings.Split(s, ",") {
		ok := false
		for _, k := range repackplan.WalkKinds {
			ok = ok || string(k) == w
		}
		if !ok {
			return nil, fmt.Errorf("unknown walk %q (have %v)", w, repackplan.WalkKinds)
		}
		out = append(out, repackplan.WalkKind(w))
	}
	return out, nil
}
