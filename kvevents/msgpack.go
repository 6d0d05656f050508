package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// This file holds the msgpack primitives both wire formats are decoded and
// encoded with. They are written by hand over the byte slice so that every
// length prefix is checked against the bytes that remain before anything is
// sized from it, and because they are faster: BenchmarkMsgpackDecode
// (msgpack_bench_test.go) runs the same decoding steps on
// vmihailenco/msgpack's low-level Decoder, which reads through an
// io.ByteScanner a byte at a time, and it is several times slower on every
// batch measured (figures in docs/benchmarks/events.md). vmihailenco/msgpack
// stays a test dependency: the independent encoder the tests build payloads
// with, and that benchmark's baseline.

// Decoding errors. Every decoder error wraps exactly one of these, so callers
// can count bad input by cause with errors.Is.
var (
	// ErrTruncated: the input ends inside a value.
	ErrTruncated = errors.New("kvevents: truncated input")
	// ErrMalformed: the bytes are not the expected msgpack shape or a value
	// is out of range.
	ErrMalformed = errors.New("kvevents: malformed input")
	// ErrOversized: the input, or a count or string inside it, exceeds a
	// decoder limit.
	ErrOversized = errors.New("kvevents: oversized input")
)

// mpReader reads msgpack values from b, advancing off. Every method checks
// bounds first and reports ErrTruncated or ErrMalformed; none panics.
type mpReader struct {
	b   []byte
	off int
}

func (r *mpReader) remaining() int { return len(r.b) - r.off }

func (r *mpReader) errTruncated(what string) error {
	return fmt.Errorf("%w: %s at byte %d of %d", ErrTruncated, what, r.off, len(r.b))
}

func (r *mpReader) errType(want string, got byte) error {
	return fmt.Errorf("%w: want %s at byte %d, got type byte 0x%02x", ErrMalformed, want, r.off, got)
}

// peek returns the next type byte without consuming it.
func (r *mpReader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, r.errTruncated("value")
	}
	return r.b[r.off], nil
}

// nextIsNil consumes a nil and reports true, or leaves the input as is.
func (r *mpReader) nextIsNil() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

// need checks that n more bytes exist after the type byte at r.off.
func (r *mpReader) need(n int, what string) error {
	if n > len(r.b)-r.off-1 {
		return r.errTruncated(what)
	}
	return nil
}

// length reads an n-byte big-endian length that follows the type byte.
func (r *mpReader) length(n int, what string) (int, error) {
	if err := r.need(n, what); err != nil {
		return 0, err
	}
	p := r.b[r.off+1:]
	var v uint64
	switch n {
	case 1:
		v = uint64(p[0])
	case 2:
		v = uint64(binary.BigEndian.Uint16(p))
	case 4:
		v = uint64(binary.BigEndian.Uint32(p))
	}
	r.off += 1 + n
	if v > math.MaxInt32 {
		return 0, fmt.Errorf("%w: %s length %d", ErrOversized, what, v)
	}
	return int(v), nil
}

// arrayLen reads an array header. The count is bounded by the bytes left
// (every element takes at least one byte), so a hostile count can never size
// an allocation beyond the input.
func (r *mpReader) arrayLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n int
	switch {
	case c >= 0x90 && c <= 0x9f:
		n = int(c & 0x0f)
		r.off++
	case c == 0xdc:
		n, err = r.length(2, "array header")
	case c == 0xdd:
		n, err = r.length(4, "array header")
	default:
		return 0, r.errType("array", c)
	}
	if err != nil {
		return 0, err
	}
	if n > r.remaining() {
		return 0, fmt.Errorf("%w: array of %d elements with %d bytes left", ErrTruncated, n, r.remaining())
	}
	return n, nil
}

// mapLen reads a map header; the pair count is bounded like arrayLen's.
func (r *mpReader) mapLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n int
	switch {
	case c >= 0x80 && c <= 0x8f:
		n = int(c & 0x0f)
		r.off++
	case c == 0xde:
		n, err = r.length(2, "map header")
	case c == 0xdf:
		n, err = r.length(4, "map header")
	default:
		return 0, r.errType("map", c)
	}
	if err != nil {
		return 0, err
	}
	if 2*n > r.remaining() {
		return 0, fmt.Errorf("%w: map of %d pairs with %d bytes left", ErrTruncated, n, r.remaining())
	}
	return n, nil
}

// integer reads any msgpack integer and returns its 64 bits with neg set
// for a negative signed value (v is then its two's complement).
func (r *mpReader) integer() (v uint64, neg bool, err error) {
	if r.off >= len(r.b) {
		return 0, false, r.errTruncated("integer")
	}
	c := r.b[r.off]
	if c <= 0x7f {
		r.off++
		return uint64(c), false, nil
	}
	if c >= 0xe0 {
		r.off++
		return uint64(int64(int8(c))), true, nil
	}
	var n int
	switch c {
	case 0xcc, 0xd0:
		n = 1
	case 0xcd, 0xd1:
		n = 2
	case 0xce, 0xd2:
		n = 4
	case 0xcf, 0xd3:
		n = 8
	default:
		return 0, false, r.errType("integer", c)
	}
	if err := r.need(n, "integer"); err != nil {
		return 0, false, err
	}
	p := r.b[r.off+1 : r.off+1+n]
	r.off += 1 + n
	signed := c >= 0xd0
	switch n {
	case 1:
		if signed {
			x := int64(int8(p[0]))
			return uint64(x), x < 0, nil
		}
		return uint64(p[0]), false, nil
	case 2:
		u := binary.BigEndian.Uint16(p)
		if signed {
			x := int64(int16(u))
			return uint64(x), x < 0, nil
		}
		return uint64(u), false, nil
	case 4:
		u := binary.BigEndian.Uint32(p)
		if signed {
			x := int64(int32(u))
			return uint64(x), x < 0, nil
		}
		return uint64(u), false, nil
	default:
		u := binary.BigEndian.Uint64(p)
		if signed {
			return u, int64(u) < 0, nil
		}
		return u, false, nil
	}
}

// uint reads a non-negative integer.
func (r *mpReader) uint() (uint64, error) {
	// Fast paths for the two forms hashes and small counts take.
	if r.off+9 <= len(r.b) && r.b[r.off] == 0xcf {
		v := binary.BigEndian.Uint64(r.b[r.off+1:])
		r.off += 9
		return v, nil
	}
	if r.off < len(r.b) && r.b[r.off] <= 0x7f {
		r.off++
		return uint64(r.b[r.off-1]), nil
	}
	start := r.off
	v, neg, err := r.integer()
	if err != nil {
		return 0, err
	}
	if neg {
		return 0, fmt.Errorf("%w: negative integer %d at byte %d", ErrMalformed, int64(v), start)
	}
	return v, nil
}

// uint32v reads a non-negative integer that must fit in 32 bits.
func (r *mpReader) uint32v() (uint32, error) {
	start := r.off
	v, err := r.uint()
	if err != nil {
		return 0, err
	}
	if v > math.MaxUint32 {
		return 0, fmt.Errorf("%w: integer %d at byte %d exceeds uint32", ErrMalformed, v, start)
	}
	return uint32(v), nil
}

// str reads a string and returns its bytes, aliasing the input.
func (r *mpReader) str() ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	var n int
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n = int(c & 0x1f)
		r.off++
	case c == 0xd9:
		n, err = r.length(1, "string header")
	case c == 0xda:
		n, err = r.length(2, "string header")
	case c == 0xdb:
		n, err = r.length(4, "string header")
	default:
		return nil, r.errType("string", c)
	}
	if err != nil {
		return nil, err
	}
	return r.take(n, "string")
}

// bin reads a byte string (bin8/16/32), aliasing the input.
func (r *mpReader) bin() ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	var n int
	switch c {
	case 0xc4:
		n, err = r.length(1, "bin header")
	case 0xc5:
		n, err = r.length(2, "bin header")
	case 0xc6:
		n, err = r.length(4, "bin header")
	default:
		return nil, r.errType("bin", c)
	}
	if err != nil {
		return nil, err
	}
	return r.take(n, "bin")
}

func (r *mpReader) take(n int, what string) ([]byte, error) {
	if n > r.remaining() {
		return nil, fmt.Errorf("%w: %s of %d bytes with %d left", ErrTruncated, what, n, r.remaining())
	}
	p := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return p, nil
}

// float reads a float32/float64, or an integer as a float.
func (r *mpReader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		if err := r.need(4, "float32"); err != nil {
			return 0, err
		}
		v := math.Float32frombits(binary.BigEndian.Uint32(r.b[r.off+1:]))
		r.off += 5
		return float64(v), nil
	case 0xcb:
		if err := r.need(8, "float64"); err != nil {
			return 0, err
		}
		v := math.Float64frombits(binary.BigEndian.Uint64(r.b[r.off+1:]))
		r.off += 9
		return v, nil
	}
	v, neg, err := r.integer()
	if err != nil {
		return 0, err
	}
	if neg {
		return float64(int64(v)), nil
	}
	return float64(v), nil
}

// skip consumes one complete value of any type. It walks nested containers
// iteratively with a counter of values still owed, so deep nesting costs no
// stack and a hostile count fails on the bounds check rather than looping.
func (r *mpReader) skip() error {
	owed := 1
	for owed > 0 {
		if owed > r.remaining() {
			return fmt.Errorf("%w: %d values owed with %d bytes left", ErrTruncated, owed, r.remaining())
		}
		owed--
		c := r.b[r.off]
		var err error
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
			r.off++
		case c >= 0x80 && c <= 0x8f:
			r.off++
			owed += 2 * int(c&0x0f)
		case c >= 0x90 && c <= 0x9f:
			r.off++
			owed += int(c & 0x0f)
		case c >= 0xa0 && c <= 0xbf:
			r.off++
			_, err = r.take(int(c&0x1f), "string")
		case c == 0xdc || c == 0xdd:
			var n int
			if n, err = r.length(2+2*int(c-0xdc), "array header"); err == nil {
				owed += n
			}
		case c == 0xde || c == 0xdf:
			var n int
			if n, err = r.length(2+2*int(c-0xde), "map header"); err == nil {
				owed += 2 * n
			}
		case c == 0xc4 || c == 0xd9:
			err = r.skipSized(1, 0)
		case c == 0xc5 || c == 0xda:
			err = r.skipSized(2, 0)
		case c == 0xc6 || c == 0xdb:
			err = r.skipSized(4, 0)
		case c == 0xc7: // ext8: length, type, data
			err = r.skipSized(1, 1)
		case c == 0xc8:
			err = r.skipSized(2, 1)
		case c == 0xc9:
			err = r.skipSized(4, 1)
		case c == 0xcc || c == 0xd0:
			err = r.skipFixed(1)
		case c == 0xcd || c == 0xd1:
			err = r.skipFixed(2)
		case c == 0xca || c == 0xce || c == 0xd2:
			err = r.skipFixed(4)
		case c == 0xcb || c == 0xcf || c == 0xd3:
			err = r.skipFixed(8)
		case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16 plus the type byte
			err = r.skipFixed(1 + 1<<(c-0xd4))
		default: // 0xc1 is never used
			return r.errType("any value", c)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (r *mpReader) skipFixed(n int) error {
	if err := r.need(n, "value"); err != nil {
		return err
	}
	r.off += 1 + n
	return nil
}

// skipSized skips a value with an n-byte length, extra fixed bytes after
// the length (the ext type), then length bytes of data.
func (r *mpReader) skipSized(n, extra int) error {
	l, err := r.length(n, "length")
	if err != nil {
		return err
	}
	if extra+l > r.remaining() {
		return fmt.Errorf("%w: value of %d bytes with %d left", ErrTruncated, extra+l, r.remaining())
	}
	r.off += extra + l
	return nil
}

// Encoding: append-style helpers that always pick msgpack's smallest form.

func appendArrayHeader(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n <= math.MaxUint16:
		return append(dst, 0xdc, byte(n>>8), byte(n))
	default:
		return append(dst, 0xdd, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
}

func appendUint(dst []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(dst, byte(v))
	case v <= math.MaxUint8:
		return append(dst, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return append(dst, 0xcd, byte(v>>8), byte(v))
	case v <= math.MaxUint32:
		return append(dst, 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	default:
		return binary.BigEndian.AppendUint64(append(dst, 0xcf), v)
	}
}

func appendStr(dst []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		dst = append(dst, 0xa0|byte(n))
	case n <= math.MaxUint8:
		dst = append(dst, 0xd9, byte(n))
	case n <= math.MaxUint16:
		dst = append(dst, 0xda, byte(n>>8), byte(n))
	default:
		dst = append(dst, 0xdb, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return append(dst, s...)
}

func appendNil(dst []byte) []byte { return append(dst, 0xc0) }
