package packstore

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/edsrzf/mmap-go"
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

// noMapFS is the real filesystem on which index.ckpt cannot be mapped.
type noMapFS struct{ osFS }

type noMapFile struct{ osFile }

func (noMapFS) OpenFile(name string, flag int, perm os.FileMode) (vfile, error) {
	f, err := osFS{}.OpenFile(name, flag, perm)
	if err != nil || filepath.Base(name) != checkpointFile {
		return f, err
	}
	return noMapFile{f.(osFile)}, nil
}

func (noMapFile) Map(int) (mmap.MMap, error) { return nil, errors.New("no mapping") }

// TestCheckpointReadUnmapped: a checkpoint that cannot be mapped is read
// into a buffer instead, and Open still loads the index from it.
func TestCheckpointReadUnmapped(t *testing.T) {
	cp, live := splitCheckpoint(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, checkpointFile), encodeCheckpoint(cp), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, fs := range map[string]vfs{"mapped": osFS{}, "unmapped": noMapFS{}} {
		s := &PackfileStorage{opts: Options{Dir: dir}, fs: fs}
		var f indexFiles
		if err := s.readCheckpoint(&f); err != nil || f.cpErr != nil || *f.cp.live != live || f.ckptVersion != checkpointVersion {
			t.Fatalf("%s: %v, %v", name, err, f.cpErr)
		}
	}
	opts := Options{Dir: t.TempDir(), fs: noMapFS{}}
	s := openStore(t, opts)
	m := model{}
	for i := range 50 {
		m.put(idN(1, 0), idN(2, i), []byte{byte(i)})
		if err := s.Put(idN(1, 0), idN(2, i), []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, opts)
	defer s.Close()
	if src := s.OpenReport().Source; src != "checkpoint" {
		t.Fatalf("Open rebuilt the index from %q", src)
	}
	compareAll(t, s, m, "after reopen without a mapped checkpoint")
}

// TestGuardFault: reading a mapped page past the end of a file truncated
// under the mapping (SIGBUS) comes back from guardFault as an error, and
// the process lives on.
func TestGuardFault(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("SIGBUS on a truncated mapping is checked on Linux")
	}
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, make([]byte, 2*os.Getpagesize()), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := osFS{}.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := f.Map(2 * os.Getpagesize())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unmap()
	if err := f.Truncate(0); err != nil {
		t.Fatal(err)
	}
	var x byte
	err = guardFault(func() error { x = m[os.Getpagesize()]; return nil })
	if err == nil || !strings.Contains(err.Error(), "faulted") {
		t.Fatalf("guardFault = %v (read %d), want a fault error", err, x)
	}
}
