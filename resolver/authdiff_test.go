package resolver_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/testrooms"
	"github.com/mtxdb/mtxdb/testrooms/gen"
)

// TestAuthDifferenceModel: at every merge (an event with two or more prev_events)
// of generated rooms of every generated version (10, 11, 12) and of the real rooms,
// the auth difference computed from the auth index (conflicted events' chains cut
// at the unconflicted map's same-key lineages, forward search through auth
// children) equals the brute-force one (Matrix spec v1.19, room version 2, "State
// resolution", "Auth difference": the union of the states' full auth chains, each
// the union of its events' auth chains, minus their intersection).
//
// It runs with the default lineage-cut depth, again on a larger v10 room (where
// walks must stop below a floor at least once), and
// with cuts searched from depth 1 (these rooms' lineages are short), where the
// test fails if no cut was made.
func TestAuthDifferenceModel(t *testing.T) {
	t.Run("default", func(t *testing.T) { authDifferenceModel(t, 600, []string{"10", "11", "12"}, true) })
	// A larger room: walks that meet events an earlier walk of the same
	// resolution visited (inUnconflictedChain's memo; a memo consulted before
	// asking whether the event itself is unconflicted failed here, not at 600),
	// and walks that enter a floor's lineage below the floor from the side,
	// where they stop (belowFloor); the test fails if none did.
	t.Run("4000-events", func(t *testing.T) {
		before := resolver.BelowFloorStops()
		authDifferenceModel(t, 4000, []string{"10"}, false)
		if stops := resolver.BelowFloorStops() - before; stops == 0 {
			t.Fatal("no walk stopped below a floor: the stop is not exercised")
		} else {
			t.Logf("%d walks stopped below a floor", stops)
		}
	})
	t.Run("cut-every-lineage", func(t *testing.T) {
		cuts, restore := resolver.SetMinCutDepth(1)
		defer restore()
		before := cuts()
		authDifferenceModel(t, 600, []string{"10", "11", "12"}, true)
		if made := cuts() - before; made == 0 {
			t.Fatal("no lineage cut was made: the cut is not exercised")
		} else {
			t.Logf("%d lineage cuts made", made)
		}
	})
}

func authDifferenceModel(t *testing.T, events int, versions []string, realRooms bool) {
	var dirs []string
	if realRooms {
		var err error
		if dirs, err = recorded.RoomDirs(filepath.Join(testrooms.Dir(), "real")); err != nil {
			t.Fatal(err)
		}
	}
	for _, rv := range versions {
		opts := gen.DefaultOptions()
		opts.Seed, opts.Events, opts.Servers, opts.RoomVersion = 5, events, 4, rv
		dir := filepath.Join(t.TempDir(), "gen-v"+rv)
		if _, err := gen.Generate(opts, dir, nil); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dir)
	}
	merges, nonEmpty := 0, 0
	for _, dir := range dirs {
		room, r, ids := replayedResolver(t, dir)
		chains := map[string]map[string]bool{} // event -> itself and its auth chain
		chainOf := func(id string) map[string]bool {
			if c, ok := chains[id]; ok {
				return c
			}
			c := map[string]bool{}
			stack := []string{id}
			for len(stack) > 0 {
				x := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				if c[x] {
					continue
				}
				c[x] = true
				auth, err := r.AuthEvents(x)
				if err != nil {
					t.Fatal(err)
				}
				stack = append(stack, auth...)
			}
			chains[id] = c
			return c
		}
		for _, id := range ids {
			maps := mergeInputs(t, room, id)
			if maps == nil {
				continue
			}
			full := make([]map[string]bool, len(maps))
			union := map[string]bool{}
			for i, m := range maps {
				full[i] = map[string]bool{}
				for _, e := range m { // the auth chain of e: its auth events' chains, not e
					auth, err := r.AuthEvents(e)
					if err != nil {
						t.Fatal(err)
					}
					for _, ae := range auth {
						for a := range chainOf(ae) {
							full[i][a] = true
						}
					}
				}
				for a := range full[i] {
					union[a] = true
				}
			}
			var want []string
			for a := range union {
				for _, f := range full {
					if !f[a] {
						want = append(want, a)
						break
					}
				}
			}
			slices.Sort(want)
			got, err := resolver.AuthDifferenceOf(r, maps)
			if err != nil {
				t.Fatalf("%s: merge %s: %v", filepath.Base(dir), id, err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s: merge %s: auth difference %v, brute force %v", filepath.Base(dir), id, got, want)
			}
			if merges%4 == 0 {
				// The same states repeated past 64 (two bit words a handle; the
				// next merge reuses the marks with one): the same difference.
				padded := slices.Repeat(maps, 65/len(maps)+1)
				if got, err := resolver.AuthDifferenceOf(r, padded); err != nil || !slices.Equal(got, want) {
					t.Fatalf("%s: merge %s, its %d states repeated to %d: auth difference %v (%v), brute force %v",
						filepath.Base(dir), id, len(maps), len(padded), got, err, want)
				}
			}
			merges++
			if len(want) > 0 {
				nonEmpty++
			}
		}
	}
	t.Logf("%d merges compared, %d with a non-empty auth difference", merges, nonEmpty)
	if nonEmpty == 0 {
		t.Fatal("no merge with an auth difference: the comparison tests nothing")
	}
}
