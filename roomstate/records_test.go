package roomstate

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
	return [][]byte{encodeMeta(&m), encodeState(&s), encodeHead(&h), encodeLogChunk([]string{"$a", "$b"}),
		encodeEvent("$a", []byte(`{"type":"m.room.message"}`)), StateKey("m.room.member", "@u:s")}
}

func TestRecordRoundTrip(t *testing.T) {
	m := EventMeta{Seq: 7, Depth: -1, IsState: true, EventID: "$a", Type: "t", StateKey: "",
		PrevEvents: []string{"$p"}, AuthEvents: []string{}}
	got, err := decodeMeta(encodeMeta(&m))
	if err != nil || !reflect.DeepEqual(got, m) {
		t.Fatalf("meta round trip: %+v, %v", got, err)
	}
	h := Head{RoomID: "!r", RoomVersion: "1", Events: 2, ForwardExtremities: []string{"$z"}}
	gh, err := decodeHead(encodeHead(&h))
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
		_, err := decodeMeta(b)
		return err
	}
	var err error
	switch b[0] {
	case kindMeta:
		_, err = decodeMeta(b)
	case kindState:
		_, err = decodeState(b)
	case kindHead:
		_, err = decodeHead(b)
	case kindLog:
		_, err = decodeLogChunk(b)
	case kindEvent:
		_, _, err = decodeEvent(b)
	default:
		_, err = decodeMeta(b)
	}
	return err
}

func FuzzDecodeRecords(f *testing.F) {
	for _, r := range sampleRecords() {
		f.Add(r)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = decodeMeta(b)
		_, _ = decodeState(b)
		_, _ = decodeHead(b)
		_, _ = decodeLogChunk(b)
		_, _, _ = decodeEvent(b)
		_, _, _ = SplitStateKey(b)
	})
}
