// Package msgpacktest holds what BenchmarkMsgpackDecode in kvevents and in
// kvevents/vllm share: VMReader, the reader primitives over
// vmihailenco/msgpack's low-level Decoder that their baseline decoders are
// written on, and the benchmark loop. It is imported by tests only, so
// vmihailenco/msgpack stays out of every binary.
package msgpacktest

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	vm "github.com/vmihailenco/msgpack/v5"

	"github.com/kvrouter/kvrouter/internal/msgpack"
)

// VMReader is the primitives the baseline decoders need, over
// vmihailenco's Decoder, with the same bounds as msgpack.Reader's. D is the
// Decoder, for the steps that need no bound (DecodeUint64, Skip, ...).
type VMReader struct {
	D   *vm.Decoder
	br  bytes.Reader
	buf []byte // the last string read; valid until the next Str call
}

// NewVMReader returns a reader with one Decoder, reused by every Reset.
func NewVMReader() *VMReader {
	r := &VMReader{}
	r.D = vm.NewDecoder(&r.br)
	return r
}

// Reset points the reader at data; bytes.Reader is an io.ByteScanner, so
// the Decoder reads it directly, with no bufio layer.
func (r *VMReader) Reset(data []byte) {
	r.br.Reset(data)
	r.D.ResetReader(&r.br)
}

// Len returns how many bytes are left to read.
func (r *VMReader) Len() int { return r.br.Len() }

// ArrayLen reads an array header bounded by the bytes left, like
// msgpack.Reader's.
func (r *VMReader) ArrayLen() (int, error) {
	n, err := r.D.DecodeArrayLen()
	if err != nil {
		return 0, fmt.Errorf("%w: %v", msgpack.ErrMalformed, err)
	}
	if n < 0 || n > r.br.Len() {
		return 0, fmt.Errorf("%w: array of %d elements with %d bytes left", msgpack.ErrTruncated, n, r.br.Len())
	}
	return n, nil
}

// MapLen reads a map header bounded by the bytes left.
func (r *VMReader) MapLen() (int, error) {
	n, err := r.D.DecodeMapLen()
	if err != nil {
		return 0, fmt.Errorf("%w: %v", msgpack.ErrMalformed, err)
	}
	if n < 0 || 2*n > r.br.Len() {
		return 0, fmt.Errorf("%w: map of %d pairs with %d bytes left", msgpack.ErrTruncated, n, r.br.Len())
	}
	return n, nil
}

// Str reads a string into the reader's buffer, valid until the next call.
func (r *VMReader) Str() ([]byte, error) {
	n, err := r.D.DecodeBytesLen()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", msgpack.ErrMalformed, err)
	}
	if n < 0 || n > r.br.Len() {
		return nil, fmt.Errorf("%w: string of %d bytes with %d left", msgpack.ErrTruncated, n, r.br.Len())
	}
	r.buf = slices.Grow(r.buf[:0], n)[:n]
	return r.buf, r.D.ReadFull(r.buf)
}

// NextIsNil consumes a nil and reports true, or leaves the input as is.
func (r *VMReader) NextIsNil() bool {
	if c, err := r.D.PeekCode(); err == nil && c == 0xc0 {
		return r.D.DecodeNil() == nil
	}
	return false
}

// PeekIsMap reports whether a map comes next.
func (r *VMReader) PeekIsMap() bool {
	c, err := r.D.PeekCode()
	return err == nil && msgpack.IsMap(c)
}

// Input is one benchmark payload.
type Input struct {
	Name string
	Data []byte
}

// BenchDecode measures decode, which decodes data, after one warm-up call
// that fills the reused buffers.
func BenchDecode(b *testing.B, data []byte, decode func() error) {
	if err := decode(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if err := decode(); err != nil {
			b.Fatal(err)
		}
	}
}
