package roomstate

import "github.com/mtxdb/mtxdb/roomrecord"

// GraphFromMetadata loads the room's graph from its metadata records (a read per
// event), for the tests that compare it with Graph.
func (r *Room) GraphFromMetadata() (*roomrecord.Graph, error) {
	ids, err := r.EventIDs()
	if err != nil {
		return nil, err
	}
	return r.graphFromMetadata(ids)
}

// MaxLineBytesForTest is the longest line import holds.
const MaxLineBytesForTest = maxLineBytes
