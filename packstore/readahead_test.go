package packstore

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestReadAheadModes runs every path the read-ahead code touches with each
// mode and checks the bytes: forward and random Gets over several shards
// (readAheadLocked), a repack in reverse order (prefetchLocked), a reopen by
// full scan (adviseScan) and Check.
func TestReadAheadModes(t *testing.T) {
	for _, mode := range []ReadAheadMode{ReadAheadRandom, ReadAheadKernel} {
		t.Run(mode.String(), func(t *testing.T) {
			opts := Options{Dir: t.TempDir(), MaxShardBytes: 256 << 10, ReadAhead: mode}
			s := openStore(t, opts)
			r := rand.New(rand.NewPCG(1, 2))
			coll := idN(1, 0)
			want := map[ID][]byte{}
			var ids []ID
			for i := range 1500 {
				id, data := idN(2, i), payload(r, 500+r.IntN(2501), false)
				if err := s.Put(coll, id, data); err != nil {
					t.Fatal(err)
				}
				ids, want[id] = append(ids, id), data
			}
			if err := s.Sync(); err != nil {
				t.Fatal(err)
			}
			readAll := func(s *PackfileStorage, order []ID) {
				t.Helper()
				for _, id := range order {
					mustGet(t, s, coll, id, want[id])
				}
			}
			readAll(s, ids) // file order: forward runs
			shuffled := slices.Clone(ids)
			r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			readAll(s, shuffled)
			slices.Reverse(ids)
			if _, err := s.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: coll, Records: ids}}}); err != nil {
				t.Fatal(err)
			}
			readAll(s, ids) // the repacked file order
			mustCheck(t, s)
			s = reopenByScan(t, s, opts)
			defer s.Close()
			readAll(s, shuffled)
			mustCheck(t, s)
		})
	}
}

// reopenByScan closes s, removes the index files and reopens the store,
// which then rebuilds its index by scanning every shard.
func reopenByScan(t *testing.T, s *PackfileStorage, opts Options) *PackfileStorage {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	removeIndexFiles(t, opts.Dir)
	s = openStore(t, opts)
	if s.OpenReport().Source != "scan" {
		t.Fatalf("open without index files: source %q, want scan", s.OpenReport().Source)
	}
	return s
}

func TestReadAheadUnknownMode(t *testing.T) {
	_, err := Open(Options{Dir: t.TempDir(), ReadAhead: ReadAheadKernel + 1})
	if err == nil || !strings.Contains(err.Error(), "read-ahead mode") {
		t.Fatalf("Open with ReadAhead %d: %v, want unknown read-ahead mode", ReadAheadKernel+1, err)
	}
}

// TestReadAheadMadviseError: a failing madvise is an error naming the
// advice and the shard file, never ignored: MADV_RANDOM fails Open,
// MADV_WILLNEED fails the read that asked for it. ReadAheadKernel calls
// neither.
func TestReadAheadMadviseError(t *testing.T) {
	errInjected := errors.New("injected madvise failure")
	failing := -1 // advice that fails; -1: none
	orig := madvise
	madvise = func(b []byte, advice int) error {
		if advice == failing {
			return errInjected
		}
		return orig(b, advice)
	}
	t.Cleanup(func() { madvise = orig })

	dir := t.TempDir()
	s := openStore(t, Options{Dir: dir})
	coll := idN(1, 0)
	var ids []ID
	for i := range 200 {
		ids = append(ids, idN(2, i))
		if err := s.Put(coll, ids[i], make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if madvRandom == madvWillneed {
		t.Skip("madvise is a no-op on this OS")
	}

	failing = madvRandom
	if _, err := Open(Options{Dir: dir}); !errors.Is(err, errInjected) || !strings.Contains(err.Error(), "MADV_RANDOM") || !strings.Contains(err.Error(), shardFileName(0)) {
		t.Fatalf("Open with MADV_RANDOM failing: %v, want the injected error naming MADV_RANDOM and %s", err, shardFileName(0))
	}
	s = openStore(t, Options{Dir: dir, ReadAhead: ReadAheadKernel})
	for _, id := range ids {
		mustGet(t, s, coll, id, make([]byte, 1000))
	}
	s.Close()

	failing = madvWillneed
	s = openStore(t, Options{Dir: dir})
	defer s.Close()
	var err error
	for _, id := range ids { // a forward run asks for read-ahead
		if _, err = s.Get(coll, id); err != nil {
			break
		}
	}
	if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), "MADV_WILLNEED") || !strings.Contains(err.Error(), shardFileName(0)) {
		t.Fatalf("forward Gets with MADV_WILLNEED failing: %v, want the injected error naming MADV_WILLNEED and %s", err, shardFileName(0))
	}
}
