// Package gen generates large, realistic, valid Matrix room histories on demand,
// deterministically by seed, in the layout of testrooms/real (events.jsonl,
// expected_state.jsonl, meta.json, current_state.json).
//
// # The simulation
//
// Several simulated homeservers, each with its own users and ed25519 signing key
// (derived from the seed), share one room. On each tick of a simulated clock one
// server creates an event: its prev_events are its forward extremities (at most
// MaxPrevEvents, highest depth first), the state before it is the resolution of the
// states after those prev_events, its auth_events are chosen from that state by
// the spec's auth-events selection, and gomatrixserverlib builds, hashes and signs
// it. The event is then sent to every other resident server with a random delay
// (in ticks), or lost; a server that receives an event whose prev or auth events it
// lacks fetches them first (as /get_missing_events does), so loss and delay make
// forks, and each server's next event merges its extremities.
//
// State is a function of the DAG, not of the server: every server that computes
// the state before an event resolves the same states after the same prev_events,
// so the generator computes it once per event, when the event is created, and
// authorises the event once (against its auth events, then against the state before
// it, as the resolver package's replay does). An event that fails is rejected: its
// state after is its state before, and no server uses it as a prev_event. Rejected
// events come from a configurable share of senders who lack the permission for what
// they do (a misbehaving server that does not check); conflicting power-level
// changes come from pairs of admins on different servers acting in the same tick.
//
// events.jsonl is the arrival order at the origin server (server1.test, the room's
// creator): its own events when created, others' when delivered, with fetched
// missing ancestors first. expected_state.jsonl is the state after each event (all
// events, or a deterministic sample when the total would exceed StateBudget
// entries: see meta.json "expected_state").
//
// # State resolution
//
// The simulation resolves with the resolver package's spec implementation
// (resolver.ResolveConflicts: v2 for room versions 10 and 11, v2.1 for 12), given the
// conflicted part of the input states as resolver.Resolve gives it; see resolve.go.
//
// # The expected state
//
// What expected_state.jsonl and current_state.json record does not come from that
// code, which replay runs too: the reference implementation (resolver/specres,
// written from the spec's text over whole state maps) computes it, stepwise over the
// generator's states. For each event it resolves the states after the event's
// prev_events, decides the event's rejection as the receipt checks do, and the state
// after is what the files record; where it differs from the generator's own, meta.json
// "reference" counts and lists it (and `mtxdb gen` prints it on stderr). With 0
// mismatches over every event, the recorded states are those of a replay that runs
// the reference alone (the argument, and the sampling of rooms over 10,000 events, are
// in reference.go). Options.NoReference skips it.
//
// # Cost
//
// The simulation runs on one goroutine; signing (ed25519) and the events.jsonl
// lines are made on another, the reference's checks and expected_state.jsonl on
// every CPU at the end (the reference is slow on purpose and takes most of the time
// of a run from 10,000 events on; README, "Generating rooms"). What
// keeps a 100k-event room under a minute on two cores (README, "Generating rooms"):
// resolutions are memoised by their set of input states; the room passes one
// resolver.Cache to every resolution and authorises its state events through it,
// so the iterative auth checks find most events' checks against their own auth
// events already made; plain events' outcomes are shared by (type, sender, auth
// events); the resolver's auth-chain walks stop at lineage floors and AuthOrder
// bounds, and the v2.1 conflicted subgraph and step 1's power subset walk
// descendants when that is the smaller side; events are built, hashed and
// redacted without gomatrixserverlib's JSON round trips (TestBuildEventMatchesGMSL
// checks them byte for byte).
//
// # Memory
//
// The room is not held whole: events.jsonl is written as events reach the
// origin (stream.go) and read back where a non-state event's PDU is needed
// again; each event keeps its IDs, indices and, for state events, the PDU.
// Every state is a record of a stateLog (its parent state and the entries that
// differ; statelog.go); the simulation keeps a state's persistent map only while
// a server may still resolve it, and the states the files and the reference
// read are rebuilt from the log after the run.
package gen

import (
	"fmt"
	"math"
)

// Mix is the relative weight of each kind of event a server creates. Weights are
// relative; a kind whose preconditions fail (no one to kick) falls back to a message.
type Mix struct {
	Message       float64 `json:"message"`
	Join          float64 `json:"join"`
	Leave         float64 `json:"leave"`
	Profile       float64 `json:"profile"`
	Invite        float64 `json:"invite"`
	Kick          float64 `json:"kick"`
	Ban           float64 `json:"ban"`
	Unban         float64 `json:"unban"`
	Power         float64 `json:"power"`
	JoinRules     float64 `json:"join_rules"`
	HistoryVis    float64 `json:"history_visibility"`
	Topic         float64 `json:"topic"`
	Name          float64 `json:"name"`
	Redaction     float64 `json:"redaction"`
	PowerConflict float64 `json:"power_conflict"`
}

// DefaultMix is a busy public room: messages dominate the timeline, memberships
// dominate the state, power levels change rarely (about 2 in 1000 events: every
// resolution walks the power-levels mainline, so a room with a power change every
// hundred events, as the first mix had, resolves ever slower as it grows).
func DefaultMix() Mix {
	return Mix{
		Message: 50, Join: 18, Leave: 4, Profile: 6, Invite: 2, Kick: 1, Ban: 0.7, Unban: 0.3,
		Power: 0.15, JoinRules: 0.2, HistoryVis: 0.2, Topic: 0.8, Name: 0.3, Redaction: 2,
		PowerConflict: 0.05,
	}
}

// Options configure one generated room.
type Options struct {
	Seed uint64 `json:"seed"`
	// KeySeed, if not 0, is the seed the servers' signing keys derive from
	// instead of Seed (GenerateMulti: the first room's seed, so one keyring
	// verifies every room of interleaved.jsonl).
	KeySeed     uint64 `json:"key_seed,omitempty"`
	Events      int    `json:"events"`
	Servers     int    `json:"servers"` // 1 to MaxServers
	RoomVersion string `json:"room_version"`
	// Members is the number of joined members the room grows towards, at most
	// MaxMembers (0: Events/5, at least 10).
	Members int `json:"members"`
	// MaxPrevEvents caps prev_events on created events (Synapse: 10).
	MaxPrevEvents int `json:"max_prev_events"`
	// MaxDelay is the largest delivery delay in ticks (one tick, one created event).
	MaxDelay int `json:"max_delay_ticks"`
	// Loss is the probability that a send to one server is lost (the event arrives
	// later, fetched as a missing prev_event, or at the end).
	Loss float64 `json:"loss"`
	// BadRate is the share of events sent by users who lack the permission for them.
	BadRate float64 `json:"bad_rate"`
	Mix     Mix     `json:"mix"`
	// StateBudget caps the total entries written to expected_state.jsonl; beyond it
	// every k-th event's state is written (0: 2 million, about 40 MB).
	StateBudget int `json:"state_budget"`
	// Backfill also writes backfill_order.jsonl: event IDs in the order a server
	// backfilling from the forward extremities receives them (reverse-chronological
	// batches of BackfillBatch).
	Backfill      bool `json:"backfill"`
	BackfillBatch int  `json:"backfill_batch"`
	// Resolver is "" (or "mtxdb"): resolver.ResolveConflicts, the spec's v2 / v2.1;
	// "gmsl": gomatrixserverlib's ResolveStateConflictsV2, v10 and v11 only, for
	// differential experiments (see resolve.go).
	Resolver string `json:"resolver,omitempty"`
	// NoReference skips the reference implementation (reference.go): the files
	// then record the generator's own states (for quick runs and profiling).
	NoReference bool `json:"no_reference,omitempty"`
	// ReferenceAll has the reference check every event whatever the room's size
	// (by default every event up to refAllMax events, a sample above: see
	// reference.go). About 0.13 s of CPU per resolution at 100k events: a 100k
	// room takes hours.
	ReferenceAll bool `json:"reference_all,omitempty"`
}

// ResolverGMSL selects gomatrixserverlib's state res v2 (Options.Resolver).
const ResolverGMSL = "gmsl"

// DefaultOptions returns the defaults of `mtxdb gen`.
func DefaultOptions() Options {
	return Options{
		Seed: 1, Events: 10000, Servers: 5, RoomVersion: "12",
		MaxPrevEvents: 10, MaxDelay: 8, Loss: 0.05, BadRate: 0.01, Mix: DefaultMix(),
		BackfillBatch: 100,
	}
}

// MaxServers caps Options.Servers. The initial m.room.power_levels lists three
// users per server: at 500 servers it is about 42 KB (measured: the longest line of
// events.jsonl, seed 1, 200 events), safely under the 65,536-byte PDU limit that
// importers enforce; at 800 it exceeds it.
const MaxServers = 500

// MaxEvents caps Options.Events (memory grows with the room).
const MaxEvents = 2_000_000

// MaxMembers caps Options.Members.
const MaxMembers = 100000

// MixWeight is one weight of a Mix and the name of its flag (--mix-Name).
type MixWeight struct {
	Name string
	P    *float64
}

// Weights returns pointers to m's weights, in field order, with their flag names.
func (m *Mix) Weights() []MixWeight {
	return []MixWeight{
		{"message", &m.Message}, {"join", &m.Join}, {"leave", &m.Leave}, {"profile", &m.Profile},
		{"invite", &m.Invite}, {"kick", &m.Kick}, {"ban", &m.Ban}, {"unban", &m.Unban},
		{"power", &m.Power}, {"join-rules", &m.JoinRules}, {"history-visibility", &m.HistoryVis},
		{"topic", &m.Topic}, {"name", &m.Name}, {"redaction", &m.Redaction}, {"power-conflict", &m.PowerConflict},
	}
}

// normalise checks o, naming the `mtxdb gen` flag of a bad value and its allowed
// range, and fills in the defaults documented on Options.
func (o *Options) normalise() error {
	switch o.RoomVersion {
	case "10", "11", "12":
	default:
		return fmt.Errorf("gen: --room-version %q: only 10, 11 and 12 are generated", o.RoomVersion)
	}
	for _, c := range []struct {
		flag      string
		v, lo, hi int
		why       string
	}{
		{"--events", o.Events, 10, MaxEvents, " (about 2.7 GB of memory at 1M events)"},
		{"--servers", o.Servers, 1, MaxServers, " (the initial m.room.power_levels lists 3 users per server: about 42 KB at 500 servers, over the 65,536-byte PDU limit at 800)"},
		{"--members", o.Members, 0, MaxMembers, " (0: events/5)"},
		{"--max-prev-events", o.MaxPrevEvents, 1, 20, " (Synapse creates at most 10 and rejects more than 20 on receipt)"},
		{"--max-delay", o.MaxDelay, 1, math.MaxInt, ""},
		{"--state-budget", o.StateBudget, 0, math.MaxInt, " (0: 2 million)"},
		{"--backfill-batch", o.BackfillBatch, 1, math.MaxInt, ""},
	} {
		switch {
		case c.hi == math.MaxInt && c.v < c.lo:
			return fmt.Errorf("gen: %s %d: at least %d%s", c.flag, c.v, c.lo, c.why)
		case c.v < c.lo || c.v > c.hi:
			return fmt.Errorf("gen: %s %d: %d to %d%s", c.flag, c.v, c.lo, c.hi, c.why)
		}
	}
	for _, c := range []struct {
		flag string
		v    float64
	}{{"--loss", o.Loss}, {"--bad-rate", o.BadRate}} {
		if !(c.v >= 0 && c.v < 1) {
			return fmt.Errorf("gen: %s %g: a probability in [0, 1)", c.flag, c.v)
		}
	}
	var total float64
	for _, w := range o.Mix.Weights() {
		if !(*w.P >= 0) || math.IsInf(*w.P, 1) {
			return fmt.Errorf("gen: --mix-%s %g: a finite weight, at least 0", w.Name, *w.P)
		}
		total += *w.P
	}
	if total == 0 {
		return fmt.Errorf("gen: every --mix-* weight is 0: at least one must be positive")
	}
	if math.IsInf(total, 1) {
		return fmt.Errorf("gen: the --mix-* weights add up to more than %g: scale them down (only their ratios matter)", math.MaxFloat64)
	}
	if o.Members == 0 {
		o.Members = min(max(o.Events/5, 10), MaxMembers)
	}
	if o.StateBudget == 0 {
		o.StateBudget = 2_000_000
	}
	switch o.Resolver {
	case "", "mtxdb":
		o.Resolver = ""
	case ResolverGMSL:
		if o.RoomVersion == "12" {
			return fmt.Errorf("gen: --resolver gmsl: room version 12 needs state res v2.1, which gomatrixserverlib's pinned version cannot run")
		}
	default:
		return fmt.Errorf("gen: --resolver %q: mtxdb or gmsl", o.Resolver)
	}
	if o.NoReference && o.ReferenceAll {
		return fmt.Errorf("gen: --reference-all with --no-reference: the second skips the checks the first asks for")
	}
	return nil
}
