package roomstate

import (
	"errors"
	"fmt"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomrecord"
)

// hasGraphRecords reports whether the room's events have graph records (rooms
// imported before they existed have none: their graph comes from the metadata).
func (r *Room) hasGraphRecords() (bool, error) {
	if r.head.LogChunks == 0 {
		return false, nil
	}
	_, err := getKind(r.s.eng, r.coll, roomrecord.GraphChunkID(0), roomrecord.ReadMeta)
	if errors.Is(err, packstore.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Graph loads the room's DAG in dense form: from the graph records (one per
// arrival-log chunk, written at import: a read per import batch), or, for a room
// imported before graph records existed, from the metadata records (a read per
// event).
func (r *Room) Graph() (*roomrecord.Graph, error) {
	ids, err := r.EventIDs()
	if err != nil {
		return nil, err
	}
	has, err := r.hasGraphRecords()
	if err != nil {
		return nil, fmt.Errorf("roomstate: room %s: graph record 0: %w", r.head.RoomID, err)
	}
	if !has {
		return r.graphFromMetadata(ids)
	}
	b := roomrecord.NewGraphBuilder(ids)
	for c := uint32(0); c < r.head.LogChunks; c++ {
		raw, err := getKind(r.s.eng, r.coll, roomrecord.GraphChunkID(c), roomrecord.ReadMeta)
		if err != nil {
			return nil, fmt.Errorf("roomstate: room %s: graph record %d: %w", r.head.RoomID, c, err)
		}
		if err := b.AddRecord(raw); err != nil {
			return nil, fmt.Errorf("room %s, graph record %d: %w", r.head.RoomID, c, err)
		}
	}
	g, err := b.Graph()
	if err != nil {
		return nil, fmt.Errorf("room %s: %w", r.head.RoomID, err)
	}
	return g, nil
}

// graphFromMetadata builds the graph of the events ids (the arrival log) from
// their metadata records, one at a time.
func (r *Room) graphFromMetadata(ids []string) (*roomrecord.Graph, error) {
	b := roomrecord.NewGraphBuilder(ids)
	for _, id := range ids {
		m, err := r.Meta(id)
		if err != nil {
			return nil, err
		}
		if err := b.AddMeta(&m); err != nil {
			return nil, fmt.Errorf("room %s: %w", r.head.RoomID, err)
		}
	}
	return b.Graph()
}
