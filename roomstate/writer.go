package roomstate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomrecord"
)

// errInMemory is returned by the StateWriter calls that write records other than
// HAMT nodes when the writer keeps its nodes in memory (Room.StateWriter(true)).
var errInMemory = errors.New("roomstate: state writer keeps its nodes in memory: it writes no records")

// StateWriter writes a room's states: snapshots updated by (event_type,
// state_key) -> event ID (the HAMT encoding of roomrecord.StateKey and
// roomrecord.EventRecordID stays inside), the state records of events, and the
// room head. Replay and state resolution write through it. Writes to one room
// must be serialised by the caller, as for Import.
type StateWriter struct {
	r        *Room
	nodes    hamtstore.NodeStore
	rd       *hamtstore.Reader
	inMemory bool
	behind   *writeBehind // nil unless WriteBehind was called
}

// StateWriter returns a writer for this room. With inMemory, the snapshot nodes
// it writes go to memory over the room's stored ones (the store may be open
// read-only), and the calls that write records return an error.
func (r *Room) StateWriter(inMemory bool) *StateWriter {
	w := &StateWriter{r: r, nodes: r.nodes(), inMemory: inMemory}
	if inMemory {
		w.nodes = hamtstore.NewOverlay(w.nodes)
	}
	w.rd = hamtstore.NewReader(w.nodes)
	return w
}

// WriteBehind makes the writer hold the snapshot nodes Apply writes and write
// them, followed by the state records, when PutEventStates or Commit is called,
// on a goroutine of its own while the caller goes on (one write at a time; a
// write's error is returned by the next PutEventStates, Commit or Wait). Nodes
// held or being written are read from memory. Nothing is durable before Commit
// returns, as without it. Call it before any other method; the caller must end
// with Commit or Wait, so that no write is left running when the store closes.
// A writer that keeps its nodes in memory is left as it is.
func (w *StateWriter) WriteBehind() {
	if w.inMemory || w.behind != nil {
		return
	}
	w.behind = newWriteBehind(nodeStore{eng: w.r.s.eng, coll: w.r.coll})
	w.nodes = w.behind
	w.rd = hamtstore.NewReader(w.nodes)
}

// Wait waits for the write WriteBehind started, if any, and returns its error.
func (w *StateWriter) Wait() error {
	if w.behind == nil {
		return nil
	}
	if err := w.behind.wait(); err != nil {
		return fmt.Errorf("roomstate: room %s: write snapshot nodes and state records: %w", w.r.head.RoomID, err)
	}
	return nil
}

// Reader returns the reader this writer updates: it sees the nodes the writer
// wrote, the in-memory ones too.
func (w *StateWriter) Reader() *hamtstore.Reader { return w.rd }

// Apply returns the snapshot root with the keys of del removed and those of set
// set to their event IDs. The result is canonical: the same entries give the
// same root whatever the order of the changes. Errors: the context's, a read or
// corruption error of the snapshot, or the write error of its new nodes.
func (w *StateWriter) Apply(ctx context.Context, root hamtstore.NodeID, set map[roomrecord.StatePair]string, del []roomrecord.StatePair) (hamtstore.NodeID, error) {
	if err := ctx.Err(); err != nil {
		return hamtstore.NodeID{}, err
	}
	changes := make([]hamtstore.Change, 0, len(set)+len(del))
	for _, k := range del {
		changes = append(changes, hamtstore.Change{Key: roomrecord.StateKey(k.Type, k.StateKey), Delete: true})
	}
	keys := make([]roomrecord.StatePair, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	if len(keys) > 1 {
		slices.SortFunc(keys, func(a, b roomrecord.StatePair) int {
			if c := strings.Compare(a.Type, b.Type); c != 0 {
				return c
			}
			return strings.Compare(a.StateKey, b.StateKey)
		})
	}
	for _, k := range keys {
		changes = append(changes, hamtstore.Change{Key: roomrecord.StateKey(k.Type, k.StateKey),
			Value: hamtstore.Value(roomrecord.EventRecordID(set[k]))})
	}
	nr, err := hamtstore.Apply(w.nodes, w.rd, root, changes)
	if err != nil {
		return hamtstore.NodeID{}, fmt.Errorf("roomstate: room %s: write snapshot: %w", w.r.head.RoomID, err)
	}
	return nr, nil
}

// PutEventStates writes the state records of several events in one batch:
// states[i] is that of eventIDs[i].
func (w *StateWriter) PutEventStates(ctx context.Context, eventIDs []string, states []roomrecord.EventState) error {
	if err := w.writable(ctx); err != nil {
		return err
	}
	recs := make([]packstore.Record, len(eventIDs))
	for i, id := range eventIDs {
		recs[i] = packstore.Record{ID: roomrecord.StateRecordID(roomrecord.EventRecordID(id)), Data: roomrecord.EncodeState(&states[i])}
	}
	if w.behind != nil {
		if err := w.behind.flush(recs); err != nil {
			return fmt.Errorf("roomstate: room %s: write snapshot nodes and state records: %w", w.r.head.RoomID, err)
		}
		return nil
	}
	if err := w.r.s.eng.PutMany(w.r.coll, recs); err != nil {
		return fmt.Errorf("roomstate: room %s: write state records: %w", w.r.head.RoomID, err)
	}
	return nil
}

// Commit makes everything written so far durable (the engine's Sync), after
// writing head h as the room's new head record when h is not nil. The head's
// forward extremities are stored sorted, laid out from how the stored head
// holds them (roomrecord.ExtremitySet: only the extremity chunks that change
// are written); Commit sets h's ForwardExtremities, InlineExtremities and
// ExtremityChunks to what it wrote. On an engine several processes write,
// the head is written only if the stored head is the one this Room last read or
// wrote; otherwise the error wraps packstore.ErrConflict.
func (w *StateWriter) Commit(ctx context.Context, h *roomrecord.Head) error {
	if err := w.writable(ctx); err != nil {
		return err
	}
	r := w.r
	if w.behind != nil {
		if err := w.behind.flush(nil); err != nil {
			return fmt.Errorf("roomstate: room %s: write snapshot nodes and state records: %w", r.head.RoomID, err)
		}
		if err := w.Wait(); err != nil {
			return err
		}
	}
	if h != nil {
		r.refresh()
		if h.RoomID != r.head.RoomID {
			return fmt.Errorf("roomstate: head for %s names room %s", r.head.RoomID, h.RoomID)
		}
		set := roomrecord.NewExtremitySet(r.head)
		set.Set(h.ForwardExtremities)
		if err := r.putWithHead(set.Store(h), *h); err != nil {
			return fmt.Errorf("roomstate: room %s: write head: %w", r.head.RoomID, err)
		}
	}
	if err := r.s.eng.Sync(); err != nil {
		return fmt.Errorf("roomstate: room %s: sync: %w", r.head.RoomID, err)
	}
	return nil
}

func (w *StateWriter) writable(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if w.inMemory {
		return fmt.Errorf("room %s: %w", w.r.head.RoomID, errInMemory)
	}
	return nil
}
