package gen

import (
	"bufio"
	"container/heap"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/tidwall/sjson"

	"github.com/mtxdb/mtxdb/internal/jsonstr"
)

// Meta is meta.json of a generated room.
type Meta struct {
	Room        string `json:"room"`
	RoomID      string `json:"room_id"`
	RoomVersion string `json:"room_version"`
	Generator   struct {
		Name     string  `json:"name"`
		Options  Options `json:"options"`
		Resolver string  `json:"resolver"`
		Origin   string  `json:"origin_server"`
	} `json:"generator"`
	Counts             Counts           `json:"counts"`
	Resolution         ResolutionCounts `json:"resolution"`
	ForwardExtremities []string         `json:"forward_extremities"`
	OriginExtremities  []string         `json:"origin_forward_extremities"`
	ExpectedState      ExpectedSampling `json:"expected_state"`
	// Reference is what the reference implementation checked (nil with
	// Options.NoReference).
	Reference  *ReferenceCounts  `json:"reference,omitempty"`
	ServerKeys map[string]string `json:"server_keys"` // server -> unpadded base64 ed25519 public key
	KeyID      string            `json:"key_id"`
	Notes      []string          `json:"notes"`
}

// Counts are the room's shape, as the real rooms' meta.json counts them, plus the
// generator's own.
type Counts struct {
	Events                int            `json:"events"`
	StateEvents           int            `json:"state_events"`
	Rejected              int            `json:"rejected"`
	SoftFailed            int            `json:"soft_failed"`
	EventsWithGT1Prev     int            `json:"events_with_gt1_prev_events"`
	MaxPrevEvents         int            `json:"max_prev_events"`
	MaxDepth              int64          `json:"max_depth"`
	DistinctSenders       int            `json:"distinct_senders"`
	DistinctSenderServers int            `json:"distinct_sender_servers"`
	ForwardExtremities    int            `json:"forward_extremities"`
	RedactionEvents       int            `json:"redaction_events"`
	CurrentStateEntries   int            `json:"current_state_entries"`
	JoinedMembers         int            `json:"joined_members"`
	StateEventsByType     map[string]int `json:"state_events_by_type"`
	EventsByType          map[string]int `json:"events_by_type"`
	UnauthorisedAttempts  int            `json:"unauthorised_attempts"`
	PowerConflictPairs    int            `json:"power_conflict_pairs"`
}

// ResolutionCounts describe the state resolutions the generator ran.
type ResolutionCounts struct {
	Resolutions       int `json:"resolutions"`
	ConflictedKeys    int `json:"conflicted_keys"`
	MaxConflictedKeys int `json:"max_conflicted_keys"`
	MaxInputStates    int `json:"max_input_states"`
	AuthDifference    int `json:"auth_difference_events"`
	FullConflicted    int `json:"full_conflicted_events"`
}

// ExpectedSampling says which events expected_state.jsonl covers.
type ExpectedSampling struct {
	Lines   int `json:"lines"`
	Every   int `json:"every"` // 1: every event; k: every k-th in file order, and the last
	Entries int `json:"entries"`
}

// line is the events.jsonl line of an event gomatrixserverlib built and signed
// (the signer makes the others'): its PDU JSON with the convenience top-level
// event_id, keys sorted.
func (r *room) line(e *event) ([]byte, error) {
	b, err := sjson.SetBytes(e.pdu.JSON(), "event_id", e.id)
	if err != nil {
		return nil, err
	}
	return gomatrixserverlib.CanonicalJSON(b)
}

// tips are the forward extremities as resolver.Replay defines them: accepted
// events that no accepted event lists in its prev_events, sorted by ID.
func (r *room) tips() []int32 {
	refd := make([]bool, len(r.events))
	for _, e := range r.events {
		if !e.rejected {
			for _, p := range e.prev {
				refd[p] = true
			}
		}
	}
	var out []int32
	for i, e := range r.events {
		if !e.rejected && !refd[i] {
			out = append(out, int32(i))
		}
	}
	slices.SortFunc(out, func(a, b int32) int { return strings.Compare(r.events[a].id, r.events[b].id) })
	return out
}

func (r *room) ids(idx []int32) []string {
	out := make([]string, len(idx))
	for i, x := range idx {
		out[i] = r.events[x].id
	}
	return out
}

func (r *room) stateJSON(st pmap) map[string]string {
	m := make(map[string]string, st.size)
	st.each(func(k string, v int32) { m[k] = r.events[v].id })
	return m
}

// sample chooses the events expected_state.jsonl records: every event, or every
// k-th in file order (and the last) when their states would hold more than
// Options.StateBudget entries.
func (r *room) sample() {
	total := 0
	for _, x := range r.arrival {
		total += int(r.log.size[r.events[x].after.rec])
	}
	every := max(1, (total+r.opts.StateBudget-1)/r.opts.StateBudget)
	r.sampled, r.sampleEvery = nil, every
	for i, x := range r.arrival {
		if i%every == 0 || i == len(r.arrival)-1 {
			r.sampled = append(r.sampled, x)
		}
	}
}

// write writes the room directory.
func (r *room) write(dir, name string) (*Meta, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	meta := &Meta{Room: name, RoomID: r.roomID, RoomVersion: r.opts.RoomVersion, KeyID: string(keyID)}
	meta.Generator.Name = "mtxdb gen"
	meta.Generator.Options = r.opts
	meta.Generator.Resolver = r.resolverName()
	meta.Generator.Origin = r.servers[0].name
	c := &meta.Counts
	c.StateEventsByType, c.EventsByType = map[string]int{}, map[string]int{}
	senders, senderServers := map[string]bool{}, map[string]bool{}

	for _, x := range r.arrival {
		e := r.events[x]
		c.Events++
		c.EventsByType[e.typ]++
		if e.key != "" {
			c.StateEvents++
			c.StateEventsByType[e.typ]++
		}
		if e.rejected {
			c.Rejected++
		}
		if len(e.prev) > 1 {
			c.EventsWithGT1Prev++
		}
		c.MaxPrevEvents = max(c.MaxPrevEvents, len(e.prev))
		c.MaxDepth = max(c.MaxDepth, e.depth)
		if e.typ == spec.MRoomRedaction {
			c.RedactionEvents++
		}
		sender := r.users[e.sender].id
		senders[sender] = true
		senderServers[sender[strings.IndexByte(sender, ':')+1:]] = true
	}
	if err := r.copyLines(dir); err != nil {
		return nil, err
	}
	c.DistinctSenders, c.DistinctSenderServers = len(senders), len(senderServers)
	c.SoftFailed, c.UnauthorisedAttempts, c.PowerConflictPairs = r.stats.softFailed, r.stats.badAttempts, r.stats.conflicts

	// expected_state.jsonl: the reference's states (see reference.go) of the
	// sampled events.
	sampled := r.sampled
	meta.ExpectedState = ExpectedSampling{Lines: len(sampled), Every: r.sampleEvery}
	for _, x := range sampled {
		meta.ExpectedState.Entries += r.expectedAfter(x).size
	}
	keys := r.stateKeyRanks()
	if err := writeLinesParallel(filepath.Join(dir, "expected_state.jsonl"), len(sampled), func() lineFunc {
		enc := &stateEncoder{r: r, keys: keys}
		return func(i int) ([]byte, error) {
			x := sampled[i]
			return enc.stateLine(nil, r.events[x].id, r.expectedAfter(x)), nil
		}
	}); err != nil {
		return nil, err
	}

	tips := r.tips()
	meta.ForwardExtremities = r.ids(tips)
	origin := slices.Clone(r.servers[0].extrem)
	meta.OriginExtremities = r.ids(origin)
	slices.Sort(meta.OriginExtremities)
	c.ForwardExtremities = len(tips)
	current := r.refCurrent
	if !r.refDone {
		if current = r.resolve(tips); r.err != nil {
			return nil, r.err
		}
	}
	c.CurrentStateEntries = current.size
	current.each(func(k string, v int32) {
		if keyType(k) == spec.MRoomMember && r.events[v].member == spec.Join {
			c.JoinedMembers++
		}
	})
	cur, err := json.Marshal(r.stateJSON(current))
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "current_state.json"), append(cur, '\n'), 0o644); err != nil {
		return nil, err
	}

	meta.Resolution = ResolutionCounts{Resolutions: r.res.resolutions, ConflictedKeys: r.res.conflictedKeys,
		MaxConflictedKeys: r.res.maxConflicted, MaxInputStates: r.res.maxInputStates, AuthDifference: r.res.authDifference, FullConflicted: r.res.fullConflicted}
	if r.refDone {
		meta.Reference = &r.refCounts
	}
	meta.ServerKeys = map[string]string{}
	for _, s := range r.servers {
		meta.ServerKeys[s.name] = base64.RawStdEncoding.EncodeToString([]byte(s.key.Public().(ed25519.PublicKey)))
	}
	meta.Notes = []string{
		"Generated by mtxdb gen (testrooms/gen): deterministic for the options above; signatures are real (ed25519 keys derived from the seed, public keys in server_keys).",
		"events.jsonl: arrival order at the origin server; the top-level event_id of each line is the reference hash, for convenience: strip it before hashing.",
		"expected_state.jsonl: state after each event (rejected events: the state before them), keys \"<type>\\u0000<state_key>\"; see expected_state.every. Unless options.no_reference: as the reference implementation (resolver/specres) computes it from the generator's states after the event's prev_events, which \"reference\" says where it differs from the generator's own.",
		"forward_extremities: accepted events no accepted event points at (as resolver.Replay computes them); origin_forward_extremities: the origin's own, without soft-failed events.",
		"current_state.json: the resolution of the states after forward_extremities (the reference's, unless options.no_reference).",
	}
	if r.opts.Backfill {
		if err := r.writeBackfill(filepath.Join(dir, "backfill_order.jsonl"), tips); err != nil {
			return nil, err
		}
		meta.Notes = append(meta.Notes, "backfill_order.jsonl: the order a server backfilling from the forward extremities receives the events, in reverse-chronological batches (by depth) of options.backfill_batch, as {\"event_id\", \"batch\"} lines; events_backfill.jsonl: the PDUs in that order (import with --any-order --room-version). The create event comes after every accepted event; only rejected events, which no accepted event points at, follow it.")
	}
	mb, err := json.MarshalIndent(meta, "", " ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "meta.json"), append(mb, '\n'), 0o644); err != nil {
		return nil, err
	}
	return meta, nil
}

// writeLines writes n lines produced by f.
func writeLines(path string, n int, f func(i int) ([]byte, error)) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(out, 1<<20)
	for i := range n {
		b, err := f(i)
		if err != nil {
			out.Close()
			return fmt.Errorf("gen: %s line %d: %w", path, i+1, err)
		}
		w.Write(b)
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// lineFunc produces line i of a file.
type lineFunc func(i int) ([]byte, error)

// writeLinesParallel writes n lines like writeLines, producing them on every CPU:
// each worker gets its own lineFunc from newWorker (for its own buffers and
// caches) and takes every w-th line of a batch; the batch is written in order.
func writeLinesParallel(path string, n int, newWorker func() lineFunc) error {
	workers := min(runtime.GOMAXPROCS(0), 8)
	fs := make([]lineFunc, workers)
	for w := range fs {
		fs[w] = newWorker()
	}
	const batch = 512
	lines := make([][]byte, batch)
	errs := make([]error, workers)
	var start int
	return writeLines(path, n, func(i int) ([]byte, error) {
		if i%batch == 0 {
			start = i
			end := min(i+batch, n)
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := start + w; j < end; j += workers {
						if errs[w] == nil {
							lines[j-start], errs[w] = fs[w](j)
						}
					}
				}()
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					return nil, err
				}
			}
		}
		return lines[i-start], nil
	})
}

// depthHeap orders events by depth, deepest first, then by index, latest first.
type depthHeap struct {
	r *room
	x []int32
}

func (h *depthHeap) Len() int { return len(h.x) }
func (h *depthHeap) Less(i, j int) bool {
	a, b := h.r.events[h.x[i]], h.r.events[h.x[j]]
	if a.depth != b.depth {
		return a.depth > b.depth
	}
	return h.x[i] > h.x[j]
}
func (h *depthHeap) Swap(i, j int) { h.x[i], h.x[j] = h.x[j], h.x[i] }
func (h *depthHeap) Push(v any)    { h.x = append(h.x, v.(int32)) }
func (h *depthHeap) Pop() any {
	v := h.x[len(h.x)-1]
	h.x = h.x[:len(h.x)-1]
	return v
}

// writeBackfill writes the backfill order: from the forward extremities back along
// prev_events, deepest first, in batches (one /backfill response each).
func (r *room) writeBackfill(path string, tips []int32) error {
	seen := make([]bool, len(r.events))
	h := &depthHeap{r: r}
	for _, t := range tips {
		seen[t] = true
		heap.Push(h, t)
	}
	var order []int32
	for h.Len() > 0 {
		x := heap.Pop(h).(int32)
		order = append(order, x)
		for _, p := range r.events[x].prev {
			if !seen[p] {
				seen[p] = true
				heap.Push(h, p)
			}
		}
	}
	// Events no tip reaches (rejected dead ends) come last, newest first.
	for i := len(r.events) - 1; i >= 0; i-- {
		if !seen[i] {
			order = append(order, int32(i))
		}
	}
	if err := writeLines(path, len(order), func(i int) ([]byte, error) {
		return json.Marshal(struct {
			EventID string `json:"event_id"`
			Batch   int    `json:"batch"`
		}{r.events[order[i]].id, i / r.opts.BackfillBatch})
	}); err != nil {
		return err
	}
	// The same order as PDUs, ready for import --any-order.
	return writeLinesParallel(filepath.Join(filepath.Dir(path), "events_backfill.jsonl"), len(order), func() lineFunc {
		return func(i int) ([]byte, error) { return r.readLine(order[i]) }
	})
}

// stateEncoder writes expected_state.jsonl lines as json.Marshal would write
// {"event_id": id, "state": map} (keys sorted, escaped the same way), reusing the
// encoded keys and a sort buffer across lines.
type stateEncoder struct {
	r    *room
	keys *keyRanks
	ents []uint64 // rank<<32 | event index
}

// keyRanks numbers the room's state keys in sorted order.
type keyRanks struct {
	rank []int32  // by event index: the rank of its state key, or -1
	json [][]byte // by rank: the key as a JSON string
}

// stateKeyRanks ranks the state keys of every state event of the room. A state
// map's entry k -> v has events[v].key == k, so an entry's rank is rank[v].
func (r *room) stateKeyRanks() *keyRanks {
	var keys []string
	for _, e := range r.events {
		if e.key != "" {
			keys = append(keys, e.key)
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	kr := &keyRanks{rank: make([]int32, len(r.events)), json: make([][]byte, len(keys))}
	for i, k := range keys {
		kr.json[i] = jsonstr.Append(nil, k)
	}
	for i, e := range r.events {
		kr.rank[i] = -1
		if e.key != "" {
			j, _ := slices.BinarySearch(keys, e.key)
			kr.rank[i] = int32(j)
		}
	}
	return kr
}

func (s *stateEncoder) stateLine(b []byte, id string, st pmap) []byte {
	s.ents = s.ents[:0]
	st.each(func(_ string, v int32) { s.ents = append(s.ents, uint64(s.keys.rank[v])<<32|uint64(uint32(v))) })
	slices.Sort(s.ents)
	b = slices.Grow(b, len(s.ents)*112)
	b = append(b, `{"event_id":`...)
	b = jsonstr.Append(b, id)
	b = append(b, `,"state":{`...)
	for i, x := range s.ents {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, s.keys.json[x>>32]...)
		// Event IDs are "$" and unpadded URL-safe base64: nothing to escape.
		b = append(b, `:"`...)
		b = append(b, s.r.events[int32(uint32(x))].id...)
		b = append(b, '"')
	}
	return append(b, "}}"...)
}
