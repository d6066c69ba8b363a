package packstore

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var updateTestdata = flag.Bool("packstore.update", false, "rewrite the fuzz seed files in testdata/")

// seedFiles are the fuzz seeds in testdata/, one encoded structure each;
// TestTestdataSeeds regenerates them with -packstore.update.
func seedFiles() map[string][]byte {
	var c, id ID
	for i := range c {
		c[i], id[i] = 0x11, 0x22
	}
	cp := &checkpoint{gen: 7, covered: loc{1, 4096 + 47}, shards: []ckptShard{{0, 4096}, {1, 4096 + 47}},
		meta:  []ckptMeta{{kind: metaData, shard: 1, coll: c, at: loc{1, 4096}}},
		colls: []ckptColl{{coll: c, bits: 3, count: 1, liveBytes: 47, slots: []uint64{0, 0, makeSlot(id, loc{1, 4096}), 0, 0, 0, 0, 0}}}}
	delta := append(encodeDeltaHeader(7), appendDeltaEntry(nil, frameMeta{at: loc{1, 4143}, size: 47, coll: c, id: id})...)
	delta = appendDeltaEntry(delta, frameMeta{at: loc{1, 4190}, size: 53, coll: c, reset: true, pos: loc{1, 4096}})
	return map[string][]byte{
		"frame.bin":      appendFrame(nil, 0, 2, c, id, []byte("hi")),
		"marker.bin":     appendMarker(nil, c, loc{3, 4096}, true),
		"header.bin":     encodeHeader(shardHeader{PackID: 1, Created: 0x0102030405060708}),
		"checkpoint.bin": encodeCheckpoint(cp),
		"delta.bin":      delta,
	}
}

func TestTestdataSeeds(t *testing.T) {
	for name, b := range seedFiles() {
		path := filepath.Join("testdata", name)
		if *updateTestdata {
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s differs from its generator (run with -packstore.update): %v", path, err)
		}
	}
}

func addSeeds(f *testing.F, names ...string) {
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join("testdata", n))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// FuzzDecodeHeader: the shard header decoder never panics and accepts only
// canonical headers.
func FuzzDecodeHeader(f *testing.F) {
	addSeeds(f, "header.bin")
	f.Fuzz(func(t *testing.T, b []byte) {
		if h, err := decodeHeader(b); err == nil && !bytes.Equal(encodeHeader(h), b[:HeaderSize]) {
			t.Fatal("header does not re-encode canonically")
		}
	})
}

// FuzzDecodeCheckpoint: the checkpoint decoder never panics, never
// allocates past its input's claims, and what it accepts re-encodes to the
// same bytes.
func FuzzDecodeCheckpoint(f *testing.F) {
	addSeeds(f, "checkpoint.bin")
	f.Fuzz(func(t *testing.T, b []byte) {
		cp, err := decodeCheckpoint(b)
		if err == nil && !bytes.Equal(encodeCheckpoint(cp), b) {
			t.Fatal("checkpoint does not re-encode canonically")
		}
	})
}

// FuzzDecodeDelta: the delta header and entry decoders never panic and
// accepted entries re-encode to the same bytes.
func FuzzDecodeDelta(f *testing.F) {
	addSeeds(f, "delta.bin")
	f.Fuzz(func(t *testing.T, b []byte) {
		decodeDeltaHeader(b)
		for off := min(len(b), deltaHeaderLen); off+deltaEntryLen <= len(b); off += deltaEntryLen {
			m, err := decodeDeltaEntry(b[off:])
			if err == nil && !bytes.Equal(appendDeltaEntry(nil, m), b[off:off+deltaEntryLen]) {
				t.Fatal("delta entry does not re-encode canonically")
			}
		}
	})
}
