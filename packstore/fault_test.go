package packstore

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"testing"
)

// crashAndReopen crashes the faultFS under s, closes s, drops unsynced
// bytes (keep chooses how many survive) and reopens on the real filesystem.
func crashAndReopen(t *testing.T, s *PackfileStorage, ffs *faultFS, opts Options, keep func(string, int64, int64) int64) *PackfileStorage {
	t.Helper()
	ffs.crash()
	s.Close()
	if err := ffs.applyCrash(keep); err != nil {
		t.Fatal(err)
	}
	o := opts
	o.fs = nil
	s2, err := Open(o)
	if err != nil {
		t.Fatalf("reopen after crash: %v", err)
	}
	mustCheck(t, s2)
	return s2
}

// TestWriteFaultThenContinue: a write that fails inside record N (ENOSPC
// after half the frame, or a short write), then records N+1 and N+2
// succeed and are synced; after a crash N is absent or whole and N+1, N+2
// and everything before are present.
func TestWriteFaultThenContinue(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		frac float64
	}{{"ENOSPC mid-frame", errENOSPC, 0.5}, {"short write", io.ErrShortWrite, 0.3}, {"ENOSPC before any byte", errENOSPC, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			ffs := newFaultFS()
			opts := Options{Dir: t.TempDir(), MaxShardBytes: 16 << 10, fs: ffs}
			s := openStore(t, opts)
			r := rand.New(rand.NewPCG(31, 32))
			c := idN(1, 0)
			m := model{}
			for i := range 20 {
				d := payload(r, 300, false)
				if err := s.Put(c, idN(2, i), d); err != nil {
					t.Fatal(err)
				}
				m.put(c, idN(2, i), d)
			}
			s.Sync()
			var armed atomic.Bool
			ffs.write = failOnce(tc.err, tc.frac, armed.Load)
			armed.Store(true)
			n := payload(r, 900, false)
			if err := s.Put(c, idN(3, 0), n); !errors.Is(err, tc.err) {
				t.Fatalf("Put N: %v, want %v", err, tc.err)
			}
			for i := 1; i <= 2; i++ {
				d := payload(r, 200, false)
				if err := s.Put(c, idN(3, i), d); err != nil {
					t.Fatalf("Put N+%d: %v", i, err)
				}
				m.put(c, idN(3, i), d)
			}
			if err := s.Sync(); err != nil {
				t.Fatal(err)
			}
			s = crashAndReopen(t, s, ffs, opts, nil)
			defer s.Close()
			if got, err := s.Get(c, idN(3, 0)); err == nil {
				if string(got) != string(n) {
					t.Fatal("record N came back torn")
				}
				m.put(c, idN(3, 0), n)
			} else if !errors.Is(err, ErrNotFound) {
				t.Fatalf("record N: %v", err)
			}
			compareAll(t, s, m, "after crash")
		})
	}
}

// TestFsyncErrorPoisonsWrites: after a failed fsync the store refuses
// writes (the page cache state is unknown); a reopen has everything synced
// before the failure.
func TestFsyncErrorPoisonsWrites(t *testing.T) {
	ffs := newFaultFS()
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 16 << 10, fs: ffs}
	s := openStore(t, opts)
	c := idN(1, 0)
	m := model{}
	for i := range 10 {
		s.Put(c, idN(2, i), []byte{byte(i)})
		m.put(c, idN(2, i), []byte{byte(i)})
	}
	s.Sync()
	s.Put(c, idN(3, 0), []byte("unsynced"))
	eio := errors.New("injected EIO")
	ffs.sync = func(string) error { return eio }
	if err := s.Sync(); !errors.Is(err, eio) {
		t.Fatalf("Sync: %v", err)
	}
	if err := s.Put(c, idN(3, 1), []byte("x")); err == nil || !strings.Contains(err.Error(), "reopening") {
		t.Fatalf("Put after failed fsync: %v", err)
	}
	mustGet(t, s, c, idN(2, 3), []byte{3}) // reads continue
	ffs.sync = nil
	s = crashAndReopen(t, s, ffs, opts, nil)
	defer s.Close()
	mustNotFound(t, s, c, idN(3, 1))
	for id, d := range m[c] {
		mustGet(t, s, c, id, d)
	}
}

// TestRenameErrorOnRollAndCheckpoint: a failed rename while creating a
// shard fails that Put only; a failed rename of the checkpoint fails Close
// but loses nothing.
func TestRenameErrorOnRollAndCheckpoint(t *testing.T) {
	ffs := newFaultFS()
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 8 << 10, fs: ffs}
	s := openStore(t, opts)
	c := idN(1, 0)
	m := model{}
	fail := errors.New("injected rename failure")
	var failed atomic.Int32
	ffs.rename = func(o, n string) error {
		if strings.HasSuffix(n, ".mtdb") && failed.Add(1) == 1 {
			return fail
		}
		return nil
	}
	sawErr := false
	for i := range 60 {
		d := make([]byte, 500)
		d[0] = byte(i)
		if err := s.Put(c, idN(2, i), d); err != nil {
			if !errors.Is(err, fail) {
				t.Fatalf("Put %d: %v", i, err)
			}
			sawErr = true
			continue
		}
		m.put(c, idN(2, i), d)
	}
	if !sawErr || s.Stats().Shards < 3 {
		t.Fatalf("rename fault not hit (%v) or no rolls after it", sawErr)
	}
	s.Sync()
	ffs.rename = func(o, n string) error {
		if strings.HasSuffix(n, checkpointFile) {
			return fail
		}
		return nil
	}
	if err := s.Close(); !errors.Is(err, fail) {
		t.Fatalf("Close: %v", err)
	}
	ffs.rename = nil
	o := opts
	o.fs = nil
	s = openStore(t, o)
	defer s.Close()
	mustCheck(t, s)
	compareAll(t, s, m, "after failed renames")
	if ents, _ := os.ReadDir(opts.Dir); len(ents) == 0 || strings.Contains(ents[len(ents)-1].Name(), ".tmp") {
		t.Fatal("temporary files left behind")
	}
}

// TestCrashBeforeShardHeaderSynced: a crash between creating a shard file
// and fsyncing its header leaves a .tmp file that Open removes.
func TestCrashBeforeShardHeaderSynced(t *testing.T) {
	ffs := newFaultFS()
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 8 << 10, fs: ffs}
	s := openStore(t, opts)
	c := idN(1, 0)
	m := model{}
	for i := range 10 {
		s.Put(c, idN(2, i), make([]byte, 500))
		m.put(c, idN(2, i), make([]byte, 500))
	}
	s.Sync()
	ffs.sync = func(path string) error {
		if strings.HasSuffix(path, ".mtdb.tmp") {
			ffs.crashed = true // crash inside the header fsync (mu held)
			return errCrashed
		}
		return nil
	}
	for i := 10; i < 30; i++ {
		if err := s.Put(c, idN(2, i), make([]byte, 500)); err != nil {
			break
		}
		m.put(c, idN(2, i), make([]byte, 500)) // unsynced: may vanish
	}
	ffs.sync = nil
	s = crashAndReopen(t, s, ffs, opts, nil)
	defer s.Close()
	for i := range 10 {
		mustGet(t, s, c, idN(2, i), make([]byte, 500))
	}
	ents, _ := os.ReadDir(opts.Dir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Fatalf("%s left behind", e.Name())
		}
	}
}

// TestLostDirEntries: the fault filesystem forgets directory changes that
// no directory fsync made durable. The engine fsyncs the directory after
// creating a shard, publishing a checkpoint or delta and retiring shards,
// so a crash after Sync loses nothing across shard rolls, checkpoints and a
// repack. With directory fsyncs ignored (ignoreDirSync), the same run loses
// synced records: the model does catch a missing directory fsync.
func TestLostDirEntries(t *testing.T) {
	for _, ignore := range []bool{false, true} {
		ffs := newFaultFS()
		opts := Options{Dir: t.TempDir(), MaxShardBytes: 8 << 10, fs: ffs}
		s := openStore(t, opts)
		c := idN(1, 0)
		m := model{}
		put := func(from, to int) {
			for i := from; i < to; i++ {
				d := payload(rand.New(rand.NewPCG(uint64(i), 1)), 700, false)
				if err := s.Put(c, idN(2, i), d); err != nil {
					t.Fatal(err)
				}
				m.put(c, idN(2, i), d)
			}
		}
		put(0, 5)
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
		ffs.mu.Lock()
		ffs.ignoreDirSync = ignore
		ffs.mu.Unlock()
		put(5, 60) // several shard rolls
		ids, _ := s.CollectionRecords(c)
		if _, err := s.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: c, Records: ids}}}); err != nil {
			t.Fatal(err)
		}
		put(60, 70)
		s.deltaLimit = 1 // the next Sync writes a checkpoint (rename)
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
		ffs.mu.Lock()
		pending := len(ffs.dirOps)
		ffs.mu.Unlock()
		o := opts
		o.fs = nil
		ffs.crash()
		s.Close()
		if err := ffs.applyCrash(nil); err != nil {
			t.Fatal(err)
		}
		s2, err := Open(o)
		lost := 0
		if err == nil {
			for id, want := range m[c] {
				if got, gerr := s2.Get(c, id); gerr != nil || !bytes.Equal(got, want) {
					lost++
				}
			}
			s2.Close()
		}
		if !ignore && (err != nil || lost > 0 || pending != 0) {
			t.Fatalf("with directory fsyncs: reopen %v, %d of %d synced records lost, %d directory changes not durable", err, lost, len(m[c]), pending)
		}
		if ignore && err == nil && lost == 0 {
			t.Fatalf("without directory fsyncs nothing was lost (%d changes undone): the model does not bite", pending)
		}
		t.Logf("ignoreDirSync=%v: %d directory changes undone, reopen %v, %d lost", ignore, pending, err, lost)
	}
}
