package packstore

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// splitCheckpoint returns a checkpoint with a table that
// decodeCompactSlots decodes in two halves (2^19 slots, about 45% used,
// 1.9 MB: more than readCheckpoint reads at once; over two shards) and a
// small table after it, and the expected per-shard counts.
func splitCheckpoint(t *testing.T) (*checkpoint, [MaxShards]int) {
	r := rand.New(rand.NewPCG(testSeed(t), 31))
	const size = HeaderSize + 1<<20
	cp := &checkpoint{gen: 3, covered: loc{1, size}, shards: []ckptShard{{0, size}, {1, size}}}
	var live [MaxShards]int
	for _, bits := range []uint{19, 3} {
		slots := make([]atomic.Uint64, 1<<bits)
		count := 0
		for i := range slots {
			if r.IntN(100) < 45 && (count+2)*4 <= len(slots)*3 {
				l := loc{shard: uint16(r.IntN(2)), off: uint32(HeaderSize + r.IntN(1<<20-FrameOverhead))}
				slots[i].Store(makeSlot(randID(r), l))
				live[l.shard]++
				count++
			}
		}
		cp.colls = append(cp.colls, ckptColl{coll: idN(1, int(bits)), bits: bits, count: count, liveBytes: int64(count) * FrameOverhead, slots: slots})
	}
	if n := len(cp.colls[0].slots); n < ckptSplitSlots {
		t.Fatalf("table of %d slots is not split", n)
	}
	return cp, live
}

// TestCheckpointSplitTable: a table decoded in two halves at once comes
// out slot for slot as encoded, with the per-shard counts of both halves,
// both from bytes in memory and through readCheckpoint (which decodes
// while another goroutine reads the file: the second half must wait for
// its bytes); the table after it decodes too.
func TestCheckpointSplitTable(t *testing.T) {
	cp, live := splitCheckpoint(t)
	b := encodeCheckpoint(cp)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, checkpointFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	s := &PackfileStorage{opts: Options{Dir: dir}, fs: osFS{}}
	var f indexFiles
	if err := s.readCheckpoint(&f); err != nil {
		t.Fatal(err)
	}
	for name, decode := range map[string]func() (*checkpoint, error){
		"memory":         func() (*checkpoint, error) { return decodeCheckpoint(b) },
		"readCheckpoint": func() (*checkpoint, error) { return f.cp, f.cpErr },
	} {
		got, err := decode()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if *got.live != live {
			t.Fatalf("%s: per-shard counts %v, want %v", name, got.live[:2], live[:2])
		}
		for c, cc := range got.colls {
			want := cp.colls[c]
			if cc.count != want.count || len(cc.slots) != len(want.slots) {
				t.Fatalf("%s: collection %d: %d of %d slots, want %d of %d", name, c, cc.count, len(cc.slots), want.count, len(want.slots))
			}
			for i := range cc.slots {
				if g, w := cc.slots[i].Load(), want.slots[i].Load(); g != w {
					t.Fatalf("%s: collection %d slot %d = %#x, want %#x", name, c, i, g, w)
				}
			}
		}
	}
}

// TestCheckpointSplitTableCorrupt: a bad slot in either half of a table
// decoded in two halves is reported with its slot index and file offset,
// and with bad slots in both halves the first half's is reported, as a
// sequential decode would.
func TestCheckpointSplitTableCorrupt(t *testing.T) {
	cp, _ := splitCheckpoint(t)
	slots := cp.colls[0].slots
	valsAt := ckptHeaderLen + len(cp.shards)*ckptShardLen + ckptCollHeadLen + len(slots)/8
	// usedAt returns the first used slot at or after i and the file offset
	// of its stored value.
	usedAt := func(i int) (int, int) {
		k := 0
		for j := range slots {
			if slots[j].Load() == 0 {
				continue
			}
			if j >= i {
				return j, valsAt + 8*k
			}
			k++
		}
		t.Fatal("no used slot")
		return 0, 0
	}
	first, firstAt := usedAt(len(slots) / 4)
	second, secondAt := usedAt(3 * len(slots) / 4)
	unlisted := makeSlot(ID{}, loc{shard: 7, off: HeaderSize})
	for _, tc := range []struct {
		name  string
		bad   []int
		slot  int
		at    int
		value uint64
	}{
		{"first half", []int{first}, first, firstAt, unlisted},
		{"second half", []int{second}, second, secondAt, unlisted},
		{"both halves", []int{first, second}, first, firstAt, unlisted},
		{"second half past its shard", []int{second}, second, secondAt, makeSlot(ID{}, loc{shard: 1, off: HeaderSize + 1<<20})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			saved := make([]uint64, len(tc.bad))
			for i, j := range tc.bad {
				saved[i] = slots[j].Load()
				slots[j].Store(tc.value)
			}
			b := encodeCheckpoint(cp)
			for i, j := range tc.bad {
				slots[j].Store(saved[i])
			}
			_, err := decodeCheckpoint(b)
			if err == nil || !strings.Contains(err.Error(), "not a location inside the covered shards") ||
				!strings.Contains(err.Error(), fmt.Sprintf("slot %d holds", tc.slot)) || ckptErrorOffset(err) != int64(tc.at) {
				t.Fatalf("decode: %v (offset %d), want slot %d at offset %d", err, ckptErrorOffset(err), tc.slot, tc.at)
			}
		})
	}
}
