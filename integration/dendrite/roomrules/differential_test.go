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

// loaderOf is a Source whose Load answers from the events of m.
func loaderOf(m mapSource) Source {
	return Source{Load: func(ids []string) ([]gomatrixserverlib.PDU, error) {
		var out []gomatrixserverlib.PDU
		for _, id := range ids {
			if p, ok := m[id]; ok {
				out = append(out, p)
			}
		}
		return out, nil
	}}
}

// TestResolveAsResolveMaps: for generated rooms of every room version (1-12,
// testrooms/smallroom), Resolve of states handed over as event lists, with only a
// loader to reach the auth chains, gives what resolver.ResolveMaps gives over the
// same states as maps with every event at hand, or fails where it fails. The
// states are random: per state, each state key of the room keeps one of its events
// or is left out, so keys conflict, go missing from some states, or agree. The
// same states resolved by ResolveSnapshots (their diff, a lookup into the
// unconflicted map, and the room's graph built from event rows numbered as a
// server numbers them) give the same state in room versions 2-12.
func TestResolveAsResolveMaps(t *testing.T) {
	resolved, failed, fromSnapshots := 0, 0, 0
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
		graph, nidOf, nidKey := graphOf(rd.PDUs)
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
			src := loaderOf(all)
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
			snapIDs, err := resolveAsSnapshots(gomatrixserverlib.RoomVersion(version), maps, graph, nidOf, nidKey, src)
			switch {
			case errors.Is(err, ErrUseLists):
				if version != "1" {
					t.Fatalf("seed %d v%s round %d: ResolveSnapshots refused the version", seed, version, round)
				}
			case err != nil:
				t.Fatalf("seed %d v%s round %d: ResolveSnapshots: %v", seed, version, round, err)
			default:
				if !slices.Equal(snapIDs, wantIDs) {
					t.Fatalf("seed %d v%s round %d: ResolveSnapshots\n got %v\nwant %v", seed, version, round, snapIDs, wantIDs)
				}
				fromSnapshots++
			}
		}
	}
	t.Logf("%d resolutions equal to ResolveMaps (%d of them also from snapshots), %d failing in both", resolved, fromSnapshots, failed)
	if resolved == 0 || fromSnapshots == 0 {
		t.Fatal("no resolution succeeded: the test compares nothing")
	}
}

// graphOf builds a RoomGraph from a room's events in order, numbered as a
// server numbers them: event NIDs from 1, type and state key NIDs interned. It
// returns the NID of each event ID and of each key.
func graphOf(pdus []gomatrixserverlib.PDU) (*RoomGraph, map[string]int64, map[resolver.Key]NIDKey) {
	nidOf, nidKey := map[string]int64{}, map[resolver.Key]NIDKey{}
	types, keys := map[string]int64{}, map[string]int64{}
	intern := func(m map[string]int64, s string) int64 {
		if n, ok := m[s]; ok {
			return n
		}
		m[s] = int64(len(m) + 1)
		return m[s]
	}
	rows := make([]EventRow, 0, len(pdus))
	for i, p := range pdus {
		nid := int64(i + 1)
		nidOf[p.EventID()] = nid
		row := EventRow{NID: nid, EventID: p.EventID(), Type: p.Type(), StateKey: p.StateKey()}
		if p.StateKey() != nil {
			row.Key = NIDKey{Type: intern(types, p.Type()), StateKey: intern(keys, *p.StateKey())}
			nidKey[resolver.Key{Type: p.Type(), StateKey: *p.StateKey()}] = row.Key
		}
		for _, a := range p.AuthEventIDs() {
			row.AuthNIDs = append(row.AuthNIDs, nidOf[a])
		}
		rows = append(rows, row)
	}
	g := NewRoomGraph()
	// In two parts: the second arrives as a refresh does.
	half := len(rows) / 2
	g.Add(rows[:half])
	g.Add(rows[half:])
	return g, nidOf, nidKey
}

// resolveAsSnapshots resolves state maps through ResolveSnapshots, with the
// conflicts and the unconflicted lookup a diff of the states' snapshots gives,
// and returns the resolved state's event IDs, sorted.
func resolveAsSnapshots(version gomatrixserverlib.RoomVersion, maps []resolver.StateMap, g *RoomGraph,
	nidOf map[string]int64, nidKey map[resolver.Key]NIDKey, src Source) ([]string, error) {
	st := snapshotStatesOf(maps, nidOf, nidKey)
	changes, err := ResolveSnapshots(version, st, g, nil, src)
	if err != nil {
		return nil, err
	}
	return applyChanges(maps[0], st, changes, nidOf, nidKey), nil
}

// snapshotStatesOf gives state maps as a diff of snapshots does: the keys that
// are missing from some state or differ, and a lookup of the others.
func snapshotStatesOf(maps []resolver.StateMap, nidOf map[string]int64, nidKey map[resolver.Key]NIDKey) SnapshotStates {
	keyOf := map[NIDKey]resolver.Key{}
	for k, nk := range nidKey {
		keyOf[nk] = k
	}
	all := map[resolver.Key]bool{}
	for _, m := range maps {
		for k := range m {
			all[k] = true
		}
	}
	st := SnapshotStates{N: len(maps)}
	conflicted := map[resolver.Key]bool{}
	for k := range all {
		c := Conflict{Key: nidKey[k], Events: make([]int64, len(maps))}
		differ := false
		for i, m := range maps {
			c.Events[i] = nidOf[m[k]] // 0 when absent
			differ = differ || c.Events[i] != c.Events[0]
		}
		if differ {
			conflicted[k] = true
			st.Conflicts = append(st.Conflicts, c)
		}
	}
	st.Unconflicted = func(nk NIDKey) (int64, bool, error) {
		k, ok := keyOf[nk]
		if !ok || conflicted[k] {
			return 0, false, nil
		}
		id, ok := maps[0][k]
		return nidOf[id], ok, nil
	}
	return st
}

// applyChanges applies ResolveSnapshots' changes to the unconflicted part of
// base and returns the state's event IDs, sorted.
func applyChanges(base resolver.StateMap, st SnapshotStates, changes []Change, nidOf map[string]int64, nidKey map[resolver.Key]NIDKey) []string {
	keyOf := map[NIDKey]resolver.Key{}
	for k, nk := range nidKey {
		keyOf[nk] = k
	}
	idOf := map[int64]string{}
	for id, nid := range nidOf {
		idOf[nid] = id
	}
	out := resolver.StateMap{}
	for k, id := range base {
		out[k] = id
	}
	for _, c := range st.Conflicts {
		delete(out, keyOf[c.Key])
	}
	for _, c := range changes {
		k := keyOf[c.Key]
		if c.Event == 0 {
			delete(out, k)
		} else {
			out[k] = idOf[c.Event]
		}
	}
	var ids []string
	for _, id := range out {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// TestResolveSnapshotsRefreshesGraph: a graph that lacks the newer half of the
// room's events fails with ErrStaleGraph when a state names one of them, and
// resolves as ResolveMaps once the rows callback hands it the rest.
func TestResolveSnapshotsRefreshesGraph(t *testing.T) {
	room, err := smallroom.Generate(7, smallroom.Options{Version: "10"})
	if err != nil {
		t.Fatal(err)
	}
	rd, err := room.Hashed()
	if err != nil {
		t.Fatal(err)
	}
	full, nidOf, nidKey := graphOf(rd.PDUs)
	all := mapSource{}
	for _, p := range rd.PDUs {
		all[p.EventID()] = p
	}
	src := loaderOf(all)
	// Two states: the first half's last state per key, and the whole room's.
	half := len(rd.PDUs) / 2
	stateOf := func(n int) resolver.StateMap {
		m := resolver.StateMap{}
		for _, p := range rd.PDUs[:n] {
			if p.StateKey() != nil {
				m[resolver.Key{Type: p.Type(), StateKey: *p.StateKey()}] = p.EventID()
			}
		}
		return m
	}
	maps := []resolver.StateMap{stateOf(half), stateOf(len(rd.PDUs))}
	want, err := resolver.ResolveMaps("10", maps, all)
	if err != nil {
		t.Fatal(err)
	}
	var wantIDs []string
	for _, id := range want {
		wantIDs = append(wantIDs, id)
	}
	slices.Sort(wantIDs)

	var rows []EventRow
	full.mu.Lock()
	for _, m := range full.metas {
		nid := nidOf[m.EventID]
		r := EventRow{NID: nid, EventID: m.EventID, Type: m.Type}
		if m.IsState {
			sk := m.StateKey
			r.StateKey, r.Key = &sk, nidKey[resolver.Key{Type: m.Type, StateKey: sk}]
		}
		for _, a := range m.AuthEvents {
			r.AuthNIDs = append(r.AuthNIDs, nidOf[a])
		}
		rows = append(rows, r)
	}
	full.mu.Unlock()

	stale := NewRoomGraph()
	stale.Add(rows[:half])
	if _, err := resolveAsSnapshots("10", maps, stale, nidOf, nidKey, src); !errors.Is(err, ErrStaleGraph) {
		t.Fatalf("stale graph: got %v, want ErrStaleGraph", err)
	}
	refreshed := NewRoomGraph()
	refreshed.Add(rows[:half])
	st := snapshotStatesOf(maps, nidOf, nidKey)
	asked := int64(-1)
	changes, err := ResolveSnapshots("10", st, refreshed, func(after int64) ([]EventRow, error) {
		asked = after
		return rows[half:], nil
	}, src)
	if err != nil {
		t.Fatal(err)
	}
	if asked != rows[half-1].NID {
		t.Errorf("rows asked after NID %d, want %d", asked, rows[half-1].NID)
	}
	if got := applyChanges(maps[0], st, changes, nidOf, nidKey); !slices.Equal(got, wantIDs) {
		t.Fatalf("refreshed graph:\n got %v\nwant %v", got, wantIDs)
	}
}
