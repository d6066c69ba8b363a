package gen

import (
	"bufio"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNormaliseRefuses: each bad value is refused with an error naming its flag;
// the defaults, and the limits themselves, pass.
func TestNormaliseRefuses(t *testing.T) {
	for _, tc := range []struct {
		flag string
		set  func(o *Options)
	}{
		{"--room-version", func(o *Options) { o.RoomVersion = "9" }},
		{"--events", func(o *Options) { o.Events = 9 }},
		{"--events", func(o *Options) { o.Events = MaxEvents + 1 }},
		{"--servers", func(o *Options) { o.Servers = 0 }},
		{"--servers", func(o *Options) { o.Servers = MaxServers + 1 }},
		{"--members", func(o *Options) { o.Members = -1 }},
		{"--members", func(o *Options) { o.Members = MaxMembers + 1 }},
		{"--max-prev-events", func(o *Options) { o.MaxPrevEvents = 0 }},
		{"--max-prev-events", func(o *Options) { o.MaxPrevEvents = 21 }},
		{"--mix-*", func(o *Options) { o.Mix = Mix{Message: 1e308, Join: 1e308} }},
		{"--max-delay", func(o *Options) { o.MaxDelay = 0 }},
		{"--max-delay", func(o *Options) { o.MaxDelay = -3 }},
		{"--state-budget", func(o *Options) { o.StateBudget = -1 }},
		{"--backfill-batch", func(o *Options) { o.BackfillBatch = 0 }},
		{"--reference-all", func(o *Options) { o.NoReference, o.ReferenceAll = true, true }},
		{"--loss", func(o *Options) { o.Loss = -0.1 }},
		{"--loss", func(o *Options) { o.Loss = 1 }},
		{"--loss", func(o *Options) { o.Loss = math.NaN() }},
		{"--bad-rate", func(o *Options) { o.BadRate = -0.5 }},
		{"--bad-rate", func(o *Options) { o.BadRate = 1 }},
		{"--mix-kick", func(o *Options) { o.Mix.Kick = -1 }},
		{"--mix-power-conflict", func(o *Options) { o.Mix.PowerConflict = math.Inf(1) }},
		{"--mix-history-visibility", func(o *Options) { o.Mix.HistoryVis = math.NaN() }},
		{"--mix-*", func(o *Options) { o.Mix = Mix{} }},
		{"--resolver", func(o *Options) { o.Resolver = "synapse" }},
		{"--resolver", func(o *Options) { o.Resolver = ResolverGMSL }}, // with room version 12
	} {
		o := DefaultOptions()
		tc.set(&o)
		err := o.normalise()
		require.Error(t, err, tc.flag)
		require.Contains(t, err.Error(), tc.flag)
	}
	for _, set := range []func(o *Options){
		func(o *Options) {},
		func(o *Options) {
			o.Servers, o.Members, o.MaxPrevEvents, o.MaxDelay, o.BackfillBatch = MaxServers, MaxMembers, 1, 1, 1
		},
		func(o *Options) { o.Loss, o.BadRate, o.Mix = 0, 0, Mix{Message: 1} },
		func(o *Options) { o.RoomVersion, o.Resolver = "11", ResolverGMSL },
	} {
		o := DefaultOptions()
		set(&o)
		require.NoError(t, o.normalise())
	}
}

// TestMaxServersPDUSize generates rooms with MaxServers servers and checks every
// PDU of events.jsonl (with its event_id) stays within the 65,536-byte limit.
func TestMaxServersPDUSize(t *testing.T) {
	for _, v := range []string{"10", "11", "12"} {
		o := DefaultOptions()
		o.RoomVersion, o.Servers, o.Events = v, MaxServers, 50
		dir := filepath.Join(t.TempDir(), "room")
		_, err := Generate(o, dir, nil)
		require.NoError(t, err)
		f, err := os.Open(filepath.Join(dir, "events.jsonl"))
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		longest := 0
		for sc.Scan() {
			longest = max(longest, len(sc.Bytes()))
		}
		f.Close()
		require.NoError(t, sc.Err())
		t.Logf("v%s, %d servers: longest PDU %d bytes", v, MaxServers, longest)
		require.LessOrEqual(t, longest, 65536, "v%s", v)
	}
}

// TestEventsExact: a room has exactly --events events, also when the last step
// draws a power-level conflict (a pair of events): 13 gives 13, not 14.
func TestEventsExact(t *testing.T) {
	for _, n := range []int{13, 14, 101, 600} {
		o := DefaultOptions()
		o.Events, o.RoomVersion = n, "10"
		o.Mix = Mix{Join: 1, PowerConflict: 1}
		m, err := Generate(o, filepath.Join(t.TempDir(), "r"), nil)
		require.NoError(t, err)
		require.Equal(t, n, m.Counts.Events, "--events %d", n)
	}
}

// TestConcurrentRunsOneDir: two runs on one --out directory: one wins, the other
// fails, and the directory holds the winner's complete room with nothing left
// beside it (not both exiting 0 over a mixed expected_state.jsonl).
func TestConcurrentRunsOneDir(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "room")
	type result struct {
		m   *Meta
		err error
	}
	results := make(chan result, 2)
	for seed := range uint64(2) {
		go func() {
			o := DefaultOptions()
			o.Seed, o.Events = seed+1, 300
			m, err := Generate(o, dir, nil)
			results <- result{m, err}
		}()
	}
	var failed int
	var won *Meta
	for range 2 {
		res := <-results
		if res.err != nil {
			failed++
			require.Contains(t, res.err.Error(), dir)
		} else {
			won = res.m
		}
	}
	require.Equal(t, 1, failed, "exactly one of the two runs must fail")
	got, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	require.NoError(t, err)
	require.Contains(t, string(got), won.RoomID)
	f, err := os.Open(filepath.Join(dir, "expected_state.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	lines := 0
	for sc := bufio.NewScanner(f); sc.Scan(); {
		lines++
	}
	require.Equal(t, won.ExpectedState.Lines, lines)
	ents, err := os.ReadDir(parent)
	require.NoError(t, err)
	require.Len(t, ents, 1, "a temporary directory was left beside the room")
}

// TestMultiRoomOneKeyring: every room of a multi-room run lists the same server
// keys (interleaved.jsonl is what one server receives; one keyring verifies it),
// and interleaved.jsonl holds every room's events.
func TestMultiRoomOneKeyring(t *testing.T) {
	o := DefaultOptions()
	o.Seed, o.Events = 7, 100
	dir := filepath.Join(t.TempDir(), "multi")
	metas, err := GenerateMulti(o, 3, dir, nil)
	require.NoError(t, err)
	require.Len(t, metas, 3)
	total := 0
	for _, m := range metas {
		require.Equal(t, metas[0].ServerKeys, m.ServerKeys, "room %s", m.Room)
		total += m.Counts.Events
	}
	require.NotEqual(t, metas[0].RoomID, metas[1].RoomID)
	f, err := os.Open(filepath.Join(dir, "interleaved.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	lines := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines++
	}
	require.Equal(t, total, lines)
}

// TestPowerConflictOnlyMix: a mix of nothing but power-level conflicts still makes
// a room of accepted events (a conflict no admin can make falls back like any
// kind whose preconditions fail), not a room made only by the bad-rate path
// (mostly rejected events, and minutes for 2,000 of them).
func TestPowerConflictOnlyMix(t *testing.T) {
	o := DefaultOptions()
	o.Events, o.RoomVersion, o.Mix = 1000, "10", Mix{PowerConflict: 1}
	m, err := Generate(o, filepath.Join(t.TempDir(), "r"), nil)
	require.NoError(t, err)
	require.Equal(t, 1000, m.Counts.Events)
	require.Less(t, m.Counts.Rejected, 100, "rejected events")
	require.Positive(t, m.Counts.PowerConflictPairs)
}

// TestStaleTempDirRemoved: a run removes what a killed run (its process gone)
// left beside --out, and leaves a live process's directory alone.
func TestStaleTempDirRemoved(t *testing.T) {
	parent := t.TempDir()
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	dead := filepath.Join(parent, fmt.Sprintf(".room.gen-%d-123", cmd.Process.Pid))
	live := filepath.Join(parent, fmt.Sprintf(".room.gen-%d-456", os.Getppid()))
	require.NoError(t, os.Mkdir(dead, 0o700))
	require.NoError(t, os.Mkdir(live, 0o700))
	o := DefaultOptions()
	o.Events = 50
	_, err := Generate(o, filepath.Join(parent, "room"), nil)
	require.NoError(t, err)
	_, err = os.Stat(dead)
	require.ErrorIs(t, err, fs.ErrNotExist, "the dead run's directory")
	_, err = os.Stat(live)
	require.NoError(t, err, "a live process's directory")
}
