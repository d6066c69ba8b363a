package resolver_test

import (
	"fmt"
	"github.com/mtxdb/mtxdb/roomstate/roomstatetest"
	"path/filepath"
	"sort"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/testrooms"
	"github.com/mtxdb/mtxdb/testrooms/gen"
)

// replayedRoom imports and replays one bundled room into a fresh in-memory store.
func replayedRoom(t testing.TB, dir string) *roomstate.Room {
	t.Helper()
	room, err := testrooms.ImportReplayed(packstore.NewMemStorage(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return room
}

// replayedResolver is replayedRoom with a Resolver over it and its event IDs.
func replayedResolver(t testing.TB, dir string) (*roomstate.Room, *resolver.Resolver, []string) {
	t.Helper()
	room := replayedRoom(t, dir)
	r, err := resolver.New(room)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := room.EventIDs()
	if err != nil {
		t.Fatal(err)
	}
	return room, r, ids
}

// generatedRoom generates a room (testrooms/gen) into a temporary directory and
// returns the directory.
func generatedRoom(t testing.TB, seed uint64, events, servers int, version string) string {
	t.Helper()
	opts := gen.DefaultOptions()
	opts.Seed, opts.Events, opts.Servers, opts.RoomVersion = seed, events, servers, version
	dir := filepath.Join(t.TempDir(), "gen-v"+version)
	if _, err := gen.Generate(opts, dir, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// stateMap reads a stored snapshot as a StateMap.
func stateMap(t testing.TB, room *roomstate.Room, eventID string, after bool) resolver.StateMap {
	ctx := t.Context()
	t.Helper()
	st, ok, err := room.EventState(eventID)
	if err != nil || !ok {
		t.Fatalf("state of %s: %v %v", eventID, ok, err)
	}
	root := st.Before
	if after {
		root = st.After
	}
	entries, err := roomstatetest.Entries(ctx, room, room.NewReader(), root)
	if err != nil {
		t.Fatal(err)
	}
	out := resolver.StateMap{}
	for k, v := range entries {
		typ, sk, _ := cut(k)
		out[resolver.Key{Type: typ, StateKey: sk}] = v
	}
	return out
}

// mergeInputs returns the stored states after a merge event's prev_events, or nil
// when the event has fewer than two.
func mergeInputs(t testing.TB, room *roomstate.Room, id string) []resolver.StateMap {
	t.Helper()
	m, err := room.Meta(id)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.PrevEvents) < 2 {
		return nil
	}
	var maps []resolver.StateMap
	for _, p := range m.PrevEvents {
		maps = append(maps, stateMap(t, room, p, true))
	}
	return maps
}

func cut(k string) (string, string, bool) {
	for i := 0; i < len(k); i++ {
		if k[i] == 0 {
			return k[:i], k[i+1:], true
		}
	}
	return k, "", false
}

// TestStorageMatchesMaps: at every event with two or more prev_events in the real
// rooms, the state before it as replay stored it (HAMT diff, conflict-sized loads,
// auth difference by forward search) equals ResolveMaps over the whole state maps
// after its prev_events (every event read, auth chains of every state event).
func TestStorageMatchesMaps(t *testing.T) {
	dirs, err := recorded.RoomDirs(filepath.Join(testrooms.Dir(), "real"))
	if err != nil {
		t.Fatal(err)
	}
	// Generated rooms have what the real ones lack: many merges, conflicting power
	// events, rejections; v12 exercises state resolution v2.1.
	for _, rv := range []string{"10", "11", "12"} {
		dirs = append(dirs, generatedRoom(t, 3, 400, 4, rv))
	}
	merges := 0
	for _, dir := range dirs {
		room, r, ids := replayedResolver(t, dir)
		order := authOrder(t, r, ids)
		for _, id := range ids {
			maps := mergeInputs(t, room, id)
			if maps == nil {
				continue
			}
			want, err := resolver.ResolveMaps(gomatrixserverlib.RoomVersion(room.Head().RoomVersion), maps, plainSource{r})
			if err != nil {
				t.Fatalf("%s %s: %v", filepath.Base(dir), id, err)
			}
			if d := diffMaps(stateMap(t, room, id, false), want); d != "" {
				t.Errorf("%s: state before %s: storage path differs from whole maps: %s", filepath.Base(dir), id, d)
			}
			// The same through a source that numbers events (a GraphSource with its own AuthOrder): step 1's
			// auth-chain walk then stops below the full conflicted set.
			ordered, err := resolver.ResolveMaps(gomatrixserverlib.RoomVersion(room.Head().RoomVersion), maps, orderedSource{r, order})
			if err != nil {
				t.Fatalf("%s %s: with its own AuthOrder: %v", filepath.Base(dir), id, err)
			}
			if d := diffMaps(ordered, want); d != "" {
				t.Errorf("%s: state before %s: own-AuthOrder source differs: %s", filepath.Base(dir), id, d)
			}
			merges++
		}
	}
	if merges == 0 {
		t.Fatal("no merge events in the real rooms")
	}
	t.Logf("%d merge events compared", merges)
}

// plainSource is the Resolver as a bare EventSource: the reference path reads
// auth events from the PDUs and walks whole auth chains (no GraphSource).
type plainSource struct{ r *resolver.Resolver }

func (p plainSource) Event(id string) (gomatrixserverlib.PDU, error) { return p.r.Event(id) }
func (p plainSource) Rejected(id string) bool                        { return p.r.Rejected(id) }

// orderedSource is a Resolver whose AuthOrder is replaced by a number computed
// here (resolver.GraphSource).
type orderedSource struct {
	*resolver.Resolver
	order map[string]int64
}

func (o orderedSource) AuthOrder(id string) (int64, error) {
	n, ok := o.order[id]
	if !ok {
		return 0, fmt.Errorf("no order for %s", id)
	}
	return n, nil
}

// authOrder numbers events in a post-order of the auth graph (auth events first),
// computed here rather than taken from arrival order.
func authOrder(t testing.TB, r *resolver.Resolver, ids []string) map[string]int64 {
	t.Helper()
	order := map[string]int64{}
	next := int64(0)
	var visit func(id string)
	visit = func(id string) {
		if _, done := order[id]; done {
			return
		}
		order[id] = -1 // on the stack; auth graphs have no cycles
		auth, err := r.AuthEvents(id)
		if err != nil {
			t.Fatalf("auth events of %s: %v", id, err)
		}
		for _, a := range auth {
			visit(a)
		}
		next++
		order[id] = next
	}
	for _, id := range ids {
		visit(id)
	}
	return order
}

// TestAuthOrderIsTopological: the Resolver's AuthOrder (auth depth) numbers every
// event above each of its auth events, in every real room.
func TestAuthOrderIsTopological(t *testing.T) {
	dirs, err := recorded.RoomDirs(filepath.Join(testrooms.Dir(), "real"))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, dir := range dirs[:40] {
		_, r, ids := replayedResolver(t, dir)
		for _, id := range ids {
			n, err := r.AuthOrder(id)
			if err != nil {
				t.Fatalf("%s: AuthOrder(%s): %v", filepath.Base(dir), id, err)
			}
			auth, err := r.AuthEvents(id)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range auth {
				if na, err := r.AuthOrder(a); err != nil || na >= n {
					t.Fatalf("%s: AuthOrder(%s) = %d, of its auth event %s = %d (%v)", filepath.Base(dir), id, n, a, na, err)
				}
			}
			checked++
		}
	}
	t.Logf("%d events checked", checked)
}

// TestConflictedSubgraphWalks: at every merge of a generated v12 room, v2.1's
// conflicted subgraph of the merge's conflicted events is the same from the
// ancestors walk alone, from the descendants walk alone, from both in lockstep
// (each over the events alone, over the GraphSource methods by event ID and over
// the auth index by handle), and by brute force here
// (every event of the conflicted events' auth chains whose own auth chain holds a
// conflicted event); so is step 1's power subset of a full conflicted set (the
// subgraph and the conflicted events' auth events).
func TestConflictedSubgraphWalks(t *testing.T) {
	room, r, ids := replayedResolver(t, generatedRoom(t, 11, 1500, 5, "12"))
	chains := map[string]map[string]bool{}
	var chainOf func(id string) map[string]bool
	chainOf = func(id string) map[string]bool {
		if c, ok := chains[id]; ok {
			return c
		}
		c := map[string]bool{}
		auth, err := r.AuthEvents(id)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range auth {
			c[a] = true
			for x := range chainOf(a) {
				c[x] = true
			}
		}
		chains[id] = c
		return c
	}
	merges, nonTrivial, nonTrivialX := 0, 0, 0
	for _, id := range ids {
		maps := mergeInputs(t, room, id)
		if maps == nil {
			continue
		}
		conflicted := map[string]bool{}
		for _, a := range maps {
			for k, v := range a {
				for _, b := range maps {
					if w, ok := b[k]; !ok || w != v {
						conflicted[v] = true
					}
				}
			}
			for _, b := range maps {
				for k, w := range b {
					if _, ok := a[k]; !ok {
						conflicted[w] = true
					}
				}
			}
		}
		if len(conflicted) == 0 {
			continue
		}
		want := map[string]bool{}
		for c := range conflicted {
			want[c] = true
			for x := range chainOf(c) {
				for d := range conflicted {
					if chainOf(x)[d] {
						want[x] = true
					}
				}
			}
		}
		if len(want) > len(conflicted) {
			nonTrivial++
		}
		// Step 1's power subset of a full conflicted set: here the subgraph and
		// the conflicted events' auth events.
		full := map[string]bool{}
		for x := range want {
			full[x] = true
		}
		for c := range conflicted {
			auth, err := r.AuthEvents(c)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range auth {
				full[a] = true
			}
		}
		var power []string
		for f := range full {
			if isPower(t, r, f) {
				power = append(power, f)
			}
		}
		wantX := map[string]bool{}
		for f := range full {
			for _, p := range power {
				if f == p || chainOf(p)[f] {
					wantX[f] = true
				}
			}
		}
		if len(wantX) > len(power) {
			nonTrivialX++
		}
		for _, mode := range resolver.WalkModes {
			for _, d := range []string{"up", "down", "both"} {
				restore := func() {}
				if d != "both" {
					restore = resolver.ForceWalk(d)
				}
				got, err := resolver.ConflictedSubgraph(mode, r, conflicted)
				if err != nil {
					t.Fatalf("%s: %s walk %s: %v", id, mode, d, err)
				}
				x, err := resolver.PowerSubset(mode, r, sortedKeys(full))
				restore()
				if err != nil {
					t.Fatalf("%s: %s walk %s: %v", id, mode, d, err)
				}
				if fmt.Sprint(sortedKeys(got)) != fmt.Sprint(sortedKeys(want)) {
					t.Fatalf("merge %s, %s walk %s: subgraph %v, want %v", id, mode, d, sortedKeys(got), sortedKeys(want))
				}
				sort.Strings(x)
				if fmt.Sprint(x) != fmt.Sprint(sortedKeys(wantX)) {
					t.Fatalf("merge %s, %s walk %s: power subset %v, want %v", id, mode, d, x, sortedKeys(wantX))
				}
			}
		}
		merges++
	}
	if nonTrivial < 10 || nonTrivialX < 10 {
		t.Fatalf("of %d merges, %d have a subgraph beyond their conflicted events and %d a power subset beyond its power events: too few to test", merges, nonTrivial, nonTrivialX)
	}
	t.Logf("%d merges, %d with a subgraph beyond the conflicted events, %d with a power subset beyond its power events", merges, nonTrivial, nonTrivialX)
}

// isPower: the spec's power events (Matrix spec v1.19, room version 2, "State
// resolution", "Power events"), and m.room.create.
func isPower(t testing.TB, r *resolver.Resolver, id string) bool {
	t.Helper()
	p, err := r.Event(id)
	if err != nil {
		t.Fatal(err)
	}
	switch p.Type() {
	case "m.room.power_levels", "m.room.join_rules", "m.room.create":
		return *p.StateKey() == ""
	case "m.room.member":
		m, _ := p.Membership()
		return (m == "leave" || m == "ban") && string(p.SenderID()) != *p.StateKey()
	}
	return false
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
