package roomrecord

import (
	"fmt"
	"slices"
	"testing"
)

// BenchmarkExtremityHeadPerBatch is the head write of one 1,000-event import
// batch in a room that already has size forward extremities (the generated
// 1M-event room ends with 9,883): layout=inline writes every extremity in the
// head, as version 1 does (collect, sort, encode); layout=chunks lays the set
// out with ExtremitySet.Store and encodes the head and the chunks that changed;
// layout=none only makes the batch's event IDs and set changes, the part of
// the others' time that is not the head's.
// Per batch, 10 of the new events stay extremities and the others are pointed
// at by the next one. bytes/batch is what the batch writes for the set before
// compression.
func BenchmarkExtremityHeadPerBatch(b *testing.B) {
	for _, size := range []int{1_000, 10_000} {
		for _, layout := range []string{"none", "inline", "chunks"} {
			b.Run(fmt.Sprintf("size=%d/layout=%s", size, layout), func(b *testing.B) {
				set := map[string]bool{}
				es := NewExtremitySet(Head{})
				h := Head{RoomID: "!r", RoomVersion: "12", Events: 1 << 31}
				next := 0
				batch := func() {
					prev := ""
					for i := range 1000 {
						id := fmt.Sprintf("$%043d", next*7919%1_000_003+next)
						next++
						if prev != "" && i%100 != 0 {
							delete(set, prev)
							es.Remove(prev)
						}
						set[id] = true
						es.Add(id)
						prev = id
					}
				}
				for len(set) < size {
					batch()
					es.Store(&h)
				}
				written := 0
				b.ResetTimer()
				old := Head{RoomID: h.RoomID, RoomVersion: h.RoomVersion, Events: h.Events}
				for b.Loop() {
					batch()
					switch layout {
					case "none":
						continue
					case "inline":
						old.ForwardExtremities = slices.Sorted(func(yield func(string) bool) {
							for id := range set {
								if !yield(id) {
									return
								}
							}
						})
						written += len(EncodeHead(&old))
						continue
					}
					for _, r := range es.Store(&h) {
						written += len(r.Data)
					}
					written += len(EncodeHead(&h))
				}
				b.ReportMetric(float64(written)/float64(b.N), "bytes/batch")
			})
		}
	}
}
