package roomrecord

import (
	"strconv"

	"github.com/mtxdb/mtxdb/packstore"
)

// Read kinds roomstate tags its reads with when the engine counts reads by
// kind (packstore.KindGetter); other engines are read with Get.
const (
	// ReadNode: a HAMT node of a state snapshot (roomstate reads snapshots by node).
	ReadNode packstore.ReadKind = 1 + iota
	// ReadPDU: an event's PDU record.
	ReadPDU
	// ReadMeta: an event's metadata record (prev and auth edges, depth).
	ReadMeta
	// ReadOther: room head, arrival log chunks, per-event state records.
	ReadOther
)

// ReadKinds lists roomstate's read kinds in display order.
var ReadKinds = []packstore.ReadKind{ReadNode, ReadPDU, ReadMeta, ReadOther}

// ReadKindName names a read kind ("node", "pdu", "meta", "other"; "untagged"
// for packstore.ReadUntagged).
func ReadKindName(k packstore.ReadKind) string {
	switch k {
	case ReadNode:
		return "node"
	case ReadPDU:
		return "pdu"
	case ReadMeta:
		return "meta"
	case ReadOther:
		return "other"
	case packstore.ReadUntagged:
		return "untagged"
	}
	return "kind" + strconv.Itoa(int(k))
}
