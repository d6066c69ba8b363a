package packstore

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// persistStore writes a store with several collections, a deletion and a
// repack, syncs, and returns a snapshot taken while it is still open (as a
// crash would leave it: checkpoint + delta + shards), plus the model.
func persistStore(t *testing.T) (Options, string, model) {
	t.Helper()
	r := rand.New(rand.NewPCG(21, 22))
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 16 << 10, Compress: true}
	s := openStore(t, opts)
	m := model{}
	colls := []ID{idN(1, 0), idN(1, 1), idN(1, 2)}
	for i := range 60 {
		c := colls[i%3]
		d := payload(r, r.IntN(400), i%2 == 0)
		if err := s.Put(c, idN(2, i%40), d); err != nil {
			t.Fatal(err)
		}
		m.put(c, idN(2, i%40), d)
	}
	if err := s.Close(); err != nil { // checkpoint covering the above
		t.Fatal(err)
	}
	s = openStore(t, opts)
	if rep := s.OpenReport(); rep.Source != "checkpoint" || rep.ScannedFrames != 0 {
		t.Fatalf("reopen after Close: %+v", rep)
	}
	s.DeleteCollection(colls[2])
	delete(m, colls[2])
	for i := range 30 {
		d := payload(r, r.IntN(300), false)
		s.Put(colls[i%2], idN(3, i), d)
		m.put(colls[i%2], idN(3, i), d)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	snap := snapshotDir(t, opts.Dir)
	s.Close()
	return opts, snap, m
}

// openCopy opens a copy of snap after mutate changed one of its files.
func openCopy(t *testing.T, opts Options, snap, name string, mutate func([]byte) []byte) (*PackfileStorage, error) {
	t.Helper()
	dir := t.TempDir()
	copyDir(t, snap, dir)
	if mutate != nil {
		b, err := os.ReadFile(filepath.Join(snap, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), mutate(bytes.Clone(b)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	o := opts
	o.Dir = dir
	return Open(o)
}

func mustRecover(t *testing.T, opts Options, snap, name string, mutate func([]byte) []byte, m model, what string) OpenReport {
	t.Helper()
	s, err := openCopy(t, opts, snap, name, mutate)
	if err != nil {
		t.Fatalf("%s: Open: %v", what, err)
	}
	defer s.Close()
	if err := s.Check(); err != nil {
		t.Fatalf("%s: Check: %v", what, err)
	}
	compareAll(t, s, m, what)
	return s.OpenReport()
}

func TestCheckpointDeltaReplay(t *testing.T) {
	opts, snap, m := persistStore(t)
	rep := mustRecover(t, opts, snap, "", nil, m, "crash after Sync")
	if rep.Source != "checkpoint+delta" || rep.DeltaEntries == 0 || rep.ScannedFrames != 0 {
		t.Fatalf("report %+v, want the delta to cover everything", rep)
	}
	t.Logf("%+v", rep)
}

// TestCheckpointTruncatedEveryOffset: a checkpoint cut at any offset is
// rejected and the store recovers by a full scan.
func TestCheckpointTruncatedEveryOffset(t *testing.T) {
	opts, snap, m := persistStore(t)
	b, _ := os.ReadFile(filepath.Join(snap, checkpointFile))
	for _, cut := range sampled(len(b), ckptHeaderLen+8, 29) {
		rep := mustRecover(t, opts, snap, checkpointFile, func(b []byte) []byte { return b[:cut] }, m, "checkpoint cut")
		if rep.Source != "scan" || rep.CheckpointErr == nil {
			t.Fatalf("cut at %d: report %+v", cut, rep)
		}
		if cut > 0 && !IsCorruption(rep.CheckpointErr) {
			t.Fatalf("cut at %d: checkpoint error %v does not mark corruption", cut, rep.CheckpointErr)
		}
	}
}

// TestDeltaTruncatedEveryOffset: a delta cut at any offset replays its
// whole entries and the shard scan covers the rest.
func TestDeltaTruncatedEveryOffset(t *testing.T) {
	opts, snap, m := persistStore(t)
	b, _ := os.ReadFile(filepath.Join(snap, deltaFile))
	for _, cut := range sampled(len(b), deltaHeaderLen+deltaEntryLen+1, 23) {
		rep := mustRecover(t, opts, snap, deltaFile, func(b []byte) []byte { return b[:cut] }, m, "delta cut")
		wantEntries := max(0, (cut-deltaHeaderLen)/deltaEntryLen)
		if rep.DeltaEntries != wantEntries || rep.Source == "scan" {
			t.Fatalf("cut at %d: report %+v, want %d entries", cut, rep, wantEntries)
		}
	}
}

// TestIndexFileBitFlips flips every bit of the checkpoint header, of the
// first bytes of each checkpoint section and of every delta byte: each
// case recovers cleanly with the same records.
func TestIndexFileBitFlips(t *testing.T) {
	opts, snap, m := persistStore(t)
	for _, name := range []string{checkpointFile, deltaFile} {
		b, _ := os.ReadFile(filepath.Join(snap, name))
		dense := ckptHeaderLen + ckptShardLen + ckptMetaLen
		if name == deltaFile {
			dense = deltaHeaderLen + deltaEntryLen
		}
		for _, o := range sampled(len(b), dense, 41) {
			for bit := range 8 {
				if !long() && bit != o%8 {
					continue
				}
				rep := mustRecover(t, opts, snap, name, func(b []byte) []byte { b[o] ^= 1 << bit; return b }, m, name+" bit flip")
				if name == checkpointFile && rep.CheckpointErr == nil {
					t.Fatalf("%s byte %d bit %d: flip not noticed: %+v", name, o, bit, rep)
				}
			}
		}
	}
}

func TestDeltaEntryHex(t *testing.T) {
	var c, id ID
	for i := range c {
		c[i], id[i] = 0x11, 0x22
	}
	b := appendDeltaEntry(nil, frameMeta{at: loc{0, 4096}, size: 47, coll: c, id: id})
	got := hex.EncodeToString(b)
	want := "01" + "00" + "0000" + "00100000" + "2f000000" + "11111111111111111111111111111111" + "22222222222222222222222222222222"
	if got != want+"3e10260c" || len(b) != deltaEntryLen {
		t.Fatalf("entry %s", got)
	}
	m, err := decodeDeltaEntry(b)
	if err != nil || m.id != id || m.coll != c || m.size != 47 {
		t.Fatalf("decode %+v %v", m, err)
	}
	cp := encodeCheckpoint(&checkpoint{gen: 1, covered: loc{0, 4096}, shards: []ckptShard{{0, 4096}}})
	if h := hex.EncodeToString(cp); h != "4d54434b030000000100000000000000000000000010000001000000000000000000000000000000000000008b73b06e000000000010000000cf8afc" {
		t.Fatalf("checkpoint %s", h)
	}
	if _, err := decodeCheckpoint(cp); err != nil {
		t.Fatal(err)
	}
	// A collection in the 0x03 layout (testdata/checkpoint.bin, doc.go):
	// head, occupancy bitmap (slot 2 of 8), the one used slot.
	seed, err := os.ReadFile(filepath.Join("testdata", "checkpoint.bin"))
	if err != nil {
		t.Fatal(err)
	}
	coll := "11111111111111111111111111111111" + "03000000" + "01000000" + "2f00000000000000" + "04" + "0110001000222222"
	if h := hex.EncodeToString(seed[len(seed)-crcLen-len(coll)/2 : len(seed)-crcLen]); h != coll {
		t.Fatalf("collection %s", h)
	}
}

// TestCheckpointCompactCorrupt: a 0x03 table whose bytes are damaged but
// whose CRCs were recomputed (so only the structural checks can notice), or
// a checkpoint whose header or body CRC no longer matches, is rejected with
// an error saying what is wrong and the offset of what failed (the field,
// entry or slot; for a CRC, the first byte it covers), and Open then rebuilds
// by scanning, naming index.ckpt and that offset in OpenReport.CheckpointErr.
func TestCheckpointCompactCorrupt(t *testing.T) {
	seed, err := os.ReadFile(filepath.Join("testdata", "checkpoint.bin"))
	if err != nil {
		t.Fatal(err)
	}
	slot := len(seed) - crcLen - 8 // the one used slot
	bitmap := slot - 1
	collHead := bitmap - ckptCollHeadLen
	for _, tc := range []struct {
		name    string
		mess    func(b []byte) []byte
		want    string
		at      int  // the offset the error names
		keepCRC bool // leave the body CRC as it is (else recomputed)
	}{
		{"bitmap marks two slots", func(b []byte) []byte { b[bitmap] |= 1; return b }, "occupancy bitmap marks 2 slots, count 1", bitmap, false},
		{"bitmap marks none", func(b []byte) []byte { b[bitmap] = 0; return b }, "occupancy bitmap marks 0 slots, count 1", bitmap, false},
		{"zero slot", func(b []byte) []byte { clear(b[slot : slot+8]); return b }, "slot 2 holds 0x0", slot, false},
		{"slot past its shard", func(b []byte) []byte { b[slot+1] = 0x70; return b }, "not a location inside the covered shards", slot, false},
		{"slot in an unlisted shard", func(b []byte) []byte { b[slot+3] = 0x30; return b }, "not a location inside the covered shards", slot, false},
		{"slot list cut short", func(b []byte) []byte { return append(b[:slot], b[slot+8:]...) }, "exceed the remaining", collHead + 16, false},
		{"extra slot", func(b []byte) []byte { return append(b[:slot+8], append(make([]byte, 8), b[slot+8:]...)...) }, "trailing bytes", slot + 8, false},
		{"table bits", func(b []byte) []byte { b[collHead+16] = 99; return b }, "table bits 99 invalid", collHead + 16, false},
		{"shard entry", func(b []byte) []byte { clear(b[ckptHeaderLen+4 : ckptHeaderLen+8]); return b }, "checkpoint shard entry 0 invalid", ckptHeaderLen, false},
		{"version", func(b []byte) []byte { b[4] = 0x09; return b }, "unsupported checkpoint version 0x09", 4, false},
		{"header crc", func(b []byte) []byte { b[10] ^= 1; return b }, "checkpoint header crc mismatch over bytes 0-43", 0, false},
		{"body crc", func(b []byte) []byte { b[len(b)-1] ^= 1; return b }, fmt.Sprintf("checkpoint body crc mismatch over bytes 48-%d", len(seed)-crcLen-1), ckptHeaderLen, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.mess(append([]byte{}, seed...))
			if !tc.keepCRC {
				binary.LittleEndian.PutUint32(b[len(b)-crcLen:], checksum(b[ckptHeaderLen:len(b)-crcLen]))
			}
			if _, err := decodeCheckpoint(b); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("decode: %v, want %q", err, tc.want)
			}
			dir := t.TempDir()
			s := openStore(t, Options{Dir: dir})
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, checkpointFile), b, 0o600); err != nil {
				t.Fatal(err)
			}
			s = openStore(t, Options{Dir: dir})
			defer s.Close()
			rep := s.OpenReport()
			where := fmt.Sprintf("%s offset %d: ", checkpointFile, tc.at)
			if rep.Source != "scan" || !errors.Is(rep.CheckpointErr, ErrCorrupt) || !strings.Contains(rep.CheckpointErr.Error(), where) {
				t.Fatalf("open: source %s, checkpoint error %v, want %q", rep.Source, rep.CheckpointErr, where)
			}
		})
	}
}
