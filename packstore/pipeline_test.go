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

// PutBatch writes a batch spread over many collections in small parts as
// the PutMany calls of its parts in turn would, frame for frame in batch
// order: a collection met twice in one batch keeps the later value of an ID
// given in both parts, and everything reads back before and after a reopen.
// A batch large enough to compress is compressed whole (every frame); a small
// first one is not (Options.InlineCompressMin).
func TestPutBatchAcrossCollections(t *testing.T) {
	r := rand.New(rand.NewPCG(testSeed(t), 31))
	dir := t.TempDir()
	opts := DefaultOptions(dir)
	opts.MaxShardBytes = 64 << 10 // rolls inside the batch
	s := openStore(t, opts)
	type key struct{ coll, id ID }
	want := map[key][]byte{}
	var parts []CollectionRecords
	var order []key
	for c := range 33 {
		coll := idN(1, c%31) // collections 0 and 1 get a second part
		var recs []Record
		for i := range 1 + r.IntN(40) {
			id := idN(2, i)
			recs = append(recs, Record{ID: id, Data: payload(r, 100+r.IntN(900), true)})
			want[key{coll, id}] = recs[len(recs)-1].Data
			order = append(order, key{coll, id})
		}
		parts = append(parts, CollectionRecords{Coll: coll, Recs: recs})
	}
	if len(order) < 2*pipelineChunk {
		t.Fatalf("only %d records: the batch would not be pipelined", len(order))
	}
	small := []CollectionRecords{{Coll: idN(1, 40), Recs: []Record{{ID: idN(2, 0), Data: payload(r, 500, true)}}},
		{Coll: idN(1, 41), Recs: []Record{{ID: idN(2, 1), Data: payload(r, 500, true)}}}}
	for _, batch := range [][]CollectionRecords{small, parts} {
		if err := s.PutBatch(batch); err != nil {
			t.Fatal(err)
		}
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	var first []key
	for _, p := range small {
		want[key{p.Coll, p.Recs[0].ID}] = p.Recs[0].Data
		first = append(first, key{p.Coll, p.Recs[0].ID})
	}
	order = append(first, order...)
	ids, flags := frameOrderOnDisk(t, dir)
	if len(ids) != len(order) {
		t.Fatalf("%d frames on disk, %d records", len(ids), len(order))
	}
	for i, k := range order {
		compressed := i >= len(small)
		if ids[i] != k.id || (flags[i] == FlagZstd) != compressed {
			t.Fatalf("frame %d: record %s flags %#x, want %s compressed=%v", i, ids[i], flags[i], k.id, compressed)
		}
	}
	check := func() {
		for k, data := range want {
			mustGet(t, s, k.coll, k.id, data)
		}
		if st := s.Stats(); st.LiveRecords != len(want) {
			t.Fatalf("%d live records, want %d", st.LiveRecords, len(want))
		}
	}
	check()
	mustCheck(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, opts)
	defer s.Close()
	check()
}
