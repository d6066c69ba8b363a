package packstore

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpenLockedInProcess: a second Open of an open store fails at once
// with ErrLocked saying the store is open in this process (its pid), and touches
// nothing (a .tmp file the first store may be writing survives); after
// Close the store opens again.
func TestOpenLockedInProcess(t *testing.T) {
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 16 << 10}
	s := openStore(t, opts)
	c, id := idN(1, 0), idN(2, 0)
	if err := s.Put(c, id, []byte("first")); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(opts.Dir, shardFileName(7)+".tmp")
	if err := os.WriteFile(tmp, []byte("being written"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Open(opts)
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
	want := fmt.Sprintf("packstore: store %s is already open in this process (pid %d); close it first", opts.Dir, os.Getpid())
	if err.Error() != want {
		t.Fatalf("second Open: %q, want %q", err, want)
	}
	if _, serr := os.Stat(tmp); serr != nil {
		t.Fatalf("failed Open removed another store's temporary file: %v", serr)
	}
	mustGet(t, s, c, id, []byte("first"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, opts)
	mustGet(t, s, c, id, []byte("first"))
	s.Close()
}

// TestLockChild holds a store open for TestOpenLockedOtherProcess until its
// stdin closes.
func TestLockChild(t *testing.T) {
	dir := os.Getenv("PACKSTORE_LOCK_DIR")
	if dir == "" {
		t.Skip("child of TestOpenLockedOtherProcess")
	}
	s, err := Open(Options{Dir: dir, MaxShardBytes: 16 << 10})
	if err != nil {
		fmt.Println("open error:", err)
		os.Exit(3)
	}
	// An unsynced tail that a second opener must not truncate.
	if err := s.Put(idN(1, 0), idN(2, 1), []byte("unsynced")); err != nil {
		fmt.Println("put error:", err)
		os.Exit(3)
	}
	fmt.Println("locked")
	bufio.NewReader(os.Stdin).ReadString('\n')
	os.Exit(0) // no Close: the kernel drops the lock with the process
}

// TestOpenLockedOtherProcess: while another process has the store open,
// Open fails with ErrLocked naming that process's pid and leaves its files
// alone; once it dies (without Close), Open succeeds.
func TestOpenLockedOtherProcess(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockChild$")
	cmd.Env = append(os.Environ(), "PACKSTORE_LOCK_DIR="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if strings.TrimSpace(line) != "locked" {
		t.Fatalf("child: %q", line)
	}
	sizes := func() map[string]int64 {
		out := map[string]int64{}
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			fi, _ := e.Info()
			out[e.Name()] = fi.Size()
		}
		return out
	}
	before := sizes()
	_, err = Open(Options{Dir: dir, MaxShardBytes: 16 << 10})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), fmt.Sprintf("(pid %d)", cmd.Process.Pid)) {
		t.Fatalf("Open while child holds the store: %v, want ErrLocked with pid %d", err, cmd.Process.Pid)
	}
	if after := sizes(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("failed Open changed the store: %v -> %v", before, after)
	}
	stdin.Close()
	cmd.Wait()
	s := openStore(t, Options{Dir: dir, MaxShardBytes: 16 << 10})
	defer s.Close()
	mustCheck(t, s)
}

// TestOpenLockedByReaders: a writer refused by read-only opens is told the
// store is being read, not the pid the LOCK file holds (the last writer's,
// long gone: read-only opens write no pid).
func TestOpenLockedByReaders(t *testing.T) {
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 16 << 10}
	s := openStore(t, opts)
	if err := s.Put(idN(1, 0), idN(2, 0), []byte("x")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	// The LOCK file names this process as its last writer.
	ro := opts
	ro.ReadOnly = true
	r, err := Open(ro)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, err = Open(opts)
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "reading it") || strings.Contains(err.Error(), "pid") {
		t.Fatalf("writer beside a reader: %v", err)
	}
}
