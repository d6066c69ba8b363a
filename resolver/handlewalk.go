package resolver

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// walkSet is a finished walk of lockstep: the events it reached (not its start
// events, unless reached again from another), and whether a path from an event
// along the walk's direction through events of the walk ends at a target.
type walkSet interface {
	// forSeen calls fn for every event the walk reached, stopping at its error.
	forSeen(fn func(id string) error) error
	// setTargets names the targets reaches looks for.
	setTargets(targets map[string]bool)
	// reaches reports, for the ancestors walk, whether id descends from a
	// target; for the descendants walk, whether it is an ancestor of one. An
	// auth_events cycle is an ErrResolution error.
	reaches(id string) (bool, error)
	// forSeenReaching calls fn for every event the walk reached that reaches a
	// target, stopping at an error of reaches.
	forSeenReaching(fn func(id string)) error
}

func (w *reachWalk) forSeenReaching(fn func(id string)) error {
	for id := range w.seen {
		r, err := w.reaches(id)
		if err != nil {
			return err
		}
		if r {
			fn(id)
		}
	}
	return nil
}

// forSeenReaching is reachWalk's by handle: no ID lookups.
func (w *handleWalk) forSeenReaching(fn func(id string)) error {
	for _, h := range w.seen {
		r, err := w.reachesHandle(h)
		if err != nil {
			return err
		}
		if r {
			fn(w.g.ids[h])
		}
	}
	return nil
}

func (w *reachWalk) forSeen(fn func(id string) error) error {
	for id := range w.seen {
		if err := fn(id); err != nil {
			return err
		}
	}
	return nil
}

func (w *reachWalk) setTargets(targets map[string]bool) { w.targets = targets }

// handleWalk is one walk of lockstep over the roomResolver's auth index: graph
// handles and per-handle flags (reachMarks) instead of event IDs and maps. It
// walks what a reachWalk over the roomResolver's GraphSource methods walks
// (AuthEvents or AuthChildren, keeping events by AuthOrder against bound), in
// the same order.
type handleWalk struct {
	g     *graph
	upTo  int32 // the descendants walk's limit on auth children (graph.childHandles)
	down  bool
	bound int64 // ancestors: keep auth depth >= bound; descendants: < bound
	m     *reachMarks
	shift uint // this walk's flags: flagSeen<<shift ...
	stack []int32
	seen  []int32 // reached, in order
}

// Per-handle flags of a handleWalk, shifted by its shift (two walks share one
// reachMarks), and the targets' flag, shared.
const (
	flagSeen uint16 = 1 << iota
	flagVisiting
	flagReaches
	flagNoReach
	walkFlagBits = iota

	flagTarget uint16 = 1 << (2 * walkFlagBits)
)

// reachMarks are the flags of the handles of a room for one lockstep, cleared
// lazily by epoch.
type reachMarks struct {
	stamp []uint32
	flags []uint16
	epoch uint32
}

var reachMarksPool sync.Pool

// getReachMarks returns marks for n handles with a fresh epoch: slot's spare
// if there is one (slot may be nil), else one from the pool (put back with
// giveSpare).
func getReachMarks(slot *atomic.Pointer[reachMarks], n int) *reachMarks {
	m := takeSpare(slot, &reachMarksPool)
	if m == nil {
		m = &reachMarks{}
	}
	if len(m.stamp) < n {
		size := n + n/8 + 64 // as getMarks: room for a generated room's growth
		*m = reachMarks{stamp: make([]uint32, size), flags: make([]uint16, size)}
	}
	m.epoch++
	if m.epoch == 0 {
		clear(m.stamp)
		m.epoch = 1
	}
	return m
}

// get returns h's flags in this epoch.
func (m *reachMarks) get(h int32) uint16 {
	if m.stamp[h] != m.epoch {
		return 0
	}
	return m.flags[h]
}

// set adds f to h's flags.
func (m *reachMarks) set(h int32, f uint16) {
	if m.stamp[h] != m.epoch {
		m.stamp[h] = m.epoch
		m.flags[h] = 0
	}
	m.flags[h] |= f
}

// clearFlags removes f from h's flags.
func (m *reachMarks) clearFlags(h int32, f uint16) {
	if m.stamp[h] == m.epoch {
		m.flags[h] &^= f
	}
}

func (w *handleWalk) done() bool { return len(w.stack) == 0 }

// next returns the handles one step from h in the walk's direction; -1 for an
// auth event not in the room.
func (w *handleWalk) next(h int32) []int32 {
	if w.down {
		return w.g.childHandles(h, w.upTo)
	}
	return w.g.g.Auth(int(h))
}

// step expands one event of the walk.
func (w *handleWalk) step() error {
	cur := w.stack[len(w.stack)-1]
	w.stack = w.stack[:len(w.stack)-1]
	seen := flagSeen << w.shift
	for j, a := range w.next(cur) {
		if a < 0 {
			id := w.g.g.MissingAuth(int(cur), j)
			return fmt.Errorf("%w: %s: not in the room", errNoEvent, id)
		}
		if w.m.get(a)&seen != 0 {
			continue
		}
		d, err := w.g.authDepth(a)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", errNoEvent, w.g.ids[a], err)
		}
		if w.down && d >= w.bound || !w.down && d < w.bound {
			continue
		}
		w.m.set(a, seen)
		w.seen = append(w.seen, a)
		w.stack = append(w.stack, a)
	}
	return nil
}

func (w *handleWalk) forSeen(fn func(id string) error) error {
	for _, h := range w.seen {
		if err := fn(w.g.ids[h]); err != nil {
			return err
		}
	}
	return nil
}

func (w *handleWalk) setTargets(targets map[string]bool) {
	for id, ok := range targets {
		if h, found := w.g.index.find(w.g.ids, id); ok && found {
			w.m.set(h, flagTarget)
		}
	}
}

func (w *handleWalk) reaches(id string) (bool, error) {
	h, err := w.g.idx(id)
	if err != nil {
		return false, err
	}
	return w.reachesHandle(h)
}

// reachesHandle is reaches by handle, with its answers kept in the flags.
func (w *handleWalk) reachesHandle(h int32) (bool, error) {
	visiting, yes, no, seen := flagVisiting<<w.shift, flagReaches<<w.shift, flagNoReach<<w.shift, flagSeen<<w.shift
	switch f := w.m.get(h); {
	case f&visiting != 0:
		return false, fmt.Errorf("%w: auth_events cycle at %s", ErrResolution, w.g.ids[h])
	case f&yes != 0:
		return true, nil
	case f&no != 0:
		return false, nil
	}
	w.m.set(h, visiting)
	r := false
	for _, a := range w.next(h) {
		if a < 0 {
			continue
		}
		f := w.m.get(a)
		if f&flagTarget != 0 {
			r = true
		}
		if f&seen != 0 {
			ra, err := w.reachesHandle(a)
			if err != nil {
				return false, err
			}
			r = r || ra
		}
	}
	w.m.clearFlags(h, visiting)
	if r {
		w.m.set(h, yes)
	} else {
		w.m.set(h, no)
	}
	return r, nil
}

// lockstepHandles is lockstep over the roomResolver's auth index (handleWalk),
// with a floor set. Both walks share one reachMarks, which releaseWalk puts
// back.
func (st *stateRes) lockstepHandles(upFrom []string, floor int64, downFrom []string, top int64) (walkSet, bool, error) {
	g, err := st.r.graph()
	if err != nil {
		return nil, false, err
	}
	handles := func(ids []string) ([]int32, error) {
		hs := make([]int32, len(ids))
		for i, id := range ids {
			if hs[i], err = g.idx(id); err != nil {
				return nil, fmt.Errorf("%w: %s: %v", errNoEvent, id, err)
			}
		}
		return hs, nil
	}
	up, err := handles(upFrom)
	if err != nil {
		return nil, false, err
	}
	m := getReachMarks(g.markSpares().reachSlot(), len(g.ids))
	anc := &handleWalk{g: g, bound: floor, m: m, stack: up}
	var desc *handleWalk
	if walkDirection != walkUp {
		down, err := handles(downFrom)
		if err != nil {
			giveSpare(g.markSpares().reachSlot(), &reachMarksPool, m)
			return nil, false, err
		}
		desc = &handleWalk{g: g, upTo: st.r.upTo, down: true, bound: top, m: m, shift: walkFlagBits, stack: down}
	}
	for {
		if desc == nil || walkDirection != walkDown {
			if anc.done() {
				return anc, true, nil
			}
			if err := anc.step(); err != nil {
				giveSpare(g.markSpares().reachSlot(), &reachMarksPool, m)
				return nil, false, err
			}
		}
		if desc != nil {
			if desc.done() {
				return desc, false, nil
			}
			if err := desc.step(); err != nil {
				giveSpare(g.markSpares().reachSlot(), &reachMarksPool, m)
				return nil, false, err
			}
		}
	}
}

// releaseWalk puts back what a walk of lockstep holds from a pool.
func releaseWalk(w walkSet) {
	if hw, ok := w.(*handleWalk); ok {
		giveSpare(hw.g.markSpares().reachSlot(), &reachMarksPool, hw.m)
	}
}
