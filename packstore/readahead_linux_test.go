package packstore

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// vmFlags returns the VmFlags of the mapping of this process that holds
// addr (/proc/self/smaps).
func vmFlags(t *testing.T, addr uintptr) []string {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := sc.Text()
		var lo, hi uintptr
		if n, _ := fmt.Sscanf(line, "%x-%x ", &lo, &hi); n == 2 {
			in = lo <= addr && addr < hi
			continue
		}
		if rest, ok := strings.CutPrefix(line, "VmFlags:"); ok && in {
			return strings.Fields(rest)
		}
	}
	t.Fatalf("no mapping holds %#x in /proc/self/smaps (%v)", addr, sc.Err())
	return nil
}

// TestReadAheadAdviceApplied checks in /proc/self/smaps that the shard
// mappings carry VM_RAND_READ ("rr") over their whole length with
// ReadAheadRandom, after a shard is sealed and re-mapped and after an open
// by scan (which advises MADV_SEQUENTIAL while it reads), and no hint with
// ReadAheadKernel.
func TestReadAheadAdviceApplied(t *testing.T) {
	for _, mode := range []ReadAheadMode{ReadAheadRandom, ReadAheadKernel} {
		t.Run(mode.String(), func(t *testing.T) {
			opts := Options{Dir: t.TempDir(), MaxShardBytes: 64 << 10, ReadAhead: mode}
			s := openStore(t, opts)
			for i := range 100 { // about 3 shards: sealed ones are re-mapped in full
				if err := s.Put(idN(1, 0), idN(2, i), make([]byte, 2000)); err != nil {
					t.Fatal(err)
				}
			}
			check := func(s *PackfileStorage) {
				t.Helper()
				n := 0
				for i := range s.shards {
					sh := s.shards[i].Load()
					if sh == nil || len(sh.mm) == 0 {
						continue
					}
					n++
					for _, off := range []int{0, len(sh.mm) - 1} {
						flags := vmFlags(t, uintptr(unsafe.Pointer(&sh.mm[off])))
						if got := slices.Contains(flags, "rr"); got != (mode == ReadAheadRandom) {
							t.Errorf("shard %d offset %d: mapping VmFlags %v: rr = %v, want %v", sh.id, off, flags, got, mode == ReadAheadRandom)
						}
					}
				}
				if n < 2 {
					t.Fatalf("%d mapped shards, want at least 2", n)
				}
			}
			check(s)
			s = reopenByScan(t, s, opts)
			defer s.Close()
			check(s)
		})
	}
}
