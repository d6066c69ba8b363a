package main

import (
	"fmt"
	"sort"

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
state after --event, or the state before it with --before. For an event replay
rejected, a first line "# rejected EVENT_ID: reason" names the authorization rule.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if room == "" {
				return fmt.Errorf("--room is required")
			}
			eng, st, err := openStoreMode(store, false, true)
			if err != nil {
				return err
			}
			defer eng.Close()
			r, err := st.Room(ctx, room)
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
				root = r.Head().CurrentState
			case before:
				root, err = r.StateBefore(event)
			default:
				root, err = r.StateAfter(event)
			}
			if err != nil {
				return err
			}
			if event != "" {
				// A rejected event's state after is its state before; say why.
				if es, ok, err := r.EventState(event); err == nil && ok && es.Rejected {
					fmt.Fprintf(cmd.OutOrStdout(), "# rejected %s: %s\n", event, es.Reason)
				}
			}
			entries, err := r.State(ctx, r.NewReader(), root)
			if err != nil {
				return err
			}
			lines := make([]string, 0, len(entries))
			for k, v := range entries {
				lines = append(lines, k.Type+"\t"+k.StateKey+"\t"+v)
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
