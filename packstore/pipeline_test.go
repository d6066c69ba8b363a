package packstore

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// frameOrderOnDisk returns the record IDs of the data frames of dir's shard
// files in stream order, with their flags.
func frameOrderOnDisk(t *testing.T, dir string) ([]ID, []byte) {
	t.Helper()
	shards := shardFilesInOrder(t, dir)
	var ids []ID
	var flags []byte
	for _, b := range shards {
		for off := HeaderSize; off < len(b) && !allZero(b[off:]); {
			fv, err := decodeFrame(b[off:])
			if err != nil {
				t.Fatalf("frame at %d: %v", off, err)
			}
			if fv.Flags&FlagReset == 0 {
				ids = append(ids, fv.ID)
				flags = append(flags, fv.Flags)
			}
			off += fv.Size
		}
	}
	return ids, flags
}

// shardFilesInOrder returns the bytes of every shard file of dir, in
// stream (sequence number) order.
func shardFilesInOrder(t *testing.T, dir string) [][]byte {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "shard-*.mtdb"))
	if err != nil {
		t.Fatal(err)
	}
	type sh struct {
		seq uint32
		b   []byte
	}
	var shards []sh
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		h, err := decodeHeader(b[:HeaderSize])
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		shards = append(shards, sh{h.Seq, b})
	}
	slices.SortFunc(shards, func(a, b sh) int { return int(a.seq) - int(b.seq) })
	out := make([][]byte, len(shards))
	for i, s := range shards {
		out[i] = s.b
	}
	return out
}

// A compressed PutMany of many pieces (putManyPipelined: pieces compressed
// concurrently, appended as each is ready) writes its frames in the order
// of the records, across shard rolls, every one compressed, the last of a
// duplicated ID winning; everything reads back before and after a reopen.
func TestPutManyPipelinedOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(testSeed(t), 23))
	dir := t.TempDir()
	opts := DefaultOptions(dir)
	opts.MaxShardBytes = 16 << 10 // several rolls inside one batch
	s := openStore(t, opts)
	coll := idN(1, 1)
	var recs []Record
	want := map[ID][]byte{}
	for i := range 10*pipelineChunk + 17 {
		id := idN(2, i)
		if i%97 == 5 {
			id = idN(2, i-pipelineChunk-3) // a duplicate in an earlier piece
		}
		recs = append(recs, Record{ID: id, Data: payload(r, 200+r.IntN(800), true)})
		want[id] = recs[len(recs)-1].Data
	}
	if err := s.PutMany(coll, recs); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	ids, flags := frameOrderOnDisk(t, dir)
	if len(ids) != len(recs) {
		t.Fatalf("%d frames on disk, %d records", len(ids), len(recs))
	}
	for i, rec := range recs {
		if ids[i] != rec.ID || flags[i] != FlagZstd {
			t.Fatalf("frame %d: record %s flags %#x, want %s compressed", i, ids[i], flags[i], rec.ID)
		}
	}
	if st := s.Stats(); st.Shards < 3 || st.LiveRecords != len(want) {
		t.Fatalf("%d shards, %d live records, want >= 3 and %d", st.Shards, st.LiveRecords, len(want))
	}
	for id, data := range want {
		mustGet(t, s, coll, id, data)
	}
	mustCheck(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, opts)
	defer s.Close()
	for id, data := range want {
		mustGet(t, s, coll, id, data)
	}
}

// A pipelined batch that cannot be written whole writes nothing: a record
// too large for a shard (in its last piece), or more shards than the limit
// allows at the batch's uncompressed size.
func TestPutManyPipelinedNothingWritten(t *testing.T) {
	r := rand.New(rand.NewPCG(testSeed(t), 29))
	opts := DefaultOptions(t.TempDir())
	opts.MaxShardBytes = 64 << 10
	opts.maxShards = 2
	s := openStore(t, opts)
	defer s.Close()
	coll := idN(1, 1)
	recs := make([]Record, 3*pipelineChunk)
	for i := range recs {
		recs[i] = Record{ID: idN(3, i), Data: payload(r, 300, true)}
	}
	big := slices.Clone(recs)
	big[len(big)-1].Data = make([]byte, 64<<10)
	if err := s.PutMany(coll, big); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("record past the shard size: %v, want ErrTooLarge", err)
	}
	for i := range recs { // 3 x 64 x ~350 B: two shards' worth, plus a third
		recs[i].Data = payload(r, 500, true)
	}
	recs = append(recs, recs...)
	if err := s.PutMany(coll, recs); !errors.Is(err, ErrShardLimit) {
		t.Fatalf("batch past the shard limit: %v, want ErrShardLimit", err)
	}
	if ids, _ := frameOrderOnDisk(t, opts.Dir); len(ids) != 0 {
		t.Fatalf("%d frames written by refused batches", len(ids))
	}
	if st := s.Stats(); st.LiveRecords != 0 {
		t.Fatalf("%d live records after refused batches", st.LiveRecords)
	}
}
