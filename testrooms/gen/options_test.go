package gen

import (
	"bufio"
	"math"
	"os"
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
		{"--servers", func(o *Options) { o.Servers = 0 }},
		{"--servers", func(o *Options) { o.Servers = MaxServers + 1 }},
		{"--members", func(o *Options) { o.Members = -1 }},
		{"--members", func(o *Options) { o.Members = MaxMembers + 1 }},
		{"--max-prev-events", func(o *Options) { o.MaxPrevEvents = 0 }},
		{"--max-delay", func(o *Options) { o.MaxDelay = 0 }},
		{"--max-delay", func(o *Options) { o.MaxDelay = -3 }},
		{"--state-budget", func(o *Options) { o.StateBudget = -1 }},
		{"--backfill-batch", func(o *Options) { o.BackfillBatch = 0 }},
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
