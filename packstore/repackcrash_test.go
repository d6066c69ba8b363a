package packstore

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// snapshotDir copies every regular file of dir into a new temporary
// directory (the bytes a crash at this moment could leave, at most).
func snapshotDir(t *testing.T, dir string) string {
	t.Helper()
	to := t.TempDir()
	copyDir(t, dir, to)
	return to
}

// frameBoundaries lists every frame start from (shard, off) on through the
// shard files of dir, plus the end of the last shard.
func frameBoundaries(t *testing.T, dir string, from loc, last uint16) []loc {
	t.Helper()
	var out []loc
	for id := from.shard; id <= last; id++ {
		b, err := os.ReadFile(shardPath(dir, id))
		if err != nil {
			t.Fatal(err)
		}
		off := int64(HeaderSize)
		if id == from.shard {
			off = int64(from.off)
		}
		for off < int64(len(b)) && !allZero(b[off:]) { // zeros written ahead end the frames
			out = append(out, loc{shard: id, off: uint32(off)})
			fv, err := decodeFrame(b[off:])
			if err != nil {
				t.Fatalf("snapshot shard %d offset %d: %v", id, off, err)
			}
			off += int64(fv.Size)
		}
		out = append(out, loc{shard: id, off: uint32(off)})
	}
	return out
}

// crashedCopy builds a store directory from snap as a crash at position q
// of the append stream leaves it: shards below q.shard whole, shard q.shard
// cut at q.off, later shards absent. The checkpoint is copied as it is;
// the delta keeps only the entries a crash at q can have left: those of
// frames that end at or before q and of shards created at or before it
// (entries are written after their frames are fsynced, in stream order; a
// roll inside the repack writes them). Pack IDs grow in this test, so
// their order is the stream order.
func crashedCopy(t *testing.T, snap string, q loc) string {
	t.Helper()
	dir := t.TempDir()
	ents, err := os.ReadDir(snap)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(snap, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if id, ok := parseShardFileName(e.Name()); ok {
			if id > q.shard {
				continue
			}
			if id == q.shard {
				b = b[:q.off]
			}
		}
		if e.Name() == deltaFile {
			n := deltaHeaderLen
			for ; n+deltaEntryLen <= len(b); n += deltaEntryLen {
				m, err := decodeDeltaEntry(b[n:])
				if err != nil || m.at.shard > q.shard || m.at.shard == q.shard && m.at.off+uint32(m.size) > q.off {
					break
				}
			}
			b = b[:n]
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestRepackCrashAtEveryFrameBoundary simulates a crash at every frame
// boundary (and in the middle of every frame) of a repack's output: every
// collection must come back either as before the repack or as after it,
// never partially, and nothing deleted before the repack may reappear.
func TestRepackCrashAtEveryFrameBoundary(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 8 << 10, Compress: true}
	s := openStore(t, opts)
	a, b, c, d := idN(1, 0), idN(1, 1), idN(1, 2), idN(1, 3)
	old := model{}
	put := func(coll ID, i int) {
		data := payload(r, 100+r.IntN(400), i%2 == 0)
		if err := s.Put(coll, idN(2, i), data); err != nil {
			t.Fatal(err)
		}
		old.put(coll, idN(2, i), data)
	}
	for i := range 30 {
		put(a, i)
		put(b, i)
		put(c, i)
		if i < 10 {
			put(d, i)
		}
	}
	for i := range 5 {
		put(a, i) // supersedes
	}
	if err := s.DeleteCollection(c); err != nil {
		t.Fatal(err)
	}
	deleted := old[c]
	delete(old, c)
	for i := 100; i < 103; i++ {
		put(c, i) // c lives again after its deletion
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	start := s.endLocked()
	var keepA []ID
	for i := range 30 {
		if i%3 != 0 {
			keepA = append(keepA, idN(2, i))
		}
	}
	r.Shuffle(len(keepA), func(i, j int) { keepA[i], keepA[j] = keepA[j], keepA[i] })
	var keepB []ID
	for id := range old[b] {
		keepB = append(keepB, id)
	}
	plan := RepackPlan{Collections: []CollectionPlan{{Collection: a, Records: keepA}, {Collection: d}, {Collection: b, Records: keepB}}}
	var snap string
	s.testHookAfterMarkers = func() { snap = snapshotDir(t, opts.Dir) }
	if _, err := s.Repack(plan); err != nil {
		t.Fatal(err)
	}
	last := s.active.id
	s.Close()
	repacked := map[ID]bool{a: true, d: true, b: true}
	dropped := map[ID]map[ID]bool{a: {}, d: {}}
	for id := range old[a] {
		dropped[a][id] = true
	}
	for _, id := range keepA {
		delete(dropped[a], id)
	}
	for id := range old[d] {
		dropped[d][id] = true
	}

	if start.off > HeaderSize { // repack output starts in a fresh shard
		start = loc{shard: start.shard + 1, off: HeaderSize}
	}
	bounds := frameBoundaries(t, snap, start, last)
	if len(bounds) < 40 {
		t.Fatalf("only %d boundaries", len(bounds))
	}
	points := 0
	for i, q := range bounds {
		cuts := []loc{q}
		if i+1 < len(bounds) && bounds[i+1].shard == q.shard {
			cuts = append(cuts, loc{shard: q.shard, off: (q.off + bounds[i+1].off) / 2})
		}
		for _, cut := range cuts {
			points++
			dir := crashedCopy(t, snap, cut)
			o := opts
			o.Dir = dir
			s, err := Open(o)
			if err != nil {
				t.Fatalf("crash at %v: Open: %v", cut, err)
			}
			mustCheck(t, s)
			for coll, recs := range old {
				gone := 0
				for id, want := range recs {
					got, err := s.Get(coll, id)
					switch {
					case err == nil && bytes.Equal(got, want):
					case errors.Is(err, ErrNotFound) && dropped[coll][id]:
						gone++
					default:
						t.Fatalf("crash at %v: collection %s record %s: %d bytes, %v", cut, coll, id, len(got), err)
					}
				}
				if gone != 0 && gone != len(dropped[coll]) {
					t.Fatalf("crash at %v: collection %s partially repacked: %d of %d dropped records gone", cut, coll, gone, len(dropped[coll]))
				}
				if repacked[coll] && cut == bounds[len(bounds)-1] && gone != len(dropped[coll]) {
					t.Fatalf("complete output: collection %s still has dropped records", coll)
				}
			}
			for id := range deleted {
				if _, ok := old[c][id]; ok {
					continue
				}
				if _, err := s.Get(c, id); !errors.Is(err, ErrNotFound) {
					t.Fatalf("crash at %v: record %s deleted before the repack reads back: %v", cut, id, err)
				}
			}
			s.Close()
		}
	}
	t.Logf("%d crash points over %d frame boundaries of the repack output", points, len(bounds))
}
