package gen

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/roomstate"
)

// corruption is a corruptResolution hook: the n-th resolution whose input
// states disagree on some key gives that key (the first such, in key order)
// another input state's value instead of the resolved one; every later
// resolution of the same input states gives the same wrong answer (so a
// reference that ran the generator's resolution would agree with it).
type corruption struct {
	n          int
	key        string
	wrong, was int32   // event indices (-1: absent)
	inputs     []int32 // the stateLog records of the corrupted resolution's input states
}

func (c *corruption) hook() func(r *room, states []pmap, st pmap) pmap {
	seen := 0
	recs := func(states []pmap) []int32 {
		var out []int32
		for _, s := range states {
			out = append(out, s.rec)
		}
		slices.Sort(out)
		return out
	}
	return func(r *room, states []pmap, st pmap) pmap {
		if c.key != "" {
			if slices.Equal(recs(states), c.inputs) {
				return st.set(c.key, c.wrong)
			}
			return st
		}
		var keys []string
		for _, o := range states[1:] {
			diff(states[0], o, func(k string) { keys = append(keys, k) })
		}
		if len(keys) == 0 {
			return st
		}
		if seen++; seen < c.n {
			return st
		}
		slices.Sort(keys)
		k := keys[0]
		cur, ok := st.get(k)
		if !ok {
			cur = -1
		}
		for _, s := range states {
			if v, ok := s.get(k); ok && v != cur {
				c.key, c.wrong, c.was, c.inputs = k, v, cur, recs(states)
				return st.set(k, v)
			}
		}
		return st
	}
}

// readExpected returns expected_state.jsonl's states by event ID.
func readExpected(t *testing.T, dir string) map[string]map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "expected_state.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	out := map[string]map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var l struct {
			EventID string            `json:"event_id"`
			State   map[string]string `json:"state"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &l))
		out[l.EventID] = l.State
	}
	require.NoError(t, sc.Err())
	return out
}

// TestReferenceCatchesWrongResolution injects a wrong resolution into the
// generator's own path (the simulation's states) and checks that the reference
// counts it, names the event and key with both values, and that
// expected_state.jsonl records the reference's value where the generator's
// state holds the wrong one; replay (resolver) then disagrees with the
// recording, so verify --expected fails on the room. With NoReference the
// recording is the generator's (wrong) state, and replay disagrees at that very
// event. It fails if the expected state is the generator's resolution.
func TestReferenceCatchesWrongResolution(t *testing.T) {
	for _, v := range []string{"10", "12"} {
		t.Run("v"+v, func(t *testing.T) {
			opts := smallOptions(v, 3)
			opts.Backfill = false
			c := &corruption{n: 5}
			corruptResolution = c.hook()
			defer func() { corruptResolution = nil }()
			require.NoError(t, opts.normalise())
			r, err := newRoom(opts)
			require.NoError(t, err)
			dir := filepath.Join(t.TempDir(), "room")
			require.NoError(t, r.run(dir, nil))
			defer r.closeLines()
			require.NotEmpty(t, c.key, "no resolution corrupted")
			require.NoError(t, r.check())
			meta, err := r.write(dir, "room")
			require.NoError(t, err)

			ref := meta.Reference
			require.NotNil(t, ref)
			require.Equal(t, meta.Counts.Events, ref.CheckedEvents)
			require.Positive(t, ref.Mismatches, "the reference did not catch the wrong resolution")
			first := ref.First[0]
			t.Logf("corrupted %q: %d -> %d; first mismatch %s; %d mismatches", c.key, c.was, c.wrong, first, ref.Mismatches)
			require.Equal(t, c.key, first.Key)
			require.Equal(t, r.idOrNone(c.wrong), first.Generator)
			require.Equal(t, r.idOrNone(c.was), first.Reference)

			// The recording holds the reference's value; the generator's own
			// state after that event holds the wrong one.
			exp := readExpected(t, dir)
			line, ok := exp[first.Event]
			require.True(t, ok, "event %s not recorded", first.Event)
			require.Equal(t, first.Reference, line[c.key], "expected_state.jsonl does not hold the reference's value")
			g, ok := r.afterOf(r.byID[first.Event]).get(c.key)
			require.True(t, ok)
			require.Equal(t, first.Generator, r.events[g].id)
			require.NotEqual(t, r.events[g].id, line[c.key])
			require.Contains(t, meta.Generator.Resolver, "resolver/specres")

			// Replay disagrees with the recording somewhere (the wrong value
			// lives on in the generator's later states).
			_, res, _ := replayRecorded(t, dir, "events.jsonl", roomstate.ImportOptions{})
			require.Positive(t, res.Mismatches, "verify --expected would pass")

			// NoReference: the recording is the generator's own, wrong state.
			r.opts.NoReference, r.refDone, r.refStates = true, false, nil
			require.NoError(t, r.check())
			dir2 := filepath.Join(t.TempDir(), "room")
			meta2, err := r.write(dir2, "room")
			require.NoError(t, err)
			require.Nil(t, meta2.Reference)
			require.Contains(t, meta2.Generator.Resolver, "no reference")
			require.Equal(t, first.Generator, readExpected(t, dir2)[first.Event][c.key])
		})
	}
}

// TestReferenceSample checks which events the reference checks: every event up
// to refAllMax, then every k-th (at least refSampleMin), the recorded events and
// the last.
func TestReferenceSample(t *testing.T) {
	r := &room{}
	for i := range refAllMax {
		r.arrival = append(r.arrival, int32(i))
	}
	got, every := r.referenceSample(nil)
	require.Equal(t, 1, every)
	require.Len(t, got, refAllMax)

	n := refAllMax*3 + 7
	r.arrival = r.arrival[:0]
	for i := range n {
		r.arrival = append(r.arrival, int32(n-1-i)) // file order is not index order
	}
	sampled := []int32{5, 17, int32(n - 1)}
	got, every = r.referenceSample(sampled)
	require.Greater(t, every, 1)
	require.GreaterOrEqual(t, len(got), refSampleMin)
	for _, x := range append(sampled, r.arrival[n-1]) {
		require.Contains(t, got, x)
	}
	require.Less(t, len(got), refSampleMin+len(sampled)+2+refSampleMin/2)

	// As many recorded events as refSampleMin: those and the last, no more.
	sampled = sampled[:0]
	for i := 0; i < n-1; i += n / (refSampleMin + 10) {
		sampled = append(sampled, r.arrival[i])
	}
	r.sampleEvery = n / (refSampleMin + 10)
	got, _ = r.referenceSample(sampled)
	require.Len(t, got, len(sampled)+1)

	// ReferenceAll: every event.
	r.opts.ReferenceAll = true
	got, every = r.referenceSample(sampled)
	require.Equal(t, 1, every)
	require.Equal(t, r.arrival, got)
}

// TestReferenceMismatchString: the stderr form names event, key and values.
func TestReferenceMismatchString(t *testing.T) {
	s := ReferenceMismatch{Event: "$e", Key: "m.room.member\x00@a:x", Reference: "$r", Generator: ""}.String()
	require.True(t, strings.Contains(s, "$e") && strings.Contains(s, "m.room.member|@a:x") && strings.Contains(s, `"$r"`), s)
	s = ReferenceMismatch{Event: "$e", Reference: "accepted", Generator: "rejected by the generator"}.String()
	require.Contains(t, s, "reference accepted, generator rejected")
}
