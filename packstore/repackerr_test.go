package packstore

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// TestRepackErrorSaysWhatHappened: whatever step of a
// repack fails, the error says which index is live. An fsync of a shard
// before the markers are durable leaves the old index (dropped records
// still read back) and the error does not match ErrRepackApplied; an
// fsync of an index file after they are durable leaves the new index live
// (dropped records are gone, kept ones read back) and the error matches
// ErrRepackApplied. Real files through faultFS.
func TestRepackErrorSaysWhatHappened(t *testing.T) {
	cases := []struct {
		name    string
		fail    func(path string) bool // the fsyncs that fail once armed
		applied bool
	}{
		{"shard-fsync-before-markers", func(p string) bool { return strings.HasSuffix(p, ".mtdb") }, false},
		{"index-fsync-after-markers", func(p string) bool { return strings.Contains(p, "index.") }, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFaultFS()
			opts := Options{Dir: t.TempDir(), MaxShardBytes: 16 << 10, fs: fs}
			s := openStore(t, opts)
			defer s.Close()
			coll := ID{1}
			var keep, drop []ID
			for i := range 80 {
				id := idN(2, i)
				if err := s.Put(coll, id, bytes.Repeat([]byte{byte(i)}, 500)); err != nil {
					t.Fatal(err)
				}
				if i%2 == 0 {
					keep = append(keep, id)
				} else {
					drop = append(drop, id)
				}
			}
			if err := s.Sync(); err != nil {
				t.Fatal(err)
			}
			// Armed from the start, or (applied) once the markers' own fsync
			// has been let through.
			var markers, armed atomic.Bool
			armed.Store(!tc.applied)
			s.testHookAfterMarkers = func() { markers.Store(true) }
			fs.sync = func(path string) error {
				if armed.Load() && tc.fail(path) {
					return errors.New("injected fsync failure")
				}
				if markers.Load() && strings.HasSuffix(path, ".mtdb") {
					armed.Store(true)
				}
				return nil
			}
			st, err := s.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: coll, Records: keep}}})
			if err == nil {
				t.Fatal("Repack succeeded; the injected fsync failure did not hit")
			}
			for i, id := range keep {
				mustGet(t, s, coll, id, bytes.Repeat([]byte{byte(2 * i)}, 500))
			}
			for i, id := range drop {
				got, gerr := s.Get(coll, id)
				if errors.Is(err, ErrRepackApplied) {
					if !errors.Is(gerr, ErrNotFound) {
						t.Fatalf("error says the repack was applied, but dropped record %d reads back (%d bytes, %v)", i, len(got), gerr)
					}
				} else if gerr != nil || !bytes.Equal(got, bytes.Repeat([]byte{byte(2*i + 1)}, 500)) {
					t.Fatalf("error says the old index stays, but dropped record %d: %d bytes, %v", i, len(got), gerr)
				}
			}
			if got := errors.Is(err, ErrRepackApplied); got != tc.applied {
				t.Fatalf("Repack error %q: matches ErrRepackApplied = %v, want %v", err, got, tc.applied)
			}
			if tc.applied && st.RecordsCopied != len(keep) {
				t.Fatalf("stats after an applied repack: %+v", st)
			}
			mustCheck(t, s)
		})
	}
}

// TestRepackCorruptFrameLeavesNoShard: a repack that meets a corrupt frame
// before it has copied anything fails with ErrCorrupt and creates no shard
// file (it rolls into its output shard only to append the first copy); the
// store takes writes after it, and reopens with every record but the damaged
// one readable.
func TestRepackCorruptFrameLeavesNoShard(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Dir: dir}
	s := openStore(t, opts)
	coll := ID{1}
	var ids []ID
	for i := range 40 {
		ids = append(ids, idN(2, i))
		if err := s.Put(coll, ids[i], bytes.Repeat([]byte{byte(i)}, 500)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, shardFileName(0))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := len(b) / 2; i < len(b)/2+16; i++ {
		b[i] ^= 0x5a
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	shards := func() []string {
		m, err := filepath.Glob(filepath.Join(dir, "shard-*"))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	s = openStore(t, opts)
	_, err = s.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: coll, Records: ids}}})
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Repack over a corrupt frame: %v", err)
	}
	if got := shards(); len(got) != 1 {
		t.Fatalf("shard files after the failed repack: %v", got)
	}
	if !strings.Contains(err.Error(), "no copy was written") {
		t.Errorf("the error does not say nothing was written: %v", err)
	}
	if err := s.Put(coll, idN(3, 0), []byte("after")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, opts)
	defer s.Close()
	mustGet(t, s, coll, idN(3, 0), []byte("after"))
	bad := 0
	for i, id := range ids {
		got, err := s.Get(coll, id)
		switch {
		case errors.Is(err, ErrCorrupt):
			bad++
		case err != nil || !bytes.Equal(got, bytes.Repeat([]byte{byte(i)}, 500)):
			t.Fatalf("record %d after the failed repack: %d bytes, %v", i, len(got), err)
		}
	}
	if bad != 1 {
		t.Fatalf("%d records read as corrupt, want the damaged one", bad)
	}
}
