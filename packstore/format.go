package packstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// The constants below are part of the on-disk format (see doc.go).

// Shard header layout.
const (
	// HeaderSize is the fixed size of a shard header; frames start here.
	HeaderSize = 4096

	headerMagicOff    = 0  // [4]byte "MTDB"
	headerVersionOff  = 4  // u8 format version
	headerReservedOff = 5  // u8, must be zero
	headerPackIDOff   = 6  // u16 pack ID
	headerCreatedOff  = 8  // u64 creation time, unix nanoseconds
	headerFeaturesOff = 16 // u32 feature flags
	headerSeqOff      = 20 // u32 stream sequence number (version 0x06)
	headerPadOff      = 24 // zero padding up to headerCRCOff (from 20 before 0x06)
	headerCRCOff      = HeaderSize - crcLen

	// FormatVersion is the shard format version written. Versions, in order:
	//   0x04: first version (there is no 0x01-0x03 shard format).
	//         A reset marker has no payload and means "forget every earlier
	//         frame of the collection".
	//   0x05: a reset marker carries an 8-byte position P (markerPosLen) and
	//         means "forget every frame of the collection located before P";
	//         repack writes its copy first and the marker after it, so a
	//         crash in the middle of a repack loses nothing. Feature flag
	//         FeatureNoCRC (checksum mode "none").
	//   0x06: pack IDs are reused. The header carries the shard's stream
	//         sequence number (u32 at headerSeqOff, one more than any shard
	//         before it); the global order of frames is (sequence, offset),
	//         and a reset marker's P is (sequence u32, offset u32) in the
	//         same 8 bytes, so it never names a later shard that reused a
	//         retired pack ID. A 0x04/0x05 shard's sequence is its pack ID
	//         (their pack IDs only grew), which makes their P bytes (pack
	//         u16, zero u16) read as the same sequence.
	// Readers accept all three; a 0x04 marker is read as P = its own position.
	FormatVersion = 0x06
	// formatVersionV4 is the oldest shard version still read;
	// formatVersionV5 the last one whose sequence is its pack ID.
	formatVersionV4 = 0x04
	formatVersionV5 = 0x05

	// FeatureNoCRC marks a shard written in checksum mode "none": its frames
	// carry a zero CRC field that is neither written nor verified.
	FeatureNoCRC = 1 << 0

	// knownFeatures is the set of feature-flag bits this version understands;
	// a header with any other bit set is rejected.
	knownFeatures = FeatureNoCRC
)

// Magic opens every shard file.
var Magic = [4]byte{'M', 'T', 'D', 'B'}

// Frame layout.
const (
	frameLenLen    = 4  // u32 len
	frameFlagsLen  = 1  // u8 flags
	frameRawLenLen = 4  // u32 raw_len
	idLen          = 16 // collection ID, record ID
	crcLen         = 4  // u32 CRC-32C

	frameFlagsOff   = frameLenLen                     // 4
	frameRawLenOff  = frameFlagsOff + frameFlagsLen   // 5
	frameCollOff    = frameRawLenOff + frameRawLenLen // 9
	frameIDOff      = frameCollOff + idLen            // 25
	framePayloadOff = frameIDOff + idLen              // 41

	// frameFixedLen is the smallest value of the len field: flags through
	// record ID, no payload.
	frameFixedLen = framePayloadOff - frameLenLen // 37

	// FrameOverhead is the framing cost of one record: 45 bytes.
	FrameOverhead = framePayloadOff + crcLen

	// FlagZstd marks a zstd-compressed payload; raw_len is the decompressed length.
	FlagZstd = 1 << 0
	// FlagReset marks a collection reset marker: every frame of the
	// collection located before the marker's position P in the global
	// (pack ID, offset) order is dead. The payload is P (markerPosLen bytes:
	// u16 pack ID, u16 zero, u32 offset); an empty payload (version 0x04)
	// means P is the marker's own position.
	FlagReset = 1 << 1

	// markerPosLen is the payload length of a positional reset marker.
	markerPosLen = 8

	knownFrameFlags = FlagZstd | FlagReset
)

// Limits that follow from the 64-bit index slot (tag 24 | shard 12 | offset 28,
// offset stored +1).
const (
	// MaxShards is the number of addressable shards (pack IDs 0..4095).
	MaxShards = 1 << 12
	// MaxShardBytesLimit is the default and largest Options.MaxShardBytes:
	// just under 256 MiB, so that offset+1 of every frame fits in 28 bits.
	MaxShardBytesLimit = 1<<28 - 1
	// minShardBytes is the smallest accepted Options.MaxShardBytes.
	minShardBytes = HeaderSize + 1024

	// maxFrameLen bounds the len field of any frame we accept.
	maxFrameLen = MaxShardBytesLimit - HeaderSize - frameLenLen - crcLen
	// maxRawLen bounds raw_len (the uncompressed payload length).
	maxRawLen = MaxShardBytesLimit - HeaderSize - FrameOverhead
)

// castagnoli is the CRC-32C (Castagnoli) table; CRCs are stored little-endian.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checksum returns the CRC-32C of b.
func checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// shardHeader is the decoded fixed header of a shard file.
type shardHeader struct {
	Version  byte // FormatVersion when encoding
	PackID   uint16
	Seq      uint32 // stream sequence number; the pack ID before 0x06
	Created  int64  // unix nanoseconds
	Features uint32
}

// encodeHeader returns the HeaderSize bytes of h.
func encodeHeader(h shardHeader) []byte {
	b := make([]byte, HeaderSize)
	copy(b[headerMagicOff:], Magic[:])
	b[headerVersionOff] = FormatVersion
	if h.Version != 0 {
		b[headerVersionOff] = h.Version
	}
	binary.LittleEndian.PutUint16(b[headerPackIDOff:], h.PackID)
	binary.LittleEndian.PutUint64(b[headerCreatedOff:], uint64(h.Created))
	binary.LittleEndian.PutUint32(b[headerFeaturesOff:], h.Features)
	if b[headerVersionOff] >= FormatVersion {
		binary.LittleEndian.PutUint32(b[headerSeqOff:], h.Seq)
	}
	binary.LittleEndian.PutUint32(b[headerCRCOff:], checksum(b[:headerCRCOff]))
	return b
}

// decodeHeader validates and decodes a shard header. The returned error is a
// bare reason; callers wrap it with ErrCorrupt and the file name.
func decodeHeader(b []byte) (shardHeader, error) {
	var h shardHeader
	if len(b) < HeaderSize {
		return h, fmt.Errorf("short header: %d of %d bytes", len(b), HeaderSize)
	}
	b = b[:HeaderSize]
	if [4]byte(b[headerMagicOff:headerMagicOff+4]) != Magic {
		return h, fmt.Errorf("bad magic %q", b[headerMagicOff:headerMagicOff+4])
	}
	if v := b[headerVersionOff]; v != FormatVersion && v != formatVersionV5 && v != formatVersionV4 {
		return h, fmt.Errorf("unsupported version 0x%02x", v)
	}
	if want, got := binary.LittleEndian.Uint32(b[headerCRCOff:]), checksum(b[:headerCRCOff]); want != got {
		return h, fmt.Errorf("header crc mismatch: stored %08x, computed %08x", want, got)
	}
	if b[headerReservedOff] != 0 {
		return h, errors.New("nonzero reserved header byte")
	}
	h.Version = b[headerVersionOff]
	pad := headerPadOff
	if h.Version < FormatVersion {
		pad = headerSeqOff
	}
	for _, c := range b[pad:headerCRCOff] {
		if c != 0 {
			return h, errors.New("nonzero header padding")
		}
	}
	h.PackID = binary.LittleEndian.Uint16(b[headerPackIDOff:])
	h.Seq = uint32(h.PackID)
	if h.Version >= FormatVersion {
		h.Seq = binary.LittleEndian.Uint32(b[headerSeqOff:])
	}
	h.Created = int64(binary.LittleEndian.Uint64(b[headerCreatedOff:]))
	h.Features = binary.LittleEndian.Uint32(b[headerFeaturesOff:])
	if h.PackID >= MaxShards {
		return h, fmt.Errorf("pack id %d out of range", h.PackID)
	}
	if h.Features&^knownFeatures != 0 || h.Version == formatVersionV4 && h.Features != 0 {
		return h, fmt.Errorf("unknown feature flags %08x", h.Features)
	}
	return h, nil
}

// appendFrame appends one encoded frame to dst with its CRC. payload is
// stored as given; rawLen is the uncompressed length (equal to len(payload)
// unless FlagZstd). The caller guarantees len(payload) <= maxRawLen.
func appendFrame(dst []byte, flags byte, rawLen int, coll, id ID, payload []byte) []byte {
	return appendFrameCRC(dst, flags, rawLen, coll, id, payload, true)
}

// appendMarker appends a reset marker for coll with position p.
func appendMarker(dst []byte, coll ID, p pos, withCRC bool) []byte {
	var b [markerPosLen]byte
	putPos(b[:], p)
	return appendFrameCRC(dst, FlagReset, markerPosLen, coll, ID{}, b[:], withCRC)
}

// putPos writes a stream position as sequence u32 | offset u32 (the bytes
// a version 0x05 writer wrote as pack u16 | zero u16 | offset u32, its
// sequence being its pack ID).
func putPos(b []byte, p pos) {
	binary.LittleEndian.PutUint32(b, p.seq)
	binary.LittleEndian.PutUint32(b[4:], p.off)
}

// getPos decodes the 8 bytes putPos writes.
func getPos(b []byte) pos {
	return pos{seq: binary.LittleEndian.Uint32(b), off: binary.LittleEndian.Uint32(b[4:])}
}

// appendFrameCRC is appendFrame with the CRC optional: without it the CRC
// field is zero (checksum mode "none", shards with FeatureNoCRC).
func appendFrameCRC(dst []byte, flags byte, rawLen int, coll, id ID, payload []byte, withCRC bool) []byte {
	start := len(dst)
	var hdr [framePayloadOff]byte
	binary.LittleEndian.PutUint32(hdr[0:], uint32(frameFixedLen+len(payload)))
	hdr[frameFlagsOff] = flags
	binary.LittleEndian.PutUint32(hdr[frameRawLenOff:], uint32(rawLen))
	copy(hdr[frameCollOff:], coll[:])
	copy(hdr[frameIDOff:], id[:])
	dst = append(dst, hdr[:]...)
	dst = append(dst, payload...)
	var crc uint32
	if withCRC {
		crc = checksum(dst[start:])
	}
	return binary.LittleEndian.AppendUint32(dst, crc)
}

// frameView is a decoded frame whose Payload aliases the input bytes.
type frameView struct {
	Size    int // total frame bytes: len field + 8
	Flags   byte
	RawLen  int
	Coll    ID
	ID      ID
	Payload []byte // stored payload (compressed when Flags&FlagZstd)
	// ResetPos is a reset marker's position P; HasPos is false for a
	// version 0x04 marker, whose P is its own position.
	ResetPos pos
	HasPos   bool
}

// errFrameTruncated is returned by decodeFrame when the frame's declared
// length runs past the end of the input.
var errFrameTruncated = errors.New("frame runs past end of data")

// frameSizeAt returns the total size of the frame starting at b, after
// validating the len field; errFrameTruncated if b is shorter than 4 bytes.
func frameSizeAt(b []byte) (int, error) {
	if len(b) < frameLenLen {
		return 0, errFrameTruncated
	}
	n := binary.LittleEndian.Uint32(b)
	if n < frameFixedLen || n > maxFrameLen {
		return 0, fmt.Errorf("invalid frame length %d", n)
	}
	return int(n) + frameLenLen + crcLen, nil
}

// decodeFrame validates the frame at the start of b (length, flags, raw_len,
// then CRC) and returns a view of it. Errors are bare reasons (errFrameTruncated
// when the frame does not fit in b); callers wrap them with ErrCorrupt,
// shard and offset.
func decodeFrame(b []byte) (frameView, error) { return decodeFrameCRC(b, true) }

// decodeFrameCRC is decodeFrame with the CRC check optional (checksum modes
// "writeonly" and "none" on reads, shards with FeatureNoCRC on scans).
func decodeFrameCRC(b []byte, verify bool) (frameView, error) {
	var fv frameView
	size, err := frameSizeAt(b)
	if err != nil {
		return fv, err
	}
	if size > len(b) {
		return fv, errFrameTruncated
	}
	b = b[:size]
	fv.Size = size
	fv.Flags = b[frameFlagsOff]
	raw := binary.LittleEndian.Uint32(b[frameRawLenOff:])
	fv.Coll = ID(b[frameCollOff : frameCollOff+idLen])
	fv.ID = ID(b[frameIDOff : frameIDOff+idLen])
	fv.Payload = b[framePayloadOff : size-crcLen]
	if fv.Flags&^knownFrameFlags != 0 {
		return fv, fmt.Errorf("unknown frame flags %02x", fv.Flags)
	}
	switch {
	case fv.Flags&FlagReset != 0:
		if fv.Flags != FlagReset || int(raw) != len(fv.Payload) || fv.ID != (ID{}) {
			return fv, errors.New("reset marker with other flags, a record ID or raw_len mismatch")
		}
		switch len(fv.Payload) {
		case 0:
		case markerPosLen:
			p := fv.Payload
			fv.ResetPos = getPos(p)
			fv.HasPos = true
			if fv.ResetPos.off < HeaderSize || fv.ResetPos.off > MaxShardBytesLimit {
				return fv, fmt.Errorf("reset marker position %x invalid", p)
			}
		default:
			return fv, fmt.Errorf("reset marker payload of %d bytes", len(fv.Payload))
		}
	case fv.Flags&FlagZstd != 0:
		if raw > maxRawLen || len(fv.Payload) == 0 {
			return fv, fmt.Errorf("compressed frame with raw_len %d, stored %d", raw, len(fv.Payload))
		}
	default:
		if int(raw) != len(fv.Payload) {
			return fv, fmt.Errorf("raw_len %d differs from payload length %d", raw, len(fv.Payload))
		}
	}
	// The CRC comes last so that scanning for a resynchronisation point
	// (tornTail) rejects most positions on the cheap header checks.
	if verify {
		if want, got := binary.LittleEndian.Uint32(b[size-crcLen:]), checksum(b[:size-crcLen]); want != got {
			return fv, fmt.Errorf("frame crc mismatch: stored %08x, computed %08x", want, got)
		}
	}
	fv.RawLen = int(raw)
	return fv, nil
}
