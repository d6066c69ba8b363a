package gen

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/mtxdb/mtxdb/pdu"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/sjson"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
)

var (
	flagSeed   = flag.Uint64("gen.seed", 1, "first seed of TestGenerateReplay")
	flagEvents = flag.Int("gen.events", 400, "events per room in TestGenerateReplay")
)

func smallOptions(version string, seed uint64) Options {
	o := DefaultOptions()
	o.Seed, o.RoomVersion, o.Events, o.Servers = seed, version, *flagEvents, 4
	o.Members, o.Loss, o.BadRate, o.MaxDelay = 40, 0.1, 0.03, 6
	// More state churn than the default mix, so small rooms conflict.
	o.Mix.Power, o.Mix.PowerConflict, o.Mix.Kick, o.Mix.Ban, o.Mix.Topic = 3, 3, 3, 2, 3
	o.Backfill = true
	return o
}

// TestGenerateReplay generates small rooms per room version with several servers
// and forks, and checks: the same seed gives byte-identical files; every PDU
// re-parses for its version (content hash, event ID = reference hash) and its
// signatures verify against the generated keys; import and replay with roomstate
// and resolver reproduce expected_state.jsonl, the forward extremities and the
// current state with 0 mismatches, from events.jsonl and from the backfill order.
func TestGenerateReplay(t *testing.T) {
	for _, v := range []string{"10", "11", "12"} {
		for seed := *flagSeed; seed < *flagSeed+2; seed++ {
			t.Run(fmt.Sprintf("v%s/seed%d", v, seed), func(t *testing.T) {
				opts := smallOptions(v, seed)
				t.Logf("seed %d (rerun with -gen.seed)", seed)
				dir := filepath.Join(t.TempDir(), "room")
				meta, err := Generate(opts, dir, nil)
				require.NoError(t, err)
				require.Equal(t, opts.Events, meta.Counts.Events)
				require.Positive(t, meta.Counts.EventsWithGT1Prev, "forks")
				require.Positive(t, meta.Counts.Rejected, "rejected events")
				require.LessOrEqual(t, meta.Counts.MaxPrevEvents, 10)
				require.GreaterOrEqual(t, meta.Counts.DistinctSenderServers, 3)
				// The reference implementation checked every event and agrees.
				require.NotNil(t, meta.Reference)
				require.Equal(t, meta.Counts.Events, meta.Reference.CheckedEvents)
				require.Positive(t, meta.Reference.Resolutions)
				require.Zero(t, meta.Reference.Mismatches, "reference mismatches: %v", meta.Reference.First)
				require.Zero(t, meta.Reference.CurrentStateMismatchedKeys, "reference mismatches: %v", meta.Reference.First)

				again := filepath.Join(t.TempDir(), "room")
				_, err = Generate(opts, again, nil)
				require.NoError(t, err)
				requireSameFiles(t, dir, again)

				checkPDUs(t, dir, meta)
				replayAndCompare(t, dir, "events.jsonl", roomstate.ImportOptions{})
				// The backfill order (newest first; the create event after every
				// accepted event) imports and replays to the same states.
				replayAndCompare(t, dir, "events_backfill.jsonl", roomstate.ImportOptions{AnyOrder: true, RoomVersion: v})
			})
		}
	}
}

func requireSameFiles(t *testing.T, a, b string) {
	t.Helper()
	entries, err := os.ReadDir(a)
	require.NoError(t, err)
	for _, e := range entries {
		x, err := os.ReadFile(filepath.Join(a, e.Name()))
		require.NoError(t, err)
		y, err := os.ReadFile(filepath.Join(b, e.Name()))
		require.NoError(t, err)
		require.True(t, bytes.Equal(x, y), "%s differs between two runs with the same seed", e.Name())
	}
}

// keyVerifier checks signatures against the generated public keys.
type keyVerifier map[string]ed25519.PublicKey

func (k keyVerifier) VerifyJSONs(_ context.Context, reqs []gomatrixserverlib.VerifyJSONRequest) ([]gomatrixserverlib.VerifyJSONResult, error) {
	out := make([]gomatrixserverlib.VerifyJSONResult, len(reqs))
	for i, req := range reqs {
		pub, ok := k[string(req.ServerName)]
		if !ok {
			out[i].Error = fmt.Errorf("no key for %s", req.ServerName)
			continue
		}
		out[i].Error = gomatrixserverlib.VerifyJSON(string(req.ServerName), keyID, pub, req.Message)
	}
	return out, nil
}

func checkPDUs(t *testing.T, dir string, meta *Meta) {
	t.Helper()
	keys := keyVerifier{}
	for s, k := range meta.ServerKeys {
		b, err := base64.RawStdEncoding.DecodeString(k)
		require.NoError(t, err)
		keys[s] = b
	}
	ver := gomatrixserverlib.MustGetRoomVersion(gomatrixserverlib.RoomVersion(meta.RoomVersion))
	f, err := os.Open(filepath.Join(dir, "events.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	n := 0
	for sc.Scan() {
		n++
		var h struct {
			EventID string `json:"event_id"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &h))
		raw, err := sjson.DeleteBytes(sc.Bytes(), "event_id")
		require.NoError(t, err)
		ev, err := ver.NewEventFromUntrustedJSON(raw)
		require.NoError(t, err, "line %d", n)
		require.False(t, ev.Redacted(), "line %d: content hash", n)
		require.Equal(t, h.EventID, ev.EventID(), "line %d: event ID is the reference hash", n)
		require.Equal(t, meta.RoomID, ev.RoomID().String(), "line %d", n)
		require.NoError(t, gomatrixserverlib.VerifyEventSignatures(context.Background(), ev, keys, pdu.UserIDForSender), "line %d: signatures", n)
	}
	require.NoError(t, sc.Err())
	require.Equal(t, meta.Counts.Events, n)
}

func replayAndCompare(t *testing.T, dir, file string, opts roomstate.ImportOptions) {
	t.Helper()
	exp, res, first := replayRecorded(t, dir, file, opts)
	require.Zero(t, res.Mismatches, "mismatches against resolver.Replay; first: %v", first)
	require.Equal(t, exp.Events, res.Events, "every event's state compared")
	require.True(t, res.Current, "current state compared")
}

// replayRecorded imports file of a generated room into a memory store, replays
// it with resolver.Replay and compares it with the room's recording; first holds
// the first five mismatches.
func replayRecorded(t *testing.T, dir, file string, opts roomstate.ImportOptions) (exp *recorded.Expected, res recorded.CompareResult, first []recorded.Mismatch) {
	ctx := t.Context()
	t.Helper()
	st := roomstate.New(packstore.NewMemStorage())
	f, err := os.Open(filepath.Join(dir, file))
	require.NoError(t, err)
	_, err = st.Import(ctx, f, dir, opts)
	f.Close()
	require.NoError(t, err)
	exp, err = recorded.Load(dir)
	require.NoError(t, err)
	room, err := st.Room(ctx, exp.RoomID)
	require.NoError(t, err)
	_, err = resolver.Replay(ctx, room, resolver.ReplayOptions{})
	require.NoError(t, err)
	res, err = recorded.Compare(ctx, room, exp, func(m recorded.Mismatch) {
		if len(first) < 5 {
			first = append(first, m)
		}
	})
	require.NoError(t, err)
	return exp, res, first
}

// TestBuildEventMatchesGMSL checks that buildEvent writes what gomatrixserverlib's
// EventBuilder writes: a room built each way gives byte-identical files.
func TestBuildEventMatchesGMSL(t *testing.T) {
	for _, v := range []string{"10", "11", "12"} {
		opts := smallOptions(v, 7)
		opts.Events = 300
		fast := filepath.Join(t.TempDir(), "room")
		_, err := Generate(opts, fast, nil)
		require.NoError(t, err)
		buildWithGMSL = true
		slow := filepath.Join(t.TempDir(), "room")
		_, err = Generate(opts, slow, nil)
		buildWithGMSL = false
		require.NoError(t, err)
		requireSameFiles(t, fast, slow)
	}
}
