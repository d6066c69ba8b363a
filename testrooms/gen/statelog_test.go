package gen

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStateLogMaterialize records random states (sets and deletions on random
// earlier states, some changing nothing, some ending where their parent began)
// and checks that materialize rebuilds every one with the same entries and
// record, and only the records asked for.
func TestStateLogMaterialize(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	r := &room{log: newStateLog()}
	states := []pmap{{}}
	for range 3000 {
		parent := states[rng.IntN(len(states))]
		st := parent
		for range rng.IntN(4) {
			k := fmt.Sprintf("m.room.member\x00@u%d:s", rng.IntN(400))
			if rng.IntN(5) == 0 {
				st = st.del(k)
			} else {
				st = st.set(k, int32(rng.IntN(1000)))
			}
		}
		if rng.IntN(10) == 0 {
			// A new state object with the parent's entries (as a resolution
			// that changes nothing back may give).
			st = st.set("x\x00", 1).del("x\x00")
		}
		st = r.record(st, parent)
		states = append(states, st)
	}
	want := map[int32]bool{}
	for i, st := range states {
		if i%3 == 0 {
			want[st.rec] = true
		}
	}
	got := r.log.materialize(want)
	require.Len(t, got, len(want))
	for _, st := range states {
		if !want[st.rec] {
			continue
		}
		m, ok := got[st.rec]
		require.True(t, ok, "record %d", st.rec)
		require.Equal(t, st.rec, m.rec)
		require.Equal(t, entries(st), entries(m), "record %d", st.rec)
		require.Equal(t, int32(st.size), r.log.size[st.rec])
	}
}

// TestRecordKeepsIdentity: a state recorded once keeps its record; set and
// del that change nothing return the same state (the same record), the empty
// state is record 0.
func TestRecordKeepsIdentity(t *testing.T) {
	r := &room{log: newStateLog()}
	a := r.record(pmap{}.set("a\x00", 1), pmap{})
	require.Equal(t, int32(1), a.rec)
	require.Equal(t, a.rec, r.record(a, pmap{}).rec)
	require.Equal(t, a.rec, a.set("a\x00", 1).rec)
	require.Equal(t, a.rec, a.del("b\x00").rec)
	require.Equal(t, int32(0), a.del("a\x00").rec)
	b := r.record(a.set("b\x00", 2), a)
	require.Equal(t, int32(2), b.rec)
	require.Equal(t, []int32{-1, 0, 1}, r.log.parent)
}

func entries(m pmap) map[string]int32 {
	out := map[string]int32{}
	m.each(func(k string, v int32) { out[k] = v })
	return out
}
