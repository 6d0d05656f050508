package msgpack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Decoding errors. Every Reader error wraps exactly one of these, so callers
// can count bad input by cause with errors.Is. kvevents re-exports them
// under the same names (kvevents.ErrTruncated is ErrTruncated), so code
// outside internal/ names them there.
var (
	// ErrTruncated: the input ends inside a value.
	ErrTruncated = errors.New("msgpack: truncated input")
	// ErrMalformed: the bytes are not the expected msgpack shape or a value
	// is out of range.
	ErrMalformed = errors.New("msgpack: malformed input")
	// ErrOversized: the input, or a count or string inside it, exceeds a
	// decoder limit.
	ErrOversized = errors.New("msgpack: oversized input")
)

// Reader reads msgpack values from a byte slice, front to back. Every
// method checks bounds first and reports ErrTruncated or ErrMalformed; none
// panics. The zero value reads nothing; a Reader is a value, so a decoder
// can embed one and decode without allocating.
type Reader struct {
	b   []byte
	off int
}

// NewReader returns a Reader at the start of b.
func NewReader(b []byte) Reader { return Reader{b: b} }

// Remaining returns how many bytes are left to read.
func (r *Reader) Remaining() int { return len(r.b) - r.off }

func (r *Reader) errTruncated(what string) error {
	return fmt.Errorf("%w: %s at byte %d of %d", ErrTruncated, what, r.off, len(r.b))
}

func (r *Reader) errType(want string, got byte) error {
	return fmt.Errorf("%w: want %s at byte %d, got type byte 0x%02x", ErrMalformed, want, r.off, got)
}

// Peek returns the next type byte without consuming it.
func (r *Reader) Peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, r.errTruncated("value")
	}
	return r.b[r.off], nil
}

// NextIsNil consumes a nil and reports true, or leaves the input as is.
func (r *Reader) NextIsNil() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

// need checks that n more bytes exist after the type byte at r.off.
func (r *Reader) need(n int, what string) error {
	if n > len(r.b)-r.off-1 {
		return r.errTruncated(what)
	}
	return nil
}

// length reads an n-byte big-endian length that follows the type byte.
func (r *Reader) length(n int, what string) (int, error) {
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

// ArrayLen reads an array header. The count is bounded by the bytes left
// (every element takes at least one byte), so a hostile count can never size
// an allocation beyond the input.
func (r *Reader) ArrayLen() (int, error) {
	c, err := r.Peek()
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
	if n > r.Remaining() {
		return 0, fmt.Errorf("%w: array of %d elements with %d bytes left", ErrTruncated, n, r.Remaining())
	}
	return n, nil
}

// MapLen reads a map header; the pair count is bounded like ArrayLen's.
func (r *Reader) MapLen() (int, error) {
	c, err := r.Peek()
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
	if 2*n > r.Remaining() {
		return 0, fmt.Errorf("%w: map of %d pairs with %d bytes left", ErrTruncated, n, r.Remaining())
	}
	return n, nil
}

// Integer reads any msgpack integer and returns its 64 bits with neg set
// for a negative signed value (v is then its two's complement).
func (r *Reader) Integer() (v uint64, neg bool, err error) {
	if r.off >= len(r.b) {
		return 0, false, r.errTruncated("integer")
	}
	c := r.b[r.off]
	if c <= 0x7f {
		r.off++
		return uint64(c), false, nil
	}
	if c == 0xcf && r.off+9 <= len(r.b) { // the form 64-bit hashes take
		v := binary.BigEndian.Uint64(r.b[r.off+1:])
		r.off += 9
		return v, false, nil
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

// Uint reads a non-negative integer.
func (r *Reader) Uint() (uint64, error) {
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
	v, neg, err := r.Integer()
	if err != nil {
		return 0, err
	}
	if neg {
		return 0, fmt.Errorf("%w: negative integer %d at byte %d", ErrMalformed, int64(v), start)
	}
	return v, nil
}

// Uint32 reads a non-negative integer that must fit in 32 bits.
func (r *Reader) Uint32() (uint32, error) {
	start := r.off
	v, err := r.Uint()
	if err != nil {
		return 0, err
	}
	if v > math.MaxUint32 {
		return 0, fmt.Errorf("%w: integer %d at byte %d exceeds uint32", ErrMalformed, v, start)
	}
	return uint32(v), nil
}

// Int64 reads a signed integer; an unsigned value above MaxInt64 is an error.
func (r *Reader) Int64() (int64, error) {
	start := r.off
	v, neg, err := r.Integer()
	if err != nil {
		return 0, err
	}
	if !neg && v > math.MaxInt64 {
		return 0, fmt.Errorf("%w: integer %d at byte %d exceeds int64", ErrMalformed, v, start)
	}
	return int64(v), nil
}

// AppendUint32Array reads an array of non-negative integers that fit in 32
// bits and appends them to dst. It sizes dst once for the whole array and
// reads the unsigned forms inline (token id lists are most of an engine's
// event bytes); anything else goes through Uint32. On error dst holds the
// elements read before the bad one.
func (r *Reader) AppendUint32Array(dst []uint32) ([]uint32, error) {
	n, err := r.ArrayLen()
	if err != nil {
		return dst, err
	}
	base := len(dst)
	dst = slices.Grow(dst, n)[:base+n]
	out := dst[base:]
	b, off := r.b, r.off
	for i := range out {
		if off < len(b) {
			switch c := b[off]; {
			case c <= 0x7f:
				out[i] = uint32(c)
				off++
				continue
			case c == 0xcc && off+2 <= len(b):
				out[i] = uint32(b[off+1])
				off += 2
				continue
			case c == 0xcd && off+3 <= len(b):
				out[i] = uint32(b[off+1])<<8 | uint32(b[off+2])
				off += 3
				continue
			case c == 0xce && off+5 <= len(b):
				out[i] = binary.BigEndian.Uint32(b[off+1:])
				off += 5
				continue
			}
		}
		r.off = off
		t, err := r.Uint32()
		if err != nil {
			return dst[:base+i], err
		}
		out[i] = t
		off = r.off
	}
	r.off = off
	return dst, nil
}

// Str reads a string and returns its bytes, aliasing the input.
func (r *Reader) Str() ([]byte, error) {
	c, err := r.Peek()
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

// Bin reads a byte string (bin8/16/32), aliasing the input.
func (r *Reader) Bin() ([]byte, error) {
	c, err := r.Peek()
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

func (r *Reader) take(n int, what string) ([]byte, error) {
	if n > r.Remaining() {
		return nil, fmt.Errorf("%w: %s of %d bytes with %d left", ErrTruncated, what, n, r.Remaining())
	}
	p := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return p, nil
}

// Float reads a float32/float64, or an integer as a float.
func (r *Reader) Float() (float64, error) {
	c, err := r.Peek()
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
	v, neg, err := r.Integer()
	if err != nil {
		return 0, err
	}
	if neg {
		return float64(int64(v)), nil
	}
	return float64(v), nil
}

// Skip consumes one complete value of any type. It walks nested containers
// iteratively with a counter of values still owed, so deep nesting costs no
// stack and a hostile count fails on the bounds check rather than looping.
func (r *Reader) Skip() error {
	owed := 1
	for owed > 0 {
		if owed > r.Remaining() {
			return fmt.Errorf("%w: %d values owed with %d bytes left", ErrTruncated, owed, r.Remaining())
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

// Raw consumes one complete value and returns its bytes, aliasing the input.
func (r *Reader) Raw() ([]byte, error) {
	start := r.off
	if err := r.Skip(); err != nil {
		return nil, err
	}
	return r.b[start:r.off:r.off], nil
}

func (r *Reader) skipFixed(n int) error {
	if err := r.need(n, "value"); err != nil {
		return err
	}
	r.off += 1 + n
	return nil
}

// skipSized skips a value with an n-byte length, extra fixed bytes after
// the length (the ext type), then length bytes of data.
func (r *Reader) skipSized(n, extra int) error {
	l, err := r.length(n, "length")
	if err != nil {
		return err
	}
	if extra+l > r.Remaining() {
		return fmt.Errorf("%w: value of %d bytes with %d left", ErrTruncated, extra+l, r.Remaining())
	}
	r.off += extra + l
	return nil
}

// Type-byte classes, for decoders that accept more than one shape.

// IsMap reports whether c starts a map (fixmap, map16, map32).
func IsMap(c byte) bool { return (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf }

// IsArray reports whether c starts an array (fixarray, array16, array32).
func IsArray(c byte) bool { return (c >= 0x90 && c <= 0x9f) || c == 0xdc || c == 0xdd }

// IsStr reports whether c starts a string (fixstr, str8, str16, str32).
func IsStr(c byte) bool { return (c >= 0xa0 && c <= 0xbf) || c == 0xd9 || c == 0xda || c == 0xdb }

// IsBin reports whether c starts a byte string (bin8, bin16, bin32).
func IsBin(c byte) bool { return c == 0xc4 || c == 0xc5 || c == 0xc6 }
