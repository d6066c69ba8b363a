package packstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestReopenAfterManyRolls(t *testing.T) {
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 1))
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 64 << 10, Compress: true}
	s := openStore(t, opts)
	m := model{}
	for i := range 3000 {
		c := idN(1, i%5)
		d := payload(r, r.IntN(600), i%3 == 0)
		id := idN(2, i%2500) // some supersedes
		if err := s.Put(c, id, d); err != nil {
			t.Fatal(err)
		}
		m.put(c, id, d)
	}
	st := s.Stats()
	if st.Shards < 10 {
		t.Fatalf("only %d shards; the test wants many rolls", st.Shards)
	}
	mustCheck(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, opts)
	defer s.Close()
	mustCheck(t, s)
	compareAll(t, s, m, "reopen")
	if st2 := s.Stats(); st2 != st {
		t.Fatalf("stats changed across reopen:\n before %+v\n after  %+v", st, st2)
	}
}

// writeSmallStore writes a store whose last shard ends with a known final
// frame and returns the options, the model and the final frame's offset.
func writeSmallStore(t *testing.T) (Options, model, ID, ID, int64) {
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 32 << 10}
	s := openStore(t, opts)
	m := model{}
	r := rand.New(rand.NewPCG(3, 4))
	c := idN(1, 0)
	for i := range 100 {
		d := payload(r, 400, false)
		s.Put(c, idN(2, i), d)
		m.put(c, idN(2, i), d)
	}
	last := s.active
	off := last.size
	lastID := idN(3, 0)
	if err := s.Put(c, lastID, payload(r, 150, false)); err != nil {
		t.Fatal(err)
	}
	if s.active != last {
		t.Fatal("final frame rolled to a new shard; adjust sizes")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return opts, m, c, lastID, off
}

func lastShardPath(t *testing.T, dir string) string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var last string
	for _, e := range ents {
		if _, ok := parseShardFileName(e.Name()); ok && e.Name() > last {
			last = e.Name()
		}
	}
	return dir + "/" + last
}

func TestTornTailTruncated(t *testing.T) {
	opts, m, c, lastID, off := writeSmallStore(t)
	path := lastShardPath(t, opts.Dir)
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, content []byte) {
		t.Helper()
		if err := os.WriteFile(path, content, 0o644); err != nil {
			t.Fatal(err)
		}
		// The index files of the previous round cover bytes this round
		// replaces; a crash never rewrites covered bytes, so drop them.
		removeIndexFiles(t, opts.Dir)
		s, err := Open(opts)
		if err != nil {
			t.Fatalf("%s: Open: %v", name, err)
		}
		mustNotFound(t, s, c, lastID)
		mustCheck(t, s)
		compareAll(t, s, m, name)
		if fi, _ := os.Stat(path); fi.Size() != off {
			t.Fatalf("%s: file size %d after reopen, want truncation to %d", name, fi.Size(), off)
		}
		// Appends continue after the truncation point.
		if err := s.Put(c, lastID, []byte("again")); err != nil {
			t.Fatal(err)
		}
		mustGet(t, s, c, lastID, []byte("again"))
		s.Close()
	}
	for cut := off; cut < int64(len(orig)); cut++ {
		check("cut", orig[:cut])
	}
	// A bad CRC on the final frame, nothing valid after it.
	bad := bytes.Clone(orig)
	bad[len(bad)-1] ^= 1
	check("final crc", bad)
	bad = bytes.Clone(orig)
	bad[off+framePayloadOff+3] ^= 1
	check("final payload", bad)
	// Zero-filled tail (file extended but data not written).
	check("zero tail", append(bytes.Clone(orig[:off]), make([]byte, 300)...))
}

func removeIndexFiles(t testing.TB, dir string) {
	for _, name := range []string{checkpointFile, deltaFile} {
		if err := os.Remove(dir + "/" + name); err != nil && !os.IsNotExist(err) && t != nil {
			t.Fatal(err)
		}
	}
}

// TestCorruptionTable damages one field of a shard per row. Without index
// files (recovery by scan) Open must fail with an ErrCorrupt error naming
// the shard file and offset; with the checkpoint, Open succeeds, reading
// the damaged record fails with such an error and every other record,
// including those after it in the sealed shard, reads back intact. Header
// damage fails Open either way.
func TestCorruptionTable(t *testing.T) {
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 16 << 10}
	s := openStore(t, opts)
	r := rand.New(rand.NewPCG(5, 6))
	c := idN(1, 0)
	m := model{}
	for i := range 80 {
		d := payload(r, 500, false)
		s.Put(c, idN(2, i), d)
		m.put(c, idN(2, i), d)
	}
	if s.active.id < 2 {
		t.Fatal("want at least 3 shards")
	}
	lastShard := s.active.id
	s.Close()
	firstFrame := int64(HeaderSize)
	second := func(b []byte) int64 { // offset of the second frame
		return firstFrame + int64(binary.LittleEndian.Uint32(b[firstFrame:])) + 8
	}
	type row struct {
		name  string
		shard uint16
		mess  func(b []byte) int64 // damages b, returns the offset the error names
		want  string
	}
	rows := []row{
		{"header magic", 0, func(b []byte) int64 { b[0] = 'X'; return 0 }, "bad magic"},
		{"header version", 1, func(b []byte) int64 { b[headerVersionOff] = 7; return 0 }, "unsupported version"},
		{"header crc", 0, func(b []byte) int64 { b[headerCRCOff] ^= 1; return 0 }, "header crc"},
		{"header padding", 0, func(b []byte) int64 { b[100] = 1; return 0 }, "header crc"},
		{"header pack id", 0, func(b []byte) int64 {
			binary.LittleEndian.PutUint16(b[headerPackIDOff:], 7)
			binary.LittleEndian.PutUint32(b[headerCRCOff:], checksum(b[:headerCRCOff]))
			return 0
		}, "does not match file name"},
		{"last shard header", lastShard, func(b []byte) int64 { b[1] = 'X'; return 0 }, "bad magic"},
		{"frame len", 0, func(b []byte) int64 { o := second(b); b[o] ^= 0x10; return o }, ""},
		{"frame len huge", 0, func(b []byte) int64 { o := second(b); b[o+3] = 0x7f; return o }, "invalid frame length"},
		{"frame flags", 1, func(b []byte) int64 { o := second(b); b[o+frameFlagsOff] = 0x80; return o }, "unknown frame flags"},
		{"frame payload", 0, func(b []byte) int64 { o := second(b); b[o+framePayloadOff+7] ^= 1; return o }, "crc mismatch"},
		{"frame crc", 1, func(b []byte) int64 { o := second(b); b[o+second(b)-firstFrame-1] ^= 1; return o }, "crc mismatch"},
		{"frame raw_len", 0, func(b []byte) int64 { o := second(b); b[o+frameRawLenOff] ^= 1; return o }, ""},
		{"middle frame of last shard", lastShard, func(b []byte) int64 { o := firstFrame; b[o+framePayloadOff] ^= 1; return o }, "crc mismatch"},
		{"partial frame in sealed shard", 0, nil, "past end"},
	}
	for _, rw := range rows {
		t.Run(rw.name+"/checkpoint", func(t *testing.T) {
			dir := t.TempDir()
			copyDir(t, opts.Dir, dir)
			path := shardPath(dir, rw.shard)
			b, _ := os.ReadFile(path)
			header := rw.mess != nil && rw.mess(bytes.Clone(b)) == 0
			if rw.mess == nil {
				b = b[:len(b)-10]
			} else {
				rw.mess(b)
			}
			os.WriteFile(path, b, 0o644)
			o := opts
			o.Dir = dir
			s, err := Open(o)
			if header || rw.mess == nil {
				if !IsCorruption(err) || !strings.Contains(err.Error(), shardFileName(rw.shard)) {
					t.Fatalf("Open = %v, want corruption naming %s", err, shardFileName(rw.shard))
				}
				return
			}
			if err != nil {
				t.Fatalf("Open with checkpoint: %v", err)
			}
			defer s.Close()
			bad := 0
			for id, want := range m[c] {
				got, err := s.Get(c, id)
				if err == nil && bytes.Equal(got, want) {
					continue
				}
				if !IsCorruption(err) || !strings.Contains(err.Error(), shardFileName(rw.shard)) || !strings.Contains(err.Error(), "offset ") {
					t.Fatalf("Get %s: %d bytes, %v", id, len(got), err)
				}
				bad++
			}
			if bad != 1 {
				t.Fatalf("%d records unreadable, want exactly the damaged one", bad)
			}
		})
		t.Run(rw.name+"/scan", func(t *testing.T) {
			dir := t.TempDir()
			copyDir(t, opts.Dir, dir)
			path := shardPath(dir, rw.shard)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var off int64
			if rw.mess == nil { // cut a sealed shard inside its last frame
				b = b[:len(b)-10]
				off = -1
			} else {
				off = rw.mess(b)
			}
			os.WriteFile(path, b, 0o644)
			removeIndexFiles(t, dir)
			o := opts
			o.Dir = dir
			s, err := Open(o)
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded on a damaged store")
			}
			if !IsCorruption(err) {
				t.Fatalf("error %v does not mark corruption", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, shardFileName(rw.shard)) || !strings.HasPrefix(msg, "packstore: ") {
				t.Fatalf("error %q does not name %s", msg, shardFileName(rw.shard))
			}
			if off >= 0 && !strings.Contains(msg, "offset "+itoa(off)+":") {
				t.Fatalf("error %q does not name offset %d", msg, off)
			}
			if rw.want != "" && !strings.Contains(msg, rw.want) {
				t.Fatalf("error %q does not say %q", msg, rw.want)
			}
			t.Log(msg)
		})
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func copyDir(t *testing.T, from, to string) {
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(from + "/" + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to+"/"+e.Name(), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestShardLimit(t *testing.T) {
	opts := Options{Dir: t.TempDir(), MaxShardBytes: minShardBytes, maxShards: 3}
	s := openStore(t, opts)
	defer s.Close()
	c := idN(1, 0)
	var n int
	var err error
	for n = 0; n < 100; n++ {
		if err = s.Put(c, idN(2, n), make([]byte, 300)); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrShardLimit) {
		t.Fatalf("got %v after %d puts, want ErrShardLimit", err, n)
	}
	if strings.Contains(err.Error(), "offset") || IsCorruption(err) {
		t.Fatalf("limit error looks like corruption: %v", err)
	}
	before := s.Stats()
	// A batch that cannot fit writes nothing.
	if err := s.PutMany(c, []Record{{ID: idN(3, 0)}, {ID: idN(3, 1), Data: make([]byte, 900)}}); !errors.Is(err, ErrShardLimit) {
		t.Fatalf("PutMany: %v", err)
	}
	if after := s.Stats(); after != before {
		t.Fatalf("failed batch changed the store: %+v -> %+v", before, after)
	}
	for i := range n {
		mustGet(t, s, c, idN(2, i), make([]byte, 300))
	}
	mustCheck(t, s)
	// Too large for any shard.
	if err := s.Put(c, idN(4, 0), make([]byte, minShardBytes)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized Put: %v", err)
	}
	// The real limit: 4096 shards addressable.
	if MaxShards != 4096 || (MaxShards-1)<<slotShardShift>>slotShardShift != slotShardMask {
		t.Fatal("slot layout changed")
	}
}

func TestRetirementReclaimsSpace(t *testing.T) {
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 16 << 10}
	s := openStore(t, opts)
	r := rand.New(rand.NewPCG(8, 9))
	a, b := idN(1, 0), idN(1, 1)
	m := model{}
	for i := range 200 {
		for _, c := range []ID{a, b} {
			d := payload(r, 300, false)
			s.Put(c, idN(2, i), d)
			m.put(c, idN(2, i), d)
		}
	}
	before := s.Stats()
	if err := s.DeleteCollection(a); err != nil {
		t.Fatal(err)
	}
	delete(m, a)
	keep := []ID{idN(2, 5), idN(2, 150), idN(2, 7)}
	st, err := s.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: b, Records: keep}}})
	if err != nil {
		t.Fatal(err)
	}
	after := s.Stats()
	t.Logf("before %+v\nrepack %+v\nafter %+v", before, st, after)
	if st.ShardsRetired == 0 || after.DiskBytes >= before.DiskBytes/4 || st.BytesRetired <= 0 {
		t.Fatalf("repack did not return disk space: before %+v after %+v stats %+v", before, after, st)
	}
	nb := map[ID][]byte{}
	for _, id := range keep {
		nb[id] = m[b][id]
	}
	m[b] = nb
	mustCheck(t, s)
	compareAll(t, s, m, "after repack")
	s.Close()
	s = openStore(t, opts)
	defer s.Close()
	mustCheck(t, s)
	compareAll(t, s, m, "reopen after repack")
}

// TestResetMarkerKeptWhileShadowing covers retirement rule (c): a shard
// whose only content is a reset marker for X must survive while a lower
// shard that survives still holds X's old frames.
func TestResetMarkerKeptWhileShadowing(t *testing.T) {
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 8 << 10}
	s := openStore(t, opts)
	x, y, z := idN(1, 0), idN(1, 1), idN(1, 2)
	m := model{}
	put := func(c ID, i int) {
		d := bytes.Repeat([]byte{byte(i)}, 700)
		if err := s.Put(c, idN(2, i), d); err != nil {
			t.Fatal(err)
		}
		m.put(c, idN(2, i), d)
	}
	// Shard 0 holds X and Y (Y stays live, so shard 0 survives).
	put(x, 0)
	put(y, 1)
	i := 2
	for ; s.active.id == 0; i++ {
		put(z, i)
	}
	// The marker for X lands in shard 1, among Z frames only.
	s.DeleteCollection(x)
	delete(m, x)
	markerShard := s.active.id
	for ; s.active.id == markerShard; i++ {
		put(z, i)
	}
	if _, ok := s.shards[0].Load().colls[x]; !ok || markerShard != 1 {
		t.Fatalf("layout: marker in shard %d", markerShard)
	}
	zKeep := idN(2, i-1) // in the active shard
	if _, err := s.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: z, Records: []ID{zKeep}}}}); err != nil {
		t.Fatal(err)
	}
	m[z] = map[ID][]byte{zKeep: m[z][zKeep]}
	if s.shards[markerShard].Load() == nil {
		t.Fatalf("shard %d with the reset marker for X was retired while shard 0 still holds X", markerShard)
	}
	s.Close()
	s = openStore(t, opts)
	mustCheck(t, s)
	compareAll(t, s, m, "reopen")
	mustNotFound(t, s, x, idN(2, 0))
	// Once Y moves away, shard 0 and the marker shard can both go.
	if _, err := s.Repack(RepackPlan{Collections: []CollectionPlan{{Collection: y, Records: []ID{idN(2, 1)}}}}); err != nil {
		t.Fatal(err)
	}
	if s.shards[0].Load() != nil || s.shards[markerShard].Load() != nil {
		t.Fatal("shards 0 and the marker shard should be retired once nothing needs them")
	}
	s.Close()
	s = openStore(t, opts)
	defer s.Close()
	mustCheck(t, s)
	compareAll(t, s, m, "reopen 2")
}
