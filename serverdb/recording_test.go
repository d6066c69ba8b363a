package serverdb

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/mtxdb/mtxdb/recorded"
)

// TestAppendGroup: appendGroup writes what encoding/json writes for a
// recorded.Group, for random groups whose strings hold quotes, backslashes,
// control characters, HTML characters and non-ASCII (seed printed).
func TestAppendGroup(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	alphabet := []string{"a", "m.room.member", "@u:s", "\"", "\\", "\x00", "\n", "<", ">", "&", "é", "\u2028", "$", "\x7f", "\xff"}
	str := func() string {
		s := ""
		for range rng.IntN(5) {
			s += alphabet[rng.IntN(len(alphabet))]
		}
		return s
	}
	for range 2000 {
		g := recorded.Group{ID: rng.Int64N(1 << 40), Prev: rng.Int64N(3) * rng.Int64N(1<<20)}
		if n := rng.IntN(4); n > 0 {
			g.Set = map[string]string{}
			for range n {
				g.Set[str()+"\x00"+str()] = str()
			}
		}
		for range rng.IntN(3) {
			g.Removed = append(g.Removed, str())
		}
		want, err := json.Marshal(g)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(appendGroup(nil, g)); got != string(want)+"\n" {
			t.Fatalf("appendGroup(%#v)\n got %s want %s", g, got, want)
		}
	}
}
