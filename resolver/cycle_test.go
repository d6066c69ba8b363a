package resolver_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
)

// cyclicEvents returns v1 events of room003's room whose prev_events and
// auth_events cannot be ordered, one shape per entry, each with a child that
// descends from it: an event naming itself in prev_events, one naming itself in
// auth_events, two naming each other, and a state event whose auth event
// descends from it. The last of base (room003's PDU lines) is their prev event
// where they need one outside the cycle.
func cyclicEvents(t *testing.T, base []string) map[string][]string {
	t.Helper()
	var msg map[string]any // a message of user1, whose auth events are valid
	require.NoError(t, json.Unmarshal([]byte(base[8]), &msg))
	var last map[string]any
	require.NoError(t, json.Unmarshal([]byte(base[len(base)-1]), &last))
	ref := func(id string) []any { return []any{id, map[string]any{"sha256": "AAAA"}} }
	mk := func(id string, prev []string, extraAuth []string, edit func(map[string]any)) string {
		e := map[string]any{}
		for k, v := range msg {
			e[k] = v
		}
		e["event_id"] = id
		var ps []any
		for _, p := range prev {
			ps = append(ps, ref(p))
		}
		e["prev_events"] = ps
		auth := append([]any(nil), msg["auth_events"].([]any)...)
		for _, a := range extraAuth {
			auth = append(auth, ref(a))
		}
		e["auth_events"] = auth
		e["depth"] = 1000
		if edit != nil {
			edit(e)
		}
		b, err := json.Marshal(e)
		require.NoError(t, err)
		return string(b)
	}
	tip := last["event_id"].(string)
	topic := func(e map[string]any) {
		e["type"], e["state_key"], e["content"] = "m.room.topic", "", map[string]any{"topic": "loop"}
	}
	return map[string][]string{
		"self prev": {
			mk("$selfprev:server1.test", []string{"$selfprev:server1.test"}, nil, nil),
			mk("$selfprevchild:server1.test", []string{"$selfprev:server1.test"}, nil, nil),
		},
		"self auth": {
			mk("$selfauth:server1.test", []string{tip}, []string{"$selfauth:server1.test"}, topic),
			mk("$selfauthchild:server1.test", []string{"$selfauth:server1.test"}, nil, nil),
		},
		"mutual prev": {
			mk("$mutuala:server1.test", []string{"$mutualb:server1.test"}, nil, nil),
			mk("$mutualb:server1.test", []string{"$mutuala:server1.test"}, nil, nil),
			mk("$mutualchild:server1.test", []string{"$mutualb:server1.test"}, nil, nil),
		},
		"auth descendant": {
			mk("$authdesc:server1.test", []string{tip}, []string{"$authdescmsg:server1.test"}, topic),
			mk("$authdescmsg:server1.test", []string{"$authdesc:server1.test"}, nil, nil),
			mk("$authdescchild:server1.test", []string{"$authdescmsg:server1.test"}, nil, nil),
		},
	}
}

// TestReplayLeavesOutCycles: events on a prev/auth cycle, and their descendants,
// are left out as outliers and named (ReplayResult.Cyclic); the rest of
// the room replays to the state its server recorded, and an event after the tip
// that does not descend from the cycle is replayed.
func TestReplayLeavesOutCycles(t *testing.T) {
	ctx := t.Context()
	base, exp := realRoomLines(t, "room003")
	for name, evs := range cyclicEvents(t, base) {
		t.Run(name, func(t *testing.T) {
			st := roomstate.New(packstore.NewMemStorage())
			in := strings.Join(append(append([]string(nil), base...), evs...), "\n")
			res, err := st.Import(ctx, strings.NewReader(in), "cycle", roomstate.ImportOptions{AnyOrder: true})
			require.NoError(t, err)
			require.Len(t, res.Refused, 0)
			room, err := st.Room(ctx, res.Rooms[0])
			require.NoError(t, err)
			rr, err := resolver.Replay(ctx, room, resolver.ReplayOptions{})
			require.NoError(t, err, "a cycle stopped the replay")
			require.Len(t, rr.Cyclic, len(evs))
			require.Equal(t, len(evs), rr.Outliers)
			require.Equal(t, len(base), rr.Computed)
			for _, id := range rr.Cyclic {
				require.Contains(t, in, `"event_id":"`+id+`"`)
			}
			cr, err := recorded.Compare(ctx, room, exp, func(m recorded.Mismatch) { t.Error(m) })
			require.NoError(t, err)
			require.Equal(t, len(exp.After), cr.Events)

			// The room's check takes them for outliers, not for lost state records.
			ck, err := room.Check(ctx, nil)
			require.NoError(t, err)
			require.Equal(t, len(evs), ck.Dangling)

			// A second replay leaves them out again and computes nothing.
			rr, err = resolver.Replay(ctx, room, resolver.ReplayOptions{})
			require.NoError(t, err)
			require.Len(t, rr.Cyclic, len(evs))
			require.Equal(t, 0, rr.Computed)
		})
	}
}
