package main

import (
	"context"
	"fmt"
	"io"
	"sort"

	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/pgstore"
	"github.com/mtxdb/mtxdb/repackplan"
)

// statsCmd is mtxdb stats: shard, byte and room counts, and with --reads the read
// budget of the server walks.
func statsCmd() *cobra.Command {
	var store, room, walks string
	var reads, cold, asJSON bool
	var limit int
	c := &cobra.Command{
		Use:   "stats --store DIR [--reads [--room ROOM_ID] [--walks W,...] [--cold]]",
		Short: "Print shard, byte and room counts; with --reads, the read budget of the server walks",
		Long: `Stats prints shard, byte and room counts. With --reads it runs the walks a server does
(current-state, auth-chain, backfill of --limit events, resolve-extremities) over the
room named by --room, or every replayed room, and prints for each walk the read budget
by kind (node, pdu, meta, other): physical reads, frame bytes, distinct 4 KiB pages,
seeks (a read not in the pages of the previous read or the next one) and node-cache
hits. Each walk runs on a freshly opened store (empty node cache); --cold also evicts
the shard files from the page cache first (posix_fadvise DONTNEED). The counters are
this process's: another process's reads cannot be seen. A room collection whose head
record cannot be read is counted (unreadable=N) and is a problem line (its room ID is
in the head); the other rooms are counted, listed or walked, and the exit status is 2.
A room whose walk meets a damaged record is a problem line too (the walk and the
room's later walks are not measured; rooms_failed=N on the summary line), and the
other rooms are walked; exit status 2.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if err := needFlag(cmd, "reads", reads, "room", "walks", "limit", "cold"); err != nil {
				return err
			}
			if limit <= 0 {
				return fmt.Errorf("--limit must be positive, not %d", limit)
			}
			if err := nonEmptyFlag(cmd, "room", room); err != nil {
				return err
			}
			if reads {
				defer catchInterrupts("stats", func() string { return "stopped; stats writes nothing" })()
				return statsReads(ctx, cmd.OutOrStdout(), asJSON, store, room, walks, limit, cold)
			}
			eng, st, err := openStoreMode(store, false, true)
			if err != nil {
				return err
			}
			defer eng.Close()
			s, err := storeStats(eng)
			if err != nil {
				return err
			}
			rooms, bad, err := st.RoomsAndErrors(ctx)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			f := []kv{{"shards", s.Shards}, {"disk_bytes", s.DiskBytes}, {"collections", s.Collections}, {"live_records", s.LiveRecords}, {"live_bytes", s.LiveBytes},
				{"rooms", len(rooms)}, {"unreadable", len(bad)}}
			if asJSON {
				printLine(out, true, "stats", f...)
			} else {
				for i, x := range f {
					if i > 0 {
						fmt.Fprint(out, " ")
					}
					fmt.Fprintf(out, "%s=%v", x.k, x.v)
				}
				fmt.Fprintln(out)
			}
			sort.Slice(rooms, func(i, j int) bool { return rooms[i].Head().Events > rooms[j].Head().Events })
			for i, r := range rooms {
				if i == 10 {
					if asJSON {
						printLine(out, true, "more_rooms", kv{"rooms", len(rooms) - 10})
					} else {
						fmt.Fprintf(out, "... %d more rooms (mtxdb rooms --store %s lists them all)\n", len(rooms)-10, pgstore.Redacted(store))
					}
					break
				}
				h := r.Head()
				if asJSON {
					printLine(out, true, "room", kv{"room_id", h.RoomID}, kv{"version", h.RoomVersion}, kv{"events", h.Events}, kv{"replayed", h.Replayed}, kv{"forward_extremities", len(h.ForwardExtremities)})
				} else {
					fmt.Fprintf(out, "room %s version=%s events=%d replayed=%t forward_extremities=%d\n",
						h.RoomID, h.RoomVersion, h.Events, h.Replayed, len(h.ForwardExtremities))
				}
			}
			if printHeadProblems(out, asJSON, bad, "the room is not counted") > 0 {
				return exitError(2)
			}
			return nil
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp)
	c.Flags().BoolVar(&reads, "reads", false, "run the server walks and print their read budget by kind")
	c.Flags().StringVar(&room, "room", "", "with --reads: only this room ID")
	c.Flags().StringVar(&walks, "walks", "all", "with --reads: comma-separated walks ("+fmt.Sprint(repackplan.WalkKinds)+")")
	c.Flags().IntVar(&limit, "limit", 1000, "with --reads: events of the backfill walk")
	c.Flags().BoolVar(&cold, "cold", false, "with --reads: evict the shard files from the page cache before each walk")
	jsonFlag(c, &asJSON)
	return c
}

// statsReads runs the walks over the selected replayed rooms and prints their read
// budgets.
func statsReads(ctx context.Context, out io.Writer, asJSON bool, store, roomID, walkList string, limit int, cold bool) error {
	ws, err := parseWalks(walkList)
	if err != nil {
		return err
	}
	if pgstore.IsURL(store) {
		return fmt.Errorf("stats --reads counts packfile reads (pages, seeks); a PostgreSQL store has none to count")
	}
	eng, st, err := openStoreMode(store, false, true)
	if err != nil {
		return err
	}
	rooms, bad, err := selectRoomsAndErrors(ctx, st, roomID)
	var ids []string
	for _, r := range rooms {
		if r.Head().Replayed {
			ids = append(ids, r.ID())
		}
	}
	if cerr := eng.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	unreadable := printHeadProblems(out, asJSON, bad, "the room is not walked")
	if len(ids) == 0 {
		return fmt.Errorf("no replayed room to walk (mtxdb replay first)")
	}
	var total packstore.ReadCounters
	failed := 0
	bar := newProgress(out, int64(len(ids)*len(ws)), "walks", false)
	for _, id := range ids {
		bar.clear()
		if !asJSON {
			fmt.Fprintf(out, "room %s\n", id)
		}
		for j, w := range ws {
			wb, err := measureWalk(ctx, store, id, w, limit, cold)
			if err != nil && isRoomDamage(err) {
				// A damaged room: say so and walk the others.
				bar.clear()
				printProblem(out, asJSON, id, fmt.Sprintf("this walk and the room's later ones not measured: %v", err))
				failed++
				bar.add(len(ws) - j)
				break
			}
			if err != nil {
				bar.finish()
				return err
			}
			bar.clear()
			if asJSON {
				kinds := map[string]map[string]int64{}
				for k, c := range wb.Kinds {
					kinds[k] = countersJSON(c)
				}
				printLine(out, true, "walk", kv{"room", id}, kv{"walk", wb.Walk}, kv{"events", wb.Events}, kv{"wall_us", wb.Wall.Microseconds()},
					kv{"cold", wb.Cold}, kv{"total", countersJSON(wb.Total)}, kv{"kinds", kinds})
			} else {
				printBudget(out, "  ", wb)
			}
			bar.add(1)
			total = total.Add(wb.Total)
		}
	}
	bar.finish()
	printLine(out, asJSON, "reads", kv{"rooms", len(ids)}, kv{"unreadable", unreadable}, kv{"walks", len(ws)}, kv{"reads", total.Reads}, kv{"bytes", total.Bytes}, kv{"pages", total.Pages},
		kv{"seeks", total.Seeks}, kv{"cache_hits", total.CacheHits}, kv{"rooms_failed", failed})
	if unreadable+failed > 0 {
		return exitError(2)
	}
	return nil
}

// countersJSON names read counters as the text lines do.
func countersJSON(c packstore.ReadCounters) map[string]int64 {
	return map[string]int64{"reads": c.Reads, "bytes": c.Bytes, "pages": c.Pages, "seeks": c.Seeks, "cache_hits": c.CacheHits}
}
