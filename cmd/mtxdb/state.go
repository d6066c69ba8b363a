package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/hamtstore"
)

func stateCmd() *cobra.Command {
	var store, room, event string
	var before bool
	c := &cobra.Command{
		Use:   "state --store DIR --room ROOM_ID [--event EVENT_ID [--before]]",
		Short: "Print a room's current state, or the state after (or before) one event",
		Long: `State prints one state snapshot of a replayed room as lines of
"event_type<TAB>state_key<TAB>event_id", sorted: the current state by default, the
state after --event, or the state before it with --before.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if room == "" {
				return fmt.Errorf("--room is required")
			}
			eng, st, err := openStoreMode(store, false, true)
			if err != nil {
				return err
			}
			defer eng.Close()
			r, err := st.Room(room)
			if err != nil {
				return err
			}
			var root hamtstore.NodeID
			switch {
			case event == "" && before:
				return fmt.Errorf("--before needs --event")
			case event == "":
				if !r.Head().Replayed {
					return fmt.Errorf("room %s is not replayed (mtxdb replay)", room)
				}
				root = r.CurrentState()
			case before:
				root, err = r.StateBefore(event)
			default:
				root, err = r.StateAfter(event)
			}
			if err != nil {
				return err
			}
			entries, err := r.StateEntries(r.NewReader(), root)
			if err != nil {
				return err
			}
			lines := make([]string, 0, len(entries))
			for k, v := range entries {
				lines = append(lines, strings.Replace(k, "\x00", "\t", 1)+"\t"+v)
			}
			sort.Strings(lines)
			for _, l := range lines {
				fmt.Fprintln(cmd.OutOrStdout(), l)
			}
			return nil
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp)
	c.Flags().StringVar(&room, "room", "", "room ID")
	c.Flags().StringVar(&event, "event", "", "event ID (default: the current state)")
	c.Flags().BoolVar(&before, "before", false, "the state before --event instead of after it")
	return c
}
