package main

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/roomrecord"
)

func stateCmd() *cobra.Command {
	var store, room, event string
	var before, asJSON bool
	c := &cobra.Command{
		Use:   "state --store DIR --room ROOM_ID [--event EVENT_ID [--before]] [--json]",
		Short: "Print a room's current state, or the state after (or before) one event",
		Long: `State prints one state snapshot of a replayed room as lines of
"event_type<TAB>state_key<TAB>event_id", sorted: the current state by default, the
state after --event, or the state before it with --before. A field holding a tab,
a control character (a newline, ...) or bytes that are not UTF-8, or beginning with
a double quote, is printed as a Go-quoted string ("a\tb"), so that each line is one
state entry. For an event replay rejected, a first line "# rejected EVENT_ID:
reason" names the authorization rule. With --json each line is a JSON object:
{"kind":"rejected","event_id","reason"} first for a rejected event, then
{"kind":"state","type","state_key","event_id"} per entry.`,
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
			out := cmd.OutOrStdout()
			if event != "" {
				// A rejected event's state after is its state before; say why.
				if es, ok, err := r.EventState(event); err == nil && ok && es.Rejected {
					if asJSON {
						printLine(out, true, "rejected", kv{"event_id", event}, kv{"reason", es.Reason})
					} else {
						fmt.Fprintf(out, "# rejected %s: %s\n", event, es.Reason)
					}
				}
			}
			entries, err := r.State(ctx, r.NewReader(), root)
			if err != nil {
				return err
			}
			keys := slices.SortedFunc(maps.Keys(entries), func(a, b roomrecord.StatePair) int {
				return cmp.Or(cmp.Compare(a.Type, b.Type), cmp.Compare(a.StateKey, b.StateKey))
			})
			for _, k := range keys {
				if asJSON {
					printLine(out, true, "state", kv{"type", k.Type}, kv{"state_key", k.StateKey}, kv{"event_id", entries[k]})
					continue
				}
				fmt.Fprintln(out, stateField(k.Type)+"\t"+stateField(k.StateKey)+"\t"+stateField(entries[k]))
			}
			return nil
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp)
	c.Flags().StringVar(&room, "room", "", "room ID")
	c.Flags().StringVar(&event, "event", "", "event ID (default: the current state)")
	c.Flags().BoolVar(&before, "before", false, "the state before --event instead of after it")
	jsonFlag(c, &asJSON)
	return c
}

// stateField is a field of a state line as printed: Go-quoted (strconv.Quote)
// when it holds a tab, a control character or bytes that are not UTF-8, or begins
// with a double quote, so that no field can end its line or its column early, or
// pass for a quoted one; as it is otherwise.
func stateField(f string) string {
	if strings.HasPrefix(f, `"`) || !utf8.ValidString(f) || strings.ContainsFunc(f, unicode.IsControl) {
		return strconv.Quote(f)
	}
	return f
}
