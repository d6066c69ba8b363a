package statetables

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/matrix-org/dendrite/roomserver/types"
)

// TestDiffStatesModel: states after random events of a room (a random snapshot,
// or none, plus the event's own entry when it is an accepted state event)
// diffed by DiffStates give exactly the keys on which the model's states differ,
// with each state's event; StateLookup gives the model's entry for random keys.
func TestDiffStatesModel(t *testing.T) {
	eachPlace(t, func(t *testing.T, p place) {
		rng := rand.New(rand.NewPCG(seed(t), 2))
		s := p.open()
		s.chainLimit = 4 // chained snapshots and checkpoints both
		const room = types.RoomNID(5)
		snaps := []types.StateSnapshotNID{0}
		byNID := map[types.StateSnapshotNID]state{0: {}}
		for i := 0; i < 40; i++ {
			base := snaps[rng.IntN(len(snaps))]
			d := randomDelta(rng, 1+rng.IntN(8))
			bn, err := s.BulkInsertStateData(ctx, nil, d)
			if err != nil {
				t.Fatal(err)
			}
			blocks := types.StateBlockNIDs{bn}
			if base != 0 {
				blocks = types.StateBlockNIDs{types.StateBlockNID(base), bn}
			}
			nid, err := s.InsertState(ctx, nil, room, blocks)
			if err != nil {
				t.Fatal(err)
			}
			snaps = append(snaps, nid)
			byNID[nid] = applyDelta(byNID[base], d)
		}
		// A fresh Store: chained snapshots are materialised from their records.
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = p.open()
		defer s.Close()
		for round := 0; round < 200; round++ {
			n := 1 + rng.IntN(4)
			states := make([]types.StateAtEvent, n)
			after := make([]state, n)
			for i := range states {
				sn := snaps[rng.IntN(len(snaps))]
				states[i].BeforeStateSnapshotNID = sn
				after[i] = byNID[sn]
				if rng.IntN(2) == 0 {
					e := randomDelta(rng, 1)[0]
					states[i].StateEntry = e
					states[i].IsRejected = rng.IntN(4) == 0
					if !states[i].IsRejected {
						after[i] = applyDelta(after[i], []types.StateEntry{e})
						after[i][e.StateKeyTuple] = e.EventNID
					}
				}
			}
			keys, events, err := s.DiffStates(ctx, room, states)
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			got := map[types.StateKeyTuple][]types.EventNID{}
			for i, k := range keys {
				got[k] = events[i]
			}
			want := map[types.StateKeyTuple][]types.EventNID{}
			for _, a := range after {
				for k := range a {
					evs := make([]types.EventNID, n)
					differ := false
					for i := range after {
						evs[i] = after[i][k]
						differ = differ || evs[i] != evs[0]
					}
					if differ {
						want[k] = evs
					}
				}
			}
			if len(got) != len(want) || len(keys) != len(got) {
				t.Fatalf("round %d: %d conflicted keys (%d distinct), want %d", round, len(keys), len(got), len(want))
			}
			for k, evs := range want {
				if !slices.Equal(got[k], evs) {
					t.Fatalf("round %d: key %v: got %v, want %v", round, k, got[k], evs)
				}
			}
			probe := randomDelta(rng, 6)
			tuples := make([]types.StateKeyTuple, len(probe))
			for i, e := range probe {
				tuples[i] = e.StateKeyTuple
			}
			lookup, err := s.StateLookup(ctx, room, states[0])
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range tuples {
				found, err := lookup(k)
				if err != nil {
					t.Fatal(err)
				}
				if found != after[0][k] {
					t.Fatalf("round %d: StateLookup %v = %d, want %d", round, k, found, after[0][k])
				}
			}
		}
		bn, err := s.BulkInsertStateData(ctx, nil, randomDelta(rng, 2))
		if err != nil {
			t.Fatal(err)
		}
		other, err := s.InsertState(ctx, nil, room+1, types.StateBlockNIDs{bn})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.DiffStates(ctx, room, []types.StateAtEvent{{BeforeStateSnapshotNID: other}}); err == nil {
			t.Error("a snapshot of another room was diffed")
		}
		var missing types.MissingStateError
		if _, _, err := s.DiffStates(ctx, room, []types.StateAtEvent{{BeforeStateSnapshotNID: SnapshotNID(room, 999999)}}); !errors.As(err, &missing) {
			t.Errorf("unknown snapshot NID: %v, want types.MissingStateError", err)
		}
		if _, err := s.EventRows(ctx, room, 0); !errors.Is(err, ErrNoEventRows) {
			t.Errorf("EventRows without a roomserver database: %v", err)
		}
	})
}
