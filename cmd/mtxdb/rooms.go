package main

import (
	"fmt"
	"github.com/mtxdb/mtxdb/roomrecord"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/packstore"
)

// collectionStatser is an engine that can say what one collection holds
// (packstore.PackfileStorage.CollectionStats); rooms prints bytes only for those.
type collectionStatser interface {
	CollectionStats(coll packstore.ID) (records int, liveBytes int64, ok bool)
}

func roomsCmd() *cobra.Command {
	var store string
	var asJSON bool
	c := &cobra.Command{
		Use:   "rooms --store DIR [--json]",
		Short: "List every room: room ID, version, events, replayed or not, records, bytes",
		Long: `Rooms lists every room of the store, sorted by room ID, one line each: room ID,
room version, events imported, whether replay has computed the state of every event
(replayed), forward extremities, live records and live bytes (frame bytes of the
room's records in the shards, after compression; "-" when the store cannot say).
With --json each line is a JSON object ({"kind":"room", "room_id", "version",
"events", "replayed", "forward_extremities", "records", "bytes"}; records and bytes
null when unknown), and a last {"kind":"rooms","rooms":N,"unreadable":M} line. A room
collection whose head record cannot be read is a problem line (its room ID is in the
head) and the exit status is 2; the other rooms are listed. The store is opened
read-only.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			eng, st, err := openStoreMode(store, false, true)
			if err != nil {
				return err
			}
			defer eng.Close()
			rooms, bad, err := st.RoomsAndErrors(ctx)
			if err != nil {
				return err
			}
			cs, _ := st.Engine().(collectionStatser)
			out := cmd.OutOrStdout()
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			if !asJSON {
				fmt.Fprintln(tw, "ROOM\tVERSION\tEVENTS\tREPLAYED\tFORWARD_EXTREMITIES\tRECORDS\tBYTES")
			}
			for _, r := range rooms {
				h := r.Head()
				var records, bytes any
				if cs != nil {
					if n, b, ok := cs.CollectionStats(roomrecord.CollectionID(r.ID())); ok {
						records, bytes = n, b
					}
				}
				if asJSON {
					printLine(out, true, "room", kv{"room_id", h.RoomID}, kv{"version", h.RoomVersion}, kv{"events", h.Events}, kv{"replayed", h.Replayed},
						kv{"forward_extremities", len(h.ForwardExtremities)}, kv{"records", records}, kv{"bytes", bytes})
					continue
				}
				dash := func(v any) any {
					if v == nil {
						return "-"
					}
					return v
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%t\t%d\t%v\t%v\n", h.RoomID, h.RoomVersion, h.Events, h.Replayed, len(h.ForwardExtremities), dash(records), dash(bytes))
			}
			if !asJSON {
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			for _, h := range bad {
				printProblem(out, asJSON, "", h.Error())
			}
			printLine(out, asJSON, "rooms", kv{"rooms", len(rooms)}, kv{"unreadable", len(bad)})
			if len(bad) > 0 {
				return exitError(2)
			}
			return nil
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp)
	jsonFlag(c, &asJSON)
	return c
}
