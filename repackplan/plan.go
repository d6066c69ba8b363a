// Package repackplan derives repack orders for a room from its DAG walks
// (docs/benchmarks.md, repack). A plan lists every live record of the room exactly
// once, in the order a walk reads them; packstore executes plans without knowing what
// the records are, and anything a plan leaves out is garbage.
//
// # Liveness
//
// What is live is an explicit policy, Options.Liveness:
//
//   - AllSnapshots (the default): every imported event with its PDU, metadata and
//     state record, every HAMT node reachable from any event's state snapshot before
//     or after and from the current state, the room head and the arrival log.
//   - EveryK: the same, except that the state record of an event is live only when
//     the room head's keep rule requires it (roomrecord.Head.KeepsState with K =
//     Options.Every: the forward extremities, state events, every event whose
//     arrival index is a multiple of K, events that arrived after the rule was set)
//     or the event was rejected; the other events keep their PDU and metadata (their
//     edges). Their state records, and every HAMT node reachable only from their
//     snapshots, are garbage. Plan first sets the rule on the room head
//     (keepStateEvery: a head write and a sync) so readers can tell a
//     dropped state (roomstate.ErrStateNotKept) from a lost one.
//
// Under both, superseded state records of earlier replays and nodes no kept snapshot
// reaches are garbage; so are records of outliers' snapshots (they have none). A
// state record dropped by an earlier every-k repack stays dropped under AllSnapshots:
// only `mtxdb replay --force` writes it again.
package repackplan

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomstate"
)

// Kind names a plan kind.
type Kind string

const (
	// ReverseTopological orders events newest first along prev_events from the
	// forward extremities (the walk /sync and backfill do), by descending depth, ties
	// by descending arrival; each event's PDU, metadata and state record are followed
	// by the HAMT nodes its snapshots add to those already placed.
	ReverseTopological Kind = "reverse-topological"
	// AuthChain places first what the auth walks of state resolution read: starting
	// from the forward extremities and the current state's events, breadth-first over
	// auth_events, each reached event's metadata (its auth edges) and PDU; then the
	// rest in reverse-topological order.
	AuthChain Kind = "auth-chain"
	// EdgesFirst places every event's metadata record (prev and auth edges, depth) in
	// reverse-topological order as one dense region, like a commit-graph sidecar, so
	// both DAG walks read only that region; then, in the same order, each event's PDU,
	// state record and new snapshot nodes.
	EdgesFirst Kind = "edges-first"
	// Mixed lays a room out in walk regions (bench-repack showed the per-event
	// interleaving of state records and snapshot nodes dilutes the DAG walks):
	// the room records and the current state's nodes; the auth walk from the
	// forward extremities (metadata and PDU of each event, in the walk's order),
	// then the auth chains of the current state's events; every other event's
	// metadata and PDU in reverse-topological order (the backfill walk); then, in
	// reverse-topological order, each event's state record and new snapshot nodes
	// (what state resolution and state queries read).
	Mixed Kind = "mixed"
)

// Kinds lists the plan kinds.
var Kinds = []Kind{ReverseTopological, AuthChain, EdgesFirst, Mixed}

// Liveness names a liveness policy: which state records and snapshots a plan keeps.
type Liveness string

const (
	// AllSnapshots keeps every event's state record and both its snapshots.
	AllSnapshots Liveness = "all-snapshots"
	// EveryK keeps the state record and snapshots only of the events the room head's
	// keep rule names (roomrecord.Head.KeepsState, K = Options.Every) and of rejected
	// events; the rest are garbage.
	EveryK Liveness = "every-k"
)

// Livenesses lists the liveness policies.
var Livenesses = []Liveness{AllSnapshots, EveryK}

// Options choose a plan.
type Options struct {
	Kind     Kind     // plan kind; empty: ReverseTopological
	Liveness Liveness // empty: AllSnapshots
	// Every is K of EveryK: every K-th event by arrival index keeps its state
	// (K >= 1; 1 keeps every state, like AllSnapshots). Ignored under AllSnapshots.
	Every uint32
}

// Errors of Plan.
var (
	// ErrNotReplayed is returned for a room whose events have no state records yet.
	ErrNotReplayed = errors.New("repackplan: room not replayed")
	// ErrBadOptions is returned for an unknown plan kind or liveness policy, or
	// EveryK without Every.
	ErrBadOptions = errors.New("repackplan: bad options")
)

// Stats describes a plan.
type Stats struct {
	Events  int // events placed
	Nodes   int // HAMT nodes placed
	Records int // records in the plan
	Walked  int // events reached from the forward extremities (the rest follow in arrival order)
	// StatesDropped counts state records left out as garbage by EveryK (their
	// snapshots' nodes no kept snapshot reaches go with them, uncounted here).
	StatesDropped int
}

// Plan builds a plan for one room. The room must be replayed (its state records and
// snapshots are live data). Under EveryK it first sets the room head's keep rule
// (roomrecord.Head.WithKeepRule, written and synced), so it writes to the store; the plan then holds the
// new head.
func Plan(ctx context.Context, room *roomstate.Room, opts Options) (packstore.CollectionPlan, Stats, error) {
	kind := opts.Kind
	if kind == "" {
		kind = ReverseTopological
	}
	if !slices.Contains(Kinds, kind) {
		return packstore.CollectionPlan{}, Stats{}, fmt.Errorf("%w: unknown plan kind %q (have %v)", ErrBadOptions, kind, Kinds)
	}
	switch opts.Liveness {
	case "", AllSnapshots:
	case EveryK:
		if opts.Every == 0 {
			return packstore.CollectionPlan{}, Stats{}, fmt.Errorf("%w: %s needs Every >= 1", ErrBadOptions, EveryK)
		}
	default:
		return packstore.CollectionPlan{}, Stats{}, fmt.Errorf("%w: unknown liveness %q (have %v)", ErrBadOptions, opts.Liveness, Livenesses)
	}
	if !room.Head().Replayed {
		return packstore.CollectionPlan{}, Stats{}, fmt.Errorf("%w: %s", ErrNotReplayed, room.ID())
	}
	p := &planner{room: room, rd: room.NewReader(), placed: map[packstore.ID]bool{}}
	if opts.Liveness == EveryK {
		if err := keepStateEvery(ctx, room, opts.Every); err != nil {
			return packstore.CollectionPlan{}, Stats{}, fmt.Errorf("repackplan: %w", err)
		}
		p.dropStates = true
	}
	h := room.Head()
	p.plan.Collection = roomrecord.CollectionID(room.ID())
	for _, id := range room.RoomRecords() {
		p.add(id)
	}
	if err := p.addSnapshot(h.CurrentState); err != nil {
		return p.plan, p.stats, err
	}
	ids, err := room.EventIDs()
	if err != nil {
		return p.plan, p.stats, err
	}
	p.metas = make(map[string]roomrecord.EventMeta, len(ids))
	for _, id := range ids {
		m, err := room.Meta(id)
		if err != nil {
			return p.plan, p.stats, err
		}
		p.metas[id] = m
	}
	order, err := p.reverseTopological(ids)
	if err != nil {
		return p.plan, p.stats, err
	}
	switch kind {
	case AuthChain:
		if err := p.addAuthWalk(); err != nil {
			return p.plan, p.stats, err
		}
	case Mixed:
		if err := p.addAuthWalk(); err != nil {
			return p.plan, p.stats, err
		}
		for _, id := range order {
			ev, meta, _ := roomrecord.EventRecords(id)
			p.add(meta)
			p.add(ev)
		}
	case EdgesFirst:
		for _, id := range order {
			_, meta, _ := roomrecord.EventRecords(id)
			p.add(meta)
		}
	}
	for _, id := range order {
		if err := p.addEvent(id); err != nil {
			return p.plan, p.stats, err
		}
	}
	p.stats.Records = len(p.plan.Records)
	return p.plan, p.stats, nil
}

// reverseTopological returns every event: those reachable from the forward
// extremities newest first (descending depth, then descending arrival), then the
// rest in arrival order.
func (p *planner) reverseTopological(ids []string) ([]string, error) {
	q := &eventHeap{}
	queued := map[string]bool{}
	push := func(id string) {
		if !queued[id] {
			queued[id] = true
			heap.Push(q, p.metas[id])
		}
	}
	for _, f := range p.room.Head().ForwardExtremities {
		if _, ok := p.metas[f]; !ok {
			return nil, fmt.Errorf("repackplan: room %s: forward extremity %s is not an imported event", p.room.ID(), f)
		}
		push(f)
	}
	order := make([]string, 0, len(ids))
	for q.Len() > 0 {
		m := heap.Pop(q).(roomrecord.EventMeta)
		order = append(order, m.EventID)
		p.stats.Walked++
		for _, prev := range m.PrevEvents {
			if _, ok := p.metas[prev]; ok {
				push(prev)
			}
		}
	}
	for _, id := range ids {
		if !queued[id] {
			order = append(order, id)
		}
	}
	return order, nil
}

// addAuthWalk places, breadth-first over auth_events from the forward extremities
// (the order of Walk's auth-chain walk), each reached event's metadata and PDU;
// then, breadth-first again, the auth chains of the current state's events.
func (p *planner) addAuthWalk() error {
	var queue []string
	seen := map[string]bool{}
	push := func(id string) {
		if _, ok := p.metas[id]; ok && !seen[id] {
			seen[id] = true
			queue = append(queue, id)
		}
	}
	drain := func() {
		for len(queue) > 0 {
			id := queue[0]
			queue = queue[1:]
			ev, meta, _ := roomrecord.EventRecords(id)
			p.add(meta)
			p.add(ev)
			for _, a := range p.metas[id].AuthEvents {
				push(a)
			}
		}
	}
	for _, f := range p.room.Head().ForwardExtremities {
		push(f)
	}
	drain()
	err := p.rd.Iterate(p.room.Head().CurrentState, func(_ []byte, v hamtstore.Value) error {
		m, err := p.room.MetaByRecord(packstore.ID(v))
		if err != nil {
			return err
		}
		push(m.EventID)
		return nil
	})
	if err != nil {
		return fmt.Errorf("repackplan: room %s: current state: %w", p.room.ID(), err)
	}
	drain()
	return nil
}

type planner struct {
	room   *roomstate.Room
	rd     *hamtstore.Reader
	metas  map[string]roomrecord.EventMeta
	placed map[packstore.ID]bool
	plan   packstore.CollectionPlan
	stats  Stats
	// dropStates: EveryK, leave out the state records the head's rule does not keep.
	dropStates bool
}

func (p *planner) add(id packstore.ID) bool {
	if p.placed[id] {
		return false
	}
	p.placed[id] = true
	p.plan.Records = append(p.plan.Records, id)
	return true
}

// addSnapshot places the nodes of a snapshot not placed yet, parents before children.
func (p *planner) addSnapshot(root hamtstore.NodeID) error {
	if root == hamtstore.EmptyRoot {
		return nil
	}
	err := p.rd.Walk(root, func(id hamtstore.NodeID) (bool, error) {
		if !p.add(packstore.ID(id)) {
			return false, nil // placed with an earlier snapshot, and so is its subtree
		}
		p.stats.Nodes++
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("repackplan: room %s: snapshot %v: %w", p.room.ID(), root, err)
	}
	return nil
}

func (p *planner) addEvent(eventID string) error {
	ev, meta, state := roomrecord.EventRecords(eventID)
	p.add(ev)
	p.add(meta)
	st, ok, err := p.room.EventState(eventID)
	if err != nil {
		return err
	}
	if !ok {
		// The room head says replayed, so this is an outlier (an ancestor never
		// arrived): its PDU and edges are live, it has no snapshots.
		p.stats.Events++
		return nil
	}
	p.stats.Events++
	if p.dropStates && !st.Rejected && !p.room.Head().KeepsState(p.metas[eventID]) {
		p.stats.StatesDropped++
		return nil
	}
	p.add(state)
	if err := p.addSnapshot(st.After); err != nil {
		return err
	}
	return p.addSnapshot(st.Before)
}

// eventHeap pops the greatest (depth, seq) first.
type eventHeap []roomrecord.EventMeta

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].Depth != h[j].Depth {
		return h[i].Depth > h[j].Depth
	}
	return h[i].Seq > h[j].Seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(roomrecord.EventMeta)) }
func (h *eventHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// keepStateEvery sets the room head's keep rule to every k-th event
// (roomrecord.Head.WithKeepRule), writes the head and syncs; a head that already
// has that rule over every event is left as it is.
func keepStateEvery(ctx context.Context, room *roomstate.Room, k uint32) error {
	h := room.Head()
	nh, err := h.WithKeepRule(k)
	if err != nil {
		return err
	}
	if nh.StateEvery == h.StateEvery && nh.StateKeptBelow == h.StateKeptBelow {
		return nil
	}
	return room.StateWriter(false).Commit(ctx, &nh)
}
