package roomstate_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/mtxdb/mtxdb/hamtstore"
)

// Storage models of the two other homeservers, computed on the same history as ours
// (payload bytes only, no row or index overhead unless stated; docs/benchmarks.md,
// "What a state snapshot costs"):
//
//   - Dendrite: a snapshot is a list of state block NIDs (8 B each); a block is a
//     sorted list of event NIDs (8 B each). A new state event becomes a one-entry
//     block while the snapshot has fewer than 64 blocks; otherwise the whole state is
//     rewritten as one block. Reading any key loads every block of the snapshot.
//   - Synapse: a state group is a delta against its previous group, one row per
//     changed key, about 186 B per row with its indexes (one reported database);
//     after 100 hops the next group stores every entry again. Reading one key walks
//     the chain, one indexed query per group.
type dendriteModel struct{ blocks, members int }

func (d *dendriteModel) change() (written int) {
	if d.blocks < 64 {
		d.blocks++
		return 8 + 8*d.blocks // one-entry block + the snapshot's block list
	}
	d.blocks = 1
	return 8*d.members + 8
}

// lookupEntries is how many event NIDs a one-key read loads: the full block plus the
// one-entry blocks.
func (d *dendriteModel) lookupEntries() int { return d.members + d.blocks - 1 }

type synapseModel struct{ hops, members int }

const synapseRowBytes = 186

func (s *synapseModel) change() (written int) {
	if s.hops < 100 {
		s.hops++
		return synapseRowBytes
	}
	s.hops = 0
	return synapseRowBytes * s.members
}

func (s *synapseModel) lookupGroups() int { return s.hops + 1 }

// BenchmarkSnapshotOneChange: a history of single membership changes (joins and
// leaves of random members) in rooms of 1k, 10k and 100k members. Per new snapshot it
// reports our bytes and nodes written and the nodes a one-key lookup reads, beside
// what the Dendrite and Synapse models store and read for the same snapshots.
func BenchmarkSnapshotOneChange(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			st := &countingStore{MemNodeStore: hamtstore.NewMemNodeStore()}
			root := memberRoom(b, st, n)
			rng := rand.New(rand.NewPCG(1, uint64(n)))
			den := &dendriteModel{blocks: 1, members: n}
			syn := &synapseModel{members: n}
			var denBytes, synBytes, denLookup, synLookup, lookupNodes int
			st.reset()
			rd := hamtstore.NewReader(st)
			b.ResetTimer()
			ops := 0
			for ; b.Loop(); ops++ {
				u := rng.IntN(n)
				var err error
				root, err = hamtstore.Set(st, rd, root, roomrecord.StateKey("m.room.member", memberID(u)), eventValue(fmt.Sprint("change", ops)))
				if err != nil {
					b.Fatal(err)
				}
				denBytes += den.change()
				synBytes += syn.change()
				denLookup += den.lookupEntries()
				synLookup += syn.lookupGroups()

				// A cold one-key lookup in the new snapshot.
				cold := &countingStore{MemNodeStore: st.MemNodeStore}
				if _, _, err := hamtstore.NewReader(cold).Get(root, roomrecord.StateKey("m.room.member", memberID(rng.IntN(n)))); err != nil {
					b.Fatal(err)
				}
				lookupNodes += cold.reads
			}
			rd.Reset()
			f := float64(ops)
			b.ReportMetric(float64(st.bytes)/f, "B/snapshot")
			b.ReportMetric(float64(st.nodes)/f, "nodes/snapshot")
			b.ReportMetric(float64(lookupNodes)/f, "lookup-nodes")
			b.ReportMetric(float64(denBytes)/f, "dendrite-B/snapshot")
			b.ReportMetric(float64(denLookup)/f, "dendrite-lookup-entries")
			b.ReportMetric(float64(synBytes)/f, "synapse-B/snapshot")
			b.ReportMetric(float64(synLookup)/f, "synapse-lookup-groups")
		})
	}
}

// BenchmarkDiffChangedKeys: Diff between a 10k-member snapshot and one with k
// changed members reads nodes in proportion to k, not to the room.
func BenchmarkDiffChangedKeys(b *testing.B) {
	st := &countingStore{MemNodeStore: hamtstore.NewMemNodeStore()}
	base := memberRoom(b, st, 10_000)
	for _, k := range []int{1, 10, 100, 1000} {
		b.Run(fmt.Sprintf("k=%d", k), func(b *testing.B) {
			changes := make([]hamtstore.Change, k)
			for i := range changes {
				changes[i] = hamtstore.Change{Key: roomrecord.StateKey("m.room.member", memberID(i*7)), Value: eventValue(fmt.Sprint("k", i))}
			}
			other, err := hamtstore.Apply(st, nil, base, changes)
			if err != nil {
				b.Fatal(err)
			}
			reads := 0
			for b.Loop() {
				cold := &countingStore{MemNodeStore: st.MemNodeStore}
				seen := 0
				if err := hamtstore.NewReader(cold).Diff(base, other, func([]byte, *hamtstore.Value, *hamtstore.Value) error {
					seen++
					return nil
				}); err != nil || seen != k {
					b.Fatal(err, seen)
				}
				reads += cold.reads
			}
			b.ReportMetric(float64(reads)/float64(b.N), "nodes-read/diff")
		})
	}
}
