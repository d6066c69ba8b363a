package roomrecord

import (
	"errors"
	"reflect"
	"testing"

	"github.com/mtxdb/mtxdb/hamtstore"
)

func sampleRecords() [][]byte {
	m := EventMeta{Seq: 7, Depth: 42, IsState: true, Redacted: true, EventID: "$a", Type: "m.room.member",
		StateKey: "@u:s", PrevEvents: []string{"$p1", "$p2"}, AuthEvents: []string{"$c"}}
	s := EventState{Rejected: true, Reason: "no", Before: hamtstore.NodeID{1}, After: hamtstore.NodeID{1}}
	h := Head{RoomID: "!r:s", RoomVersion: "10", Events: 3, LogChunks: 1, Replayed: true,
		CurrentState: hamtstore.NodeID{9}, ForwardExtremities: []string{"$x", "$y"}}
	kept := h // a version 2 head: with an every-k keep rule
	kept.StateEvery, kept.StateKeptBelow = 4, 3
	h3, _ := v3Sample() // a version 3 head: extremities in chunk records
	v3 := EncodeHead(&h3)
	return [][]byte{EncodeMeta(&m), EncodeState(&s), EncodeHead(&h), EncodeHead(&kept), EncodeLogChunk([]string{"$a", "$b"}),
		EncodeEvent("$a", []byte(`{"type":"m.room.message"}`)), StateKey("m.room.member", "@u:s"), EncodeGraphChunk(3, sampleGraph()),
		v3, EncodeExtremityChunk([]string{"$a", "$c"})}
}

func sampleGraph() []GraphEntry {
	return []GraphEntry{
		{isState: true, key: StatePair{"m.room.member", "@u:s"}, prev: []uint32{0, graphEdgeMissing}, auth: []uint32{1}, missing: []string{"$later"}},
		{redacted: true, prev: []uint32{3}, auth: []uint32{}, missing: []string{}},
	}
}

// TestGraphRecordCorrupt: a graph record round-trips; every cut of it fails to
// decode; a load that finds an edge past the room's events, a record that
// starts elsewhere than the events before it, or more events than the arrival
// log, says which (ErrCorruptRecord).
func TestGraphRecordCorrupt(t *testing.T) {
	b := EncodeGraphChunk(3, sampleGraph())
	base, got, err := decodeGraphChunk(b)
	if err != nil || base != 3 || !reflect.DeepEqual(got, sampleGraph()) {
		t.Fatalf("round trip: base %d, %+v, %v", base, got, err)
	}
	for n := range len(b) {
		if _, _, err := decodeGraphChunk(b[:n]); !errors.Is(err, ErrCorruptRecord) {
			t.Fatalf("cut at %d of %d: %v", n, len(b), err)
		}
	}
	ids := []string{"$0", "$1", "$2", "$3", "$4"}
	for _, tc := range []struct {
		name    string
		entries []GraphEntry
	}{
		{"edge past the events", []GraphEntry{{prev: []uint32{9}}}},
		{"missing edge without its ID", []GraphEntry{{prev: []uint32{graphEdgeMissing}}}},
		{"an ID without a missing edge", []GraphEntry{{prev: []uint32{0}, missing: []string{"$x"}}}},
	} {
		bld := NewGraphBuilder(ids)
		var err error
		for i := range tc.entries {
			if err = bld.addEntry(&tc.entries[i]); err != nil {
				break
			}
		}
		if !errors.Is(err, ErrCorruptRecord) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func TestRecordRoundTrip(t *testing.T) {
	m := EventMeta{Seq: 7, Depth: -1, IsState: true, EventID: "$a", Type: "t", StateKey: "",
		PrevEvents: []string{"$p"}, AuthEvents: []string{}}
	got, err := DecodeMeta(EncodeMeta(&m))
	if err != nil || !reflect.DeepEqual(got, m) {
		t.Fatalf("meta round trip: %+v, %v", got, err)
	}
	h := Head{RoomID: "!r", RoomVersion: "1", Events: 2, ForwardExtremities: []string{"$z"}}
	gh, err := DecodeHead(EncodeHead(&h))
	if err != nil || !reflect.DeepEqual(gh, h) {
		t.Fatalf("head round trip: %+v, %v", gh, err)
	}
	for _, k := range [][2]string{{"m.room.member", "@a:b"}, {"", ""}, {"x\x00y", "\x00"}} {
		ty, sk, err := SplitStateKey(StateKey(k[0], k[1]))
		if err != nil || ty != k[0] || sk != k[1] {
			t.Fatalf("state key %q: got %q %q %v", k, ty, sk, err)
		}
	}
}

// TestRecordTruncation cuts every sample record at every length: each cut must fail
// with ErrCorruptRecord (never panic, never decode).
func TestRecordTruncation(t *testing.T) {
	for i, rec := range sampleRecords()[:5] {
		end := len(rec)
		if rec[0] == kindEvent {
			end = 2 + 4 + len("$a") // the PDU JSON after the header is opaque here
		}
		for n := 0; n < end; n++ {
			if err := decodeAny(rec[:n]); err == nil || !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("record %d cut at %d/%d: err %v", i, n, len(rec), err)
			}
		}
		if err := decodeAny(append(append([]byte(nil), rec...), 0)); err == nil && rec[0] != kindEvent {
			t.Fatalf("record %d with a trailing byte decoded", i)
		}
	}
}

func decodeAny(b []byte) error {
	if len(b) == 0 {
		_, err := DecodeMeta(b)
		return err
	}
	var err error
	switch b[0] {
	case kindMeta:
		_, err = DecodeMeta(b)
	case kindState:
		_, err = DecodeState(b)
	case kindHead:
		_, err = DecodeHead(b)
	case kindLog:
		_, err = DecodeLogChunk(b)
	case kindEvent:
		_, _, err = DecodeEvent(b)
	default:
		_, err = DecodeMeta(b)
	}
	return err
}

func FuzzDecodeRecords(f *testing.F) {
	for _, r := range sampleRecords() {
		f.Add(r)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = DecodeMeta(b)
		_, _ = DecodeState(b)
		_, _ = DecodeHead(b)
		_, _ = DecodeLogChunk(b)
		_, _, _ = decodeGraphChunk(b)
		_, _, _ = DecodeEvent(b)
		_, _, _ = SplitStateKey(b)
		_, _ = DecodeExtremityChunk(ExtremityChunkID(b), b)
	})
}

// TestHeadKeepRule: a head with an every-k keep rule round-trips as version 2, one
// without it stays version 1 byte for byte, and a version 2 head without a rule or
// with a rule past its events is rejected; every cut of a version 2 head fails.
func TestHeadKeepRule(t *testing.T) {
	h := Head{RoomID: "!r", RoomVersion: "10", Events: 9, ForwardExtremities: []string{"$f"},
		StateEvery: 4, StateKeptBelow: 9}
	b := EncodeHead(&h)
	if b[1] != headVersion2 {
		t.Fatalf("head with a keep rule written as version %d", b[1])
	}
	got, err := DecodeHead(b)
	if err != nil || !reflect.DeepEqual(got, h) {
		t.Fatalf("v2 head round trip: %+v, %v", got, err)
	}
	for n := 0; n < len(b); n++ {
		if _, err := DecodeHead(b[:n]); !errors.Is(err, ErrCorruptRecord) {
			t.Fatalf("v2 head cut at %d: %v", n, err)
		}
	}
	h1 := h
	h1.StateEvery, h1.StateKeptBelow = 0, 0
	if b1 := EncodeHead(&h1); b1[1] != headVersion1 || len(b1) != len(b)-8 {
		t.Fatalf("head without a keep rule: version %d, %d bytes", b1[1], len(b1))
	}
	for _, bad := range []Head{{RoomID: "!r", Events: 9, StateEvery: 4, StateKeptBelow: 10}} {
		if _, err := DecodeHead(EncodeHead(&bad)); !errors.Is(err, ErrCorruptRecord) {
			t.Fatalf("head %+v decoded: %v", bad, err)
		}
	}
	noRule := append([]byte(nil), EncodeHead(&h1)...)
	noRule[1] = headVersion2
	noRule = append(noRule, 0, 0, 0, 0, 0, 0, 0, 0)
	if _, err := DecodeHead(noRule); !errors.Is(err, ErrCorruptRecord) {
		t.Fatalf("v2 head with K=0 decoded: %v", err)
	}
	// The rule: state events, extremities, multiples of K, late events.
	for _, tc := range []struct {
		m    EventMeta
		keep bool
	}{
		{EventMeta{Seq: 8}, true}, {EventMeta{Seq: 5}, false}, {EventMeta{Seq: 5, IsState: true}, true},
		{EventMeta{Seq: 5, EventID: "$f"}, true}, {EventMeta{Seq: 9}, true}, {EventMeta{Seq: 7}, false},
	} {
		if got := h.KeepsState(tc.m); got != tc.keep {
			t.Fatalf("KeepsState(%+v) = %t", tc.m, got)
		}
	}
	if !h1.KeepsState(EventMeta{Seq: 5}) {
		t.Fatal("a head without a rule must keep every state")
	}
}
