package packstore

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"
)

// textPayload returns n bytes of JSON-like text built from a small
// vocabulary and random lowercase names: zstd finds matches in the words
// and leaves the names as literals, which Huffman coding shrinks.
func textPayload(r *rand.Rand, n int) []byte {
	words := []string{`{"type":"m.room.member","state_key":"`, `@alice:example.org`, `"membership":"join"`,
		`"content":{`, `"sender":"`, `m.room.power_levels`, `"origin_server_ts":`, `"depth":`, `"prev_events":["$`, `},`, `,`}
	b := make([]byte, 0, n+64)
	for len(b) < n {
		b = append(b, words[r.IntN(len(words))]...)
		for range r.IntN(12) {
			b = append(b, byte('a'+r.IntN(26)))
		}
	}
	return b[:n]
}

// zstdFrameInfo parses the start of a single-block zstd frame as the
// encoders write it: whether the frame carries a content checksum, the
// first block's type (0 raw, 1 RLE, 2 compressed) and, in a compressed
// block, its literals section's type (0 raw, 1 RLE, 2 Huffman-coded, 3
// Huffman-coded with the previous table).
func zstdFrameInfo(t *testing.T, p []byte) (checksum bool, blockType, litType int) {
	t.Helper()
	if len(p) < 6 || binary.LittleEndian.Uint32(p) != 0xFD2FB528 {
		t.Fatalf("payload is not a zstd frame: % x", p[:min(len(p), 8)])
	}
	fhd := p[4]
	single := fhd>>5&1 == 1
	h := 5 + []int{0, 1, 2, 4}[fhd&3]
	if !single {
		h++ // window descriptor
	}
	h += []int{0, 2, 4, 8}[fhd>>6]
	if single && fhd>>6 == 0 {
		h++
	}
	if len(p) < h+4 {
		t.Fatalf("zstd frame of %d bytes too short for its %d-byte header and a block", len(p), h)
	}
	blockType = int(p[h] >> 1 & 3)
	litType = -1
	if blockType == 2 {
		litType = int(p[h+3] & 3)
	}
	return fhd>>2&1 == 1, blockType, litType
}

// zstdPayloadsOnDisk returns the stored payload of every FlagZstd frame of
// dir's shards, by record ID (the last frame of an ID wins), without
// checking frame CRCs (a ChecksumNone store writes none).
func zstdPayloadsOnDisk(t *testing.T, dir string) map[ID][]byte {
	t.Helper()
	out := map[ID][]byte{}
	for _, b := range shardFilesInOrder(t, dir) {
		for off := HeaderSize; off < len(b) && !allZero(b[off:]); {
			fv, err := decodeFrameCRC(b[off:], false)
			if err != nil {
				t.Fatalf("frame at %d: %v", off, err)
			}
			if fv.Flags&FlagReset == 0 {
				delete(out, fv.ID)
				if fv.Flags&FlagZstd != 0 {
					out[fv.ID] = fv.Payload
				}
			}
			off += fv.Size
		}
	}
	return out
}

// PutMany compresses without zstd's entropy stage (literals stored raw),
// pipelined bulk batches and smaller ones alike; Repack compresses the raw
// frames of small commits with it (Huffman-coded literals). A store in
// ChecksumFull mode writes no zstd content checksum (its frame CRC covers
// the payload and every read verifies it); the other modes keep it. Every
// record reads back, also after a reopen.
func TestWriteCompressionModes(t *testing.T) {
	r := rand.New(rand.NewPCG(testSeed(t), 23))
	for _, mode := range []ChecksumMode{ChecksumFull, ChecksumWriteOnly, ChecksumNone} {
		t.Run(mode.String(), func(t *testing.T) {
			dir := t.TempDir()
			o := DefaultOptions(dir)
			o.Checksum = mode
			s := openStore(t, o)
			coll := idN(1, 0)
			want := map[ID][]byte{}
			var ids []ID
			for _, n := range []int{2 * pipelineChunk, DefaultInlineCompressMin, 16} {
				var recs []Record
				for range n {
					rec := Record{ID: randID(r), Data: textPayload(r, 200+r.IntN(800))}
					recs = append(recs, rec)
					want[rec.ID] = rec.Data
					ids = append(ids, rec.ID)
				}
				if err := s.PutMany(coll, recs); err != nil {
					t.Fatal(err)
				}
				if err := s.Sync(); err != nil {
					t.Fatal(err)
				}
			}
			// The 16-record commit follows a 64-record one: compressed too.
			payloads := zstdPayloadsOnDisk(t, dir)
			if len(payloads)*10 < len(ids)*9 {
				t.Fatalf("%d of %d records stored compressed", len(payloads), len(ids))
			}
			for id, p := range payloads {
				sum, bt, lt := zstdFrameInfo(t, p)
				if sum != (mode != ChecksumFull) {
					t.Fatalf("record %s: zstd content checksum %v in mode %s", id, sum, mode)
				}
				if bt != 2 || lt > 1 {
					t.Fatalf("record %s: block type %d, literals type %d; want a compressed block with raw or RLE literals", id, bt, lt)
				}
			}
			for id, data := range want {
				mustGet(t, s, coll, id, data)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}

			// Small commits after small commits are written raw; Repack
			// compresses them with the entropy stage.
			s = openStore(t, o)
			defer s.Close()
			var raw []Record
			for range 8 {
				raw = append(raw, Record{ID: randID(r), Data: textPayload(r, 400+r.IntN(600))})
			}
			for _, rec := range raw {
				if err := s.PutMany(coll, []Record{rec}); err != nil {
					t.Fatal(err)
				}
				if err := s.Sync(); err != nil {
					t.Fatal(err)
				}
				want[rec.ID] = rec.Data
				ids = append(ids, rec.ID)
			}
			if _, err := s.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: coll, Records: ids}}}); err != nil {
				t.Fatal(err)
			}
			// zstd keeps a record's literals raw where Huffman coding does
			// not shrink them: most of these it does.
			payloads = zstdPayloadsOnDisk(t, dir)
			huffman := 0
			for _, rec := range raw {
				p, ok := payloads[rec.ID]
				if !ok {
					t.Fatalf("record %s written raw is still raw after Repack", rec.ID)
				}
				sum, bt, lt := zstdFrameInfo(t, p)
				if sum != (mode != ChecksumFull) || bt != 2 {
					t.Fatalf("record %s after Repack: checksum %v, block type %d; want %v, 2", rec.ID, sum, bt, mode != ChecksumFull)
				}
				if lt == 2 {
					huffman++
				}
			}
			if huffman*2 < len(raw) {
				t.Fatalf("after Repack %d of %d records have Huffman-coded literals", huffman, len(raw))
			}
			for id, data := range want {
				mustGet(t, s, coll, id, data)
			}
			mustCheck(t, s)
		})
	}
}

// readIDsScan, which table growth uses, reads the same record IDs as one
// readIDScan per slot, for runs of frames in several shards with gaps
// between them (records of two collections interleaved, records of other
// sizes), and names the frame when a run reaches past the end of a file.
func TestReadIDsScanRuns(t *testing.T) {
	r := rand.New(rand.NewPCG(testSeed(t), 29))
	dir := t.TempDir()
	s := openStore(t, Options{Dir: dir, MaxShardBytes: 256 << 10})
	defer s.Close()
	a, b := idN(1, 0), idN(1, 1)
	for range 40 {
		for _, coll := range []ID{a, a, b} {
			var recs []Record
			for range 1 + r.IntN(20) {
				recs = append(recs, Record{ID: randID(r), Data: payload(r, r.IntN(6000), false)})
			}
			if err := s.PutMany(coll, recs); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	t0 := s.collectionLoad(a).table.Load()
	var slots []uint64
	for i := range t0.slots {
		if v := t0.slots[i].Load(); v != 0 {
			slots = append(slots, v)
		}
	}
	slices.SortFunc(slots, func(x, y uint64) int {
		lx, ly := slotLoc(x), slotLoc(y)
		if lx.shard != ly.shard {
			return int(lx.shard) - int(ly.shard)
		}
		return int(lx.off) - int(ly.off)
	})
	got := make([]ID, len(slots))
	if err := s.readIDsScan(slots, got); err != nil {
		t.Fatal(err)
	}
	for i, v := range slots {
		want, _, err := s.readIDScan(slotLoc(v))
		if err != nil {
			t.Fatal(err)
		}
		if got[i] != want {
			t.Fatalf("slot %d (%+v): readIDsScan read %s, readIDScan %s", i, slotLoc(v), got[i], want)
		}
	}
	if s.active.id == 0 || len(slots) < 100 {
		t.Fatalf("%d slots in shards up to %d: the test wants several shards and many frames", len(slots), s.active.id)
	}

	// A run whose last frame lies past the end of its file.
	last := slotLoc(slots[len(slots)-1])
	sh := s.shards[last.shard].Load()
	past := makeSlot(ID{}, loc{shard: last.shard, off: uint32(sh.size) + 100})
	err := s.readIDsScan([]uint64{slots[len(slots)-1], past}, make([]ID, 2))
	if !IsCorruption(err) {
		t.Fatalf("run past the end of the file: %v, want an ErrCorrupt error", err)
	}
}
