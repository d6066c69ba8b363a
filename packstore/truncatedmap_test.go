package packstore

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestTruncatedMapChild is the child of TestShardTruncatedWhileMapped: it
// fills three shards, has another process (truncate(1)) cut
// shard-00000.mtdb to 4,696 bytes while the store has it mapped, and Gets
// every record of shard 0, printing one line per record ("ok", or the error)
// and "done" at the end.
func TestTruncatedMapChild(t *testing.T) {
	dir := os.Getenv("PACKSTORE_TRUNCMAP_DIR")
	if dir == "" {
		t.Skip("child of TestShardTruncatedWhileMapped")
	}
	s, err := Open(Options{Dir: dir, MaxShardBytes: 64 << 10})
	if err != nil {
		fmt.Println("open error:", err)
		os.Exit(3)
	}
	coll := ID{1}
	const n = 300 // 545-byte frames: about 120 per 64 KiB shard
	for i := range n {
		if err := s.Put(coll, idN(2, i), bytes.Repeat([]byte{byte(i)}, 500)); err != nil {
			fmt.Println("put error:", err)
			os.Exit(3)
		}
	}
	if err := s.Sync(); err != nil {
		fmt.Println("sync error:", err)
		os.Exit(3)
	}
	if out, err := exec.Command("truncate", "-s", "4696", shardPath(dir, 0)).CombinedOutput(); err != nil {
		fmt.Printf("truncate error: %v %s\n", err, out)
		os.Exit(3)
	}
	for i := range n {
		l, _, _, err := s.lookupLocked(s.collectionLoad(coll), idN(2, i))
		if l.shard != 0 || err != nil {
			continue
		}
		got, err := s.Get(coll, idN(2, i))
		switch {
		case err != nil:
			fmt.Printf("record %d offset %d: %v\n", i, l.off, err)
		case !bytes.Equal(got, bytes.Repeat([]byte{byte(i)}, 500)):
			fmt.Printf("record %d offset %d: wrong bytes\n", i, l.off)
		default:
			fmt.Printf("record %d offset %d: ok\n", i, l.off)
		}
	}
	got, err := s.Get(coll, idN(2, n-1)) // in the last shard, untouched
	fmt.Printf("last: %v %d\n", err, len(got))
	fmt.Println("done")
}

// TestShardTruncatedWhileMapped: a shard file truncated
// by another process below the size the store has mapped must not kill the
// process with SIGBUS (golang/go#36109): a Get of a record in a page wholly
// past the new end returns ErrCorrupt naming the shard file, records in
// other shards stay readable. Run in a child process, so that a SIGBUS
// fails this test instead of killing the test binary.
func TestShardTruncatedWhileMapped(t *testing.T) {
	if _, err := exec.LookPath("truncate"); err != nil {
		t.Skip("truncate(1) not found")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestTruncatedMapChild$")
	cmd.Env = append(os.Environ(), "PACKSTORE_TRUNCMAP_DIR="+t.TempDir())
	b, werr := cmd.CombinedOutput()
	all := string(b)
	if werr != nil || !strings.Contains(all, "\ndone") {
		t.Fatalf("child failed (%v):\n%.3000s", werr, all)
	}
	out := strings.Split(all, "\n")
	faulted := 0
	for _, l := range out {
		if !strings.HasPrefix(l, "record ") || strings.HasSuffix(l, ": ok") {
			continue
		}
		if !strings.Contains(l, ErrCorrupt.Error()) || !strings.Contains(l, "shard-00000.mtdb") {
			t.Errorf("want ErrCorrupt naming shard-00000.mtdb: %s", l)
		}
		faulted++
	}
	if faulted == 0 {
		t.Fatalf("no Get failed after the truncation:\n%s", all)
	}
	if !strings.Contains(all, "last: <nil> 500") {
		t.Fatalf("record in the last shard not readable:\n%s", all)
	}
}
