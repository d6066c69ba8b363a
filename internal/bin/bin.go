// Package bin holds the little-endian encoder and bounds-checked decoder shared by
// the record codecs of roomstate. Integers are little-endian; strings and byte slices
// are a u32 length followed by the bytes. The decoder never allocates more than the
// input can hold and records the first problem instead of panicking.
package bin

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrShort is returned (wrapped) when a field runs past the end of the input.
var ErrShort = errors.New("bin: input too short")

// ErrTrailing is returned (wrapped) by Finish when bytes are left after the last field.
var ErrTrailing = errors.New("bin: trailing bytes")

// Encoder appends fields to a byte slice. The zero value is ready to use.
// Not safe for concurrent use.
type Encoder struct{ B []byte }

// U8 appends v as one byte.
func (e *Encoder) U8(v uint8) { e.B = append(e.B, v) }

// U16 appends v as 2 bytes, little-endian.
func (e *Encoder) U16(v uint16) { e.B = binary.LittleEndian.AppendUint16(e.B, v) }

// U32 appends v as 4 bytes, little-endian.
func (e *Encoder) U32(v uint32) { e.B = binary.LittleEndian.AppendUint32(e.B, v) }

// U64 appends v as 8 bytes, little-endian.
func (e *Encoder) U64(v uint64) { e.B = binary.LittleEndian.AppendUint64(e.B, v) }

// Fixed appends b as is, with no length prefix (for 16-byte IDs).
func (e *Encoder) Fixed(b []byte) { e.B = append(e.B, b...) }

// Str appends a u32 length and the bytes of s.
func (e *Encoder) Str(s string) {
	e.U32(uint32(len(s)))
	e.B = append(e.B, s...)
}

// Strs appends a u32 count and each string with Str.
func (e *Encoder) Strs(ss []string) {
	e.U32(uint32(len(ss)))
	for _, s := range ss {
		e.Str(s)
	}
}

// Decoder reads fields from a byte slice. After the first failure every read returns
// a zero value and Err reports the failure with the offset where it happened.
// Not safe for concurrent use.
type Decoder struct {
	b   []byte
	off int
	err error
}

// NewDecoder returns a decoder over b; b is not copied.
func NewDecoder(b []byte) *Decoder { return &Decoder{b: b} }

func (d *Decoder) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b)-d.off {
		d.err = fmt.Errorf("%w: %s needs %d bytes at offset %d, %d left", ErrShort, what, n, d.off, len(d.b)-d.off)
		return nil
	}
	s := d.b[d.off : d.off+n]
	d.off += n
	return s
}

// U8 reads one byte; what names the field in the error if the input is short.
func (d *Decoder) U8(what string) uint8 {
	if s := d.take(1, what); s != nil {
		return s[0]
	}
	return 0
}

// U16 reads 2 bytes, little-endian; what names the field in the error if the input
// is short.
func (d *Decoder) U16(what string) uint16 {
	if s := d.take(2, what); s != nil {
		return binary.LittleEndian.Uint16(s)
	}
	return 0
}

// U32 reads 4 bytes, little-endian; what names the field in the error if the input
// is short.
func (d *Decoder) U32(what string) uint32 {
	if s := d.take(4, what); s != nil {
		return binary.LittleEndian.Uint32(s)
	}
	return 0
}

// U64 reads 8 bytes, little-endian; what names the field in the error if the input
// is short.
func (d *Decoder) U64(what string) uint64 {
	if s := d.take(8, what); s != nil {
		return binary.LittleEndian.Uint64(s)
	}
	return 0
}

// Fixed copies len(dst) bytes into dst.
func (d *Decoder) Fixed(dst []byte, what string) {
	if s := d.take(len(dst), what); s != nil {
		copy(dst, s)
	}
}

// Str reads a u32 length and that many bytes; the length is checked against the
// remaining input before anything is allocated.
func (d *Decoder) Str(what string) string {
	n := d.U32(what + " length")
	if d.err != nil {
		return ""
	}
	if uint64(n) > uint64(len(d.b)-d.off) {
		d.err = fmt.Errorf("%w: %s declares %d bytes at offset %d, %d left", ErrShort, what, n, d.off, len(d.b)-d.off)
		return ""
	}
	return string(d.take(int(n), what))
}

// Strs reads a u32 count and that many strings. Each string needs at least 4 bytes,
// so a count larger than a quarter of the remaining input is rejected up front.
func (d *Decoder) Strs(what string) []string {
	n := d.U32(what + " count")
	if d.err != nil {
		return nil
	}
	if uint64(n) > uint64(len(d.b)-d.off)/4 {
		d.err = fmt.Errorf("%w: %s declares %d entries at offset %d, %d bytes left", ErrShort, what, n, d.off, len(d.b)-d.off)
		return nil
	}
	out := make([]string, 0, n)
	for i := uint32(0); i < n && d.err == nil; i++ {
		out = append(out, d.Str(what))
	}
	return out
}

// Finish reports the first failure, or an error if bytes are left over.
func (d *Decoder) Finish() error {
	if d.err != nil {
		return d.err
	}
	if d.off != len(d.b) {
		return fmt.Errorf("%w: %d bytes left at offset %d", ErrTrailing, len(d.b)-d.off, d.off)
	}
	return nil
}

// Err reports the first failure so far.
func (d *Decoder) Err() error { return d.err }
