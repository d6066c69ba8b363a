package roomrecord

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/packstore"
)

var extSeed = flag.Uint64("extremity-seed", 0, "seed of TestExtremitySetModel (0: from the time)")

// chunkStore is a record map the tests write extremity chunks into and read
// them back from, as roomstate does through the engine.
type chunkStore map[packstore.ID][]byte

func (s chunkStore) put(recs []packstore.Record) {
	for _, r := range recs {
		s[r.ID] = r.Data
	}
}

func (s chunkStore) get(id packstore.ID) ([]byte, error) {
	b, ok := s[id]
	if !ok {
		return nil, packstore.ErrNotFound
	}
	return b, nil
}

// reread encodes h, decodes it and reads its chunks from s, as opening a room does.
func reread(t *testing.T, s chunkStore, h Head) Head {
	t.Helper()
	got, err := DecodeHead(EncodeHead(&h))
	if err != nil {
		t.Fatalf("decode head: %v", err)
	}
	if err := got.ReadExtremityChunks(s.get); err != nil {
		t.Fatalf("read chunks: %v", err)
	}
	return got
}

// TestExtremitySetModel drives an ExtremitySet with random batches against a
// plain map (an import's churn: a few new events kept, most removed by the next
// ones, now and then an old extremity removed), stores it after each batch, and
// requires: the head's sorted set equals the model; the head read back (bytes,
// then chunks) equals the head written; at most MaxInlineExtremities stay inline
// and fewer than smallChunksMax chunks are small; a batch that only churns the
// inline part writes no chunk. Every few rounds the writer starts over from the
// head read back, as a new import does.
func TestExtremitySetModel(t *testing.T) {
	seed := *extSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (-extremity-seed to repeat)", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	model := map[string]bool{}
	store := chunkStore{}
	h := Head{RoomID: "!r", RoomVersion: "12", Events: 1 << 30}
	set := NewExtremitySet(h)
	next := 0
	for round := range 300 {
		for range rng.IntN(200) {
			id := fmt.Sprintf("$%08x", rng.Uint32())
			next++
			set.Add(id)
			model[id] = true
			if rng.IntN(10) != 0 { // most new events are pointed at soon
				set.Remove(id)
				delete(model, id)
			}
		}
		for id := range model {
			if rng.IntN(40) == 0 {
				set.Remove(id)
				delete(model, id)
			}
		}
		before := h.ExtremityChunks
		recs := set.Store(&h)
		store.put(recs)
		want := slices.Sorted(func(yield func(string) bool) {
			for id := range model {
				if !yield(id) {
					return
				}
			}
		})
		if !slices.Equal(h.ForwardExtremities, want) && len(want)+len(h.ForwardExtremities) > 0 {
			t.Fatalf("round %d: head holds %d extremities, model %d", round, len(h.ForwardExtremities), len(want))
		}
		checkLayout(t, h, before, recs)
		if got := reread(t, store, h); !reflect.DeepEqual(got, h) {
			t.Fatalf("round %d: head read back differs:\n%+v\n%+v", round, got, h)
		}
		if round%37 == 0 {
			set = NewExtremitySet(reread(t, store, h))
		}
	}
}

// checkLayout checks the layout rules of a head Store filled: the inline bound,
// few small chunks, and every record written named by the head.
func checkLayout(t *testing.T, h Head, before []ExtremityChunk, recs []packstore.Record) {
	t.Helper()
	if len(h.InlineExtremities) > MaxInlineExtremities {
		t.Fatalf("%d inline extremities", len(h.InlineExtremities))
	}
	small := 0
	named := map[packstore.ID]bool{}
	for _, c := range h.ExtremityChunks {
		named[c.ID] = true
		if c.Count < ExtremityChunkTarget/2 {
			small++
		}
	}
	if small >= smallChunksMax {
		t.Fatalf("%d small chunks", small)
	}
	for _, r := range recs {
		if !named[r.ID] {
			t.Fatalf("chunk %s written but not named", r.ID)
		}
	}
	if reflect.DeepEqual(before, h.ExtremityChunks) && len(recs) > 0 {
		t.Fatalf("chunks unchanged, %d written", len(recs))
	}
}

// TestExtremitySetFromInlineHead: a version 1 head (every extremity inline, as
// every head was before version 3) opens as an ExtremitySet; storing it with
// more than MaxInlineExtremities makes a version 3 head whose set is the same, and
// removing all but a few makes a version 1 head again, byte for byte as
// EncodeHead wrote it before chunks existed.
func TestExtremitySetFromInlineHead(t *testing.T) {
	var ids []string
	for i := range 1500 {
		ids = append(ids, fmt.Sprintf("$e%04d", i))
	}
	h := Head{RoomID: "!r", RoomVersion: "12", Events: 2000, ForwardExtremities: ids}
	old, err := DecodeHead(EncodeHead(&h))
	if err != nil || old.ExtremityChunks != nil || !slices.Equal(old.ForwardExtremities, ids) {
		t.Fatalf("version 1 head: %v", err)
	}
	store := chunkStore{}
	set := NewExtremitySet(old)
	nh := old
	store.put(set.Store(&nh))
	if b := EncodeHead(&nh); b[1] != headVersion3 || len(nh.ExtremityChunks) != 3 || len(nh.InlineExtremities) != 0 {
		t.Fatalf("1500 extremities: version %d, %d chunks, %d inline", b[1], len(nh.ExtremityChunks), len(nh.InlineExtremities))
	}
	if got := reread(t, store, nh); !slices.Equal(got.ForwardExtremities, ids) {
		t.Fatal("set changed on conversion")
	}
	set.Set([]string{"$e0007", "$e1499"})
	store.put(set.Store(&nh))
	if nh.ExtremityChunks != nil || !slices.Equal(nh.ForwardExtremities, []string{"$e0007", "$e1499"}) {
		t.Fatalf("two extremities left: %+v", nh)
	}
	want := Head{RoomID: "!r", RoomVersion: "12", Events: 2000, ForwardExtremities: []string{"$e0007", "$e1499"}}
	if b := EncodeHead(&nh); string(b) != string(EncodeHead(&want)) || b[1] != headVersion1 {
		t.Fatal("a head without chunks is not written as version 1")
	}
}

// TestHeadVersion1Golden: a head without extremity chunks is written byte for byte
// as the code before version 3 wrote it (the hex was produced by that code), and
// a version 2 head too; both decode to the head they came from.
func TestHeadVersion1Golden(t *testing.T) {
	h := Head{RoomID: "!r:s", RoomVersion: "12", Events: 3, LogChunks: 1, Replayed: true,
		ForwardExtremities: []string{"$x", "$y"}}
	h.CurrentState[0], h.CurrentState[15] = 0xab, 0xcd
	kept := h
	kept.StateEvery, kept.StateKeptBelow = 2, 3
	for _, tc := range []struct {
		h   Head
		hex string
	}{
		{h, golden.v1},
		{kept, golden.v2},
	} {
		if got := fmt.Sprintf("%x", EncodeHead(&tc.h)); got != tc.hex {
			t.Errorf("head version %s encoding changed:\n got %s\nwant %s", tc.hex[2:4], got, tc.hex)
		}
		if got, err := DecodeHead(EncodeHead(&tc.h)); err != nil || !reflect.DeepEqual(got, tc.h) {
			t.Errorf("round trip: %+v, %v", got, err)
		}
	}
}

// golden holds the encodings TestHeadVersion1Golden compares with, as the
// encoder before version 3 heads produced them (commit ebf94de, the same two
// heads encoded by its roomrecord.EncodeHead).
var golden = struct{ v1, v2 string }{
	v1: "48010400000021723a73020000003132030000000100000001ab0000000000000000000000000000cd02000000020000002478020000002479",
	v2: "48020400000021723a73020000003132030000000100000001ab0000000000000000000000000000cd020000000200000024780200000024790200000003000000",
}

// v3Sample is a version 3 head with two chunks, the chunk records and a store
// holding them.
func v3Sample() (Head, chunkStore) {
	h := Head{RoomID: "!r", RoomVersion: "12", Events: 10, InlineExtremities: []string{"$b"}}
	store := chunkStore{}
	for _, ids := range [][]string{{"$a", "$c"}, {"$d"}} {
		b := EncodeExtremityChunk(ids)
		id := ExtremityChunkID(b)
		store[id] = b
		h.ExtremityChunks = append(h.ExtremityChunks, ExtremityChunk{ID: id, Count: uint32(len(ids))})
	}
	return h, store
}

// TestExtremityChunksCorrupt damages a version 3 head or its chunks one way per
// row and requires ErrCorruptRecord naming the chunk (or the head), never a
// panic; a missing chunk keeps packstore.ErrNotFound for the caller to name.
func TestExtremityChunksCorrupt(t *testing.T) {
	h, store := v3Sample()
	got := reread(t, store, h)
	if !slices.Equal(got.ForwardExtremities, []string{"$a", "$b", "$c", "$d"}) {
		t.Fatalf("sample reads as %v", got.ForwardExtremities)
	}
	c0 := h.ExtremityChunks[0].ID
	for _, tc := range []struct {
		name string
		mess func(h *Head, s chunkStore)
		want string // in the error
	}{
		{"chunk flipped byte", func(h *Head, s chunkStore) { b := slices.Clone(s[c0]); b[len(b)-1] ^= 1; s[c0] = b }, "hashes to"},
		{"chunk cut", func(h *Head, s chunkStore) { s[c0] = s[c0][:len(s[c0])-1] }, c0.String()},
		{"chunk wrong kind", func(h *Head, s chunkStore) { b := slices.Clone(s[c0]); b[0] = 'L'; s[c0] = b }, "kind"},
		{"chunk unsorted", func(h *Head, s chunkStore) { rechunk(h, s, 0, []string{"$c", "$a"}) }, "out of order"},
		{"chunk empty", func(h *Head, s chunkStore) { rechunk(h, s, 0, []string{}) }, "no event IDs"},
		{"count differs", func(h *Head, s chunkStore) { h.ExtremityChunks[0].Count = 1 }, "the head says 1"},
		{"inline also chunked", func(h *Head, s chunkStore) { h.InlineExtremities = []string{"$c"} }, "repeated"},
		{"chunk named twice", func(h *Head, s chunkStore) { h.ExtremityChunks[1] = h.ExtremityChunks[0] }, "repeated"},
	} {
		hh, s := v3Sample()
		hh.ExtremityChunks = slices.Clone(hh.ExtremityChunks)
		tc.mess(&hh, s)
		d, err := DecodeHead(EncodeHead(&hh))
		if err == nil {
			err = d.ReadExtremityChunks(s.get)
		}
		if !errors.Is(err, ErrCorruptRecord) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v (want ErrCorruptRecord, %q)", tc.name, err, tc.want)
		}
	}
	delete(store, c0)
	d, _ := DecodeHead(EncodeHead(&h))
	if err := d.ReadExtremityChunks(store.get); !errors.Is(err, packstore.ErrNotFound) || !strings.Contains(err.Error(), c0.String()) {
		t.Errorf("missing chunk: %v", err)
	}
}

// rechunk replaces chunk i of h by one of ids (sorted or not, as given).
func rechunk(h *Head, s chunkStore, i int, ids []string) {
	b := EncodeExtremityChunk(ids)
	id := ExtremityChunkID(b)
	s[id] = b
	h.ExtremityChunks[i] = ExtremityChunk{ID: id, Count: uint32(len(ids))}
}

// TestHeadVersion3Corrupt: every cut of a version 3 head fails; so do one
// without chunks, one with unsorted inline entries, one with more extremities
// than events, one with a chunk of count 0, one whose chunk table cannot fit
// (before allocating it) and a keep rule below events without K.
func TestHeadVersion3Corrupt(t *testing.T) {
	h, _ := v3Sample()
	b := EncodeHead(&h)
	if b[1] != headVersion3 {
		t.Fatalf("version %d", b[1])
	}
	for n := range len(b) {
		if _, err := DecodeHead(b[:n]); !errors.Is(err, ErrCorruptRecord) {
			t.Fatalf("cut at %d of %d: %v", n, len(b), err)
		}
	}
	for _, tc := range []struct {
		name string
		mess func(h *Head)
	}{
		{"inline unsorted", func(h *Head) { h.InlineExtremities = []string{"$z", "$b"} }},
		{"more extremities than events", func(h *Head) { h.Events = 3 }},
		{"chunk of count 0", func(h *Head) { h.ExtremityChunks[1].Count = 0 }},
		{"kept below without a rule", func(h *Head) { h.StateKeptBelow = 2 }},
	} {
		hh, _ := v3Sample()
		tc.mess(&hh)
		if _, err := DecodeHead(EncodeHead(&hh)); !errors.Is(err, ErrCorruptRecord) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	// The chunk count sits after the inline strs; set it to 0 and then huge.
	at := len(b) - 8 - len(h.ExtremityChunks)*extremityRefLen - 4
	for _, n := range []uint32{0, 1 << 31} {
		bad := slices.Clone(b)
		bad[at], bad[at+1], bad[at+2], bad[at+3] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
		if _, err := DecodeHead(bad); !errors.Is(err, ErrCorruptRecord) {
			t.Errorf("chunk count %d: %v", n, err)
		}
	}
}

// FuzzExtremityChunks: decoding a head and reading its chunks from a store of
// one fuzzed chunk record never panics, and whatever reads without error holds
// a sorted set without repeats.
func FuzzExtremityChunks(f *testing.F) {
	h, store := v3Sample()
	for _, b := range store {
		f.Add(EncodeHead(&h), b)
	}
	f.Fuzz(func(t *testing.T, head, chunk []byte) {
		_, _ = DecodeExtremityChunk(ExtremityChunkID(chunk), chunk)
		d, err := DecodeHead(head)
		if err != nil {
			return
		}
		id := ExtremityChunkID(chunk)
		err = d.ReadExtremityChunks(func(packstore.ID) ([]byte, error) { return chunk, nil })
		if err == nil && len(d.ExtremityChunks) > 0 {
			if checkSortedDistinct(d.ForwardExtremities) != nil || d.ExtremityChunks[0].ID != id {
				t.Fatalf("read a bad set: %v", d.ForwardExtremities)
			}
		}
	})
}
