package roomrules

import (
	"cmp"
	"errors"
	"math/rand"
	"slices"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/testrooms/smallroom"
)

// mapSource is the resolver.EventSource over a whole room, none rejected.
type mapSource map[string]gomatrixserverlib.PDU

func (m mapSource) Event(id string) (gomatrixserverlib.PDU, error) {
	if p, ok := m[id]; ok {
		return p, nil
	}
	return nil, errors.New("no such event")
}

func (m mapSource) Rejected(string) bool { return false }

// TestResolveAsResolveMaps: for generated rooms of every room version (1-12,
// testrooms/smallroom), Resolve of states handed over as event lists, with only a
// loader to reach the auth chains, gives what resolver.ResolveMaps gives over the
// same states as maps with every event at hand, or fails where it fails. The
// states are random: per state, each state key of the room keeps one of its events
// or is left out, so keys conflict, go missing from some states, or agree.
func TestResolveAsResolveMaps(t *testing.T) {
	resolved, failed := 0, 0
	for seed := int64(1); seed <= 48; seed++ {
		version := smallroom.Versions[seed%int64(len(smallroom.Versions))]
		room, err := smallroom.Generate(seed, smallroom.Options{Version: version})
		if err != nil {
			t.Fatal(err)
		}
		rd, err := room.Hashed()
		if err != nil {
			t.Fatal(err)
		}
		all := mapSource{}
		byKey := map[resolver.Key][]gomatrixserverlib.PDU{}
		for _, p := range rd.PDUs {
			all[p.EventID()] = p
			if p.StateKey() != nil {
				k := resolver.Key{Type: p.Type(), StateKey: *p.StateKey()}
				byKey[k] = append(byKey[k], p)
			}
		}
		keys := make([]resolver.Key, 0, len(byKey))
		for k := range byKey {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b resolver.Key) int {
			return cmp.Or(cmp.Compare(a.Type, b.Type), cmp.Compare(a.StateKey, b.StateKey))
		})
		rng := rand.New(rand.NewSource(seed))
		for round := 0; round < 4; round++ {
			states := make([][]gomatrixserverlib.PDU, 2+rng.Intn(2))
			maps := make([]resolver.StateMap, len(states))
			for i := range states {
				maps[i] = resolver.StateMap{}
				for _, k := range keys {
					evs := byKey[k]
					j := rng.Intn(len(evs) + 1)
					if j == len(evs) && k.Type != "m.room.create" {
						continue // absent from this state
					}
					j = min(j, len(evs)-1)
					states[i] = append(states[i], evs[j])
					maps[i][k] = evs[j].EventID()
				}
			}
			src := Source{Load: func(ids []string) ([]gomatrixserverlib.PDU, error) {
				var out []gomatrixserverlib.PDU
				for _, id := range ids {
					if p, ok := all[id]; ok {
						out = append(out, p)
					}
				}
				return out, nil
			}}
			got, gotErr := Resolve(gomatrixserverlib.RoomVersion(version), states, src)
			want, wantErr := resolver.ResolveMaps(gomatrixserverlib.RoomVersion(version), maps, all)
			if (gotErr == nil) != (wantErr == nil) {
				t.Fatalf("seed %d v%s round %d: Resolve error %v, ResolveMaps error %v", seed, version, round, gotErr, wantErr)
			}
			if gotErr != nil {
				failed++
				continue
			}
			var gotIDs, wantIDs []string
			for _, p := range got {
				gotIDs = append(gotIDs, p.EventID())
			}
			for _, id := range want {
				wantIDs = append(wantIDs, id)
			}
			slices.Sort(wantIDs)
			wantIDs = slices.Compact(wantIDs)
			if !slices.Equal(gotIDs, wantIDs) {
				t.Fatalf("seed %d v%s round %d: Resolve\n got %v\nwant %v", seed, version, round, gotIDs, wantIDs)
			}
			resolved++
		}
	}
	t.Logf("%d resolutions equal to ResolveMaps, %d failing in both", resolved, failed)
	if resolved == 0 {
		t.Fatal("no resolution succeeded: the test compares nothing")
	}
}
