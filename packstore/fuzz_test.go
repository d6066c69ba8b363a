package packstore

import (
	"bytes"
	"encoding/hex"
	"testing"
)

// FuzzDecodeFrame feeds arbitrary bytes to the frame and shard header
// decoders and to the torn-tail scanner. They must never panic, and a frame
// that decodes must re-encode to the same bytes (canonical form).
func FuzzDecodeFrame(f *testing.F) {
	c, id := idN(1, 0), idN(2, 0)
	f.Add(appendFrame(nil, 0, 5, c, id, []byte("hello")))
	f.Add(appendFrame(nil, 0, 0, c, id, nil))
	f.Add(appendFrame(nil, FlagReset, 0, c, ID{}, nil))
	codecs()
	raw := bytes.Repeat([]byte("abcd"), 64)
	for _, encs := range zstdEncs {
		for _, enc := range encs {
			f.Add(appendFrame(nil, FlagZstd, len(raw), c, id, enc.EncodeAll(raw, nil)))
		}
	}
	f.Add(encodeHeader(shardHeader{PackID: 3, Created: 1}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x80})
	f.Add([]byte{})
	addSeeds(f, "frame.bin", "marker.bin")
	f.Fuzz(func(t *testing.T, b []byte) {
		if fv, err := decodeFrame(b); err == nil {
			again := appendFrame(nil, fv.Flags, fv.RawLen, fv.Coll, fv.ID, fv.Payload)
			if !bytes.Equal(again, b[:fv.Size]) {
				t.Fatalf("frame does not re-encode canonically")
			}
			if fv.Flags&FlagZstd != 0 {
				decodePayload(&shard{path: "fuzz"}, 0, fv) // must not panic
			}
		}
		if h, err := decodeHeader(b); err == nil {
			if !bytes.Equal(encodeHeader(h), b[:HeaderSize]) {
				t.Fatalf("header does not re-encode canonically")
			}
		}
		tornTail(b, 0, true)
		tornTail(b, 0, false)
	})
}

// TestFrameHexExample pins the worked example in doc.go.
func TestFrameHexExample(t *testing.T) {
	var c, id ID
	for i := range c {
		c[i] = 0x11
		id[i] = 0x22
	}
	got := hex.EncodeToString(appendFrame(nil, 0, 2, c, id, []byte("hi")))
	want := "27000000" + "00" + "02000000" +
		"11111111111111111111111111111111" +
		"22222222222222222222222222222222" +
		"6869" + got[len(got)-8:]
	if got != want || len(got)/2 != FrameOverhead+2 {
		t.Fatalf("frame = %s\nwant   %s", got, want)
	}
	t.Logf("frame: %s", got)
	h := encodeHeader(shardHeader{PackID: 1, Created: 0x0102030405060708})
	t.Logf("header head: %s ... crc %s", hex.EncodeToString(h[:20]), hex.EncodeToString(h[headerCRCOff:]))
}

func TestHeaderRoundTrip(t *testing.T) {
	h := shardHeader{Version: FormatVersion, PackID: 4095, Created: 123456789}
	got, err := decodeHeader(encodeHeader(h))
	if err != nil || got != h {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if _, err := decodeHeader(encodeHeader(h)[:100]); err == nil {
		t.Fatal("short header accepted")
	}
}

func TestSlotLayout(t *testing.T) {
	id := ID{0xff, 1, 2, 3, 4, 5, 6, 7, 0xab, 0xcd, 0xef}
	for _, l := range []loc{{0, 0}, {4095, slotOffMask - 1}, {7, 4096}} {
		s := makeSlot(id, l)
		if s == 0 || slotLoc(s) != l || slotTag(s) != 0xabcdef {
			t.Fatalf("slot %x for %+v decodes to %+v tag %x", s, l, slotLoc(s), slotTag(s))
		}
	}
	if MaxShardBytesLimit-1 > slotOffMask-1 {
		t.Fatal("largest offset does not fit the slot")
	}
}

// TestMarkerHexExample pins the reset marker example in doc.go.
func TestMarkerHexExample(t *testing.T) {
	var c ID
	for i := range c {
		c[i] = 0x11
	}
	b := appendMarker(nil, c, pos{seq: 3, off: 4096}, true)
	got := hex.EncodeToString(b)
	want := "2d000000" + "02" + "08000000" + "11111111111111111111111111111111" +
		"00000000000000000000000000000000" + "0300" + "0000" + "00100000" + "6bf8274c"
	if got != want || len(b) != FrameOverhead+markerPosLen {
		t.Fatalf("marker = %s\nwant     %s...", got, want)
	}
	fv, err := decodeFrame(b)
	if err != nil || !fv.HasPos || fv.ResetPos != (pos{3, 4096}) {
		t.Fatalf("decode: %+v %v", fv, err)
	}
	t.Logf("marker: %s", got)
}
