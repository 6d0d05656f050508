package kvevents

import (
	"fmt"
	"math"
	"reflect"
	"testing"

	"github.com/kvrouter/kvrouter/internal/msgpack/msgpacktest"
)

// This file justifies internal/msgpack for our wire format (kvevents/vllm
// has the same benchmark for vLLM's). BenchmarkMsgpackDecode decodes the
// same batches into the same structures twice: with the hand-written
// BatchDecoder over msgpack.Reader and with the same decoding steps written
// on vmihailenco/msgpack's low-level Decoder (DecodeArrayLen, DecodeUint64,
// DecodeBytesLen + ReadFull, PeekCode, Skip), reusing one Decoder and every
// buffer so neither side pays for allocation it need not.
// TestMsgpackDecodersAgree checks that both give the same result on every
// benchmark input. The vmihailenco version is test code only: it leaves out
// some of the hand decoder's checks, which can only flatter it. Figures:
// docs/benchmarks/events.md.

// vmBatchDecoder is BatchDecoder's decode written on msgpacktest.VMReader.
type vmBatchDecoder struct {
	r      *msgpacktest.VMReader
	events []Event
	blocks []StoredBlock
	hashes []EngineHash
	names  map[string]string
}

func (d *vmBatchDecoder) Decode(data []byte, b *Batch) error {
	*b = Batch{}
	if d.r == nil {
		d.r, d.names = msgpacktest.NewVMReader(), make(map[string]string)
	}
	r := d.r
	r.Reset(data)
	n, err := r.ArrayLen()
	if err != nil {
		return err
	}
	ver, err := r.D.DecodeUint64()
	if err != nil || ver != WireVersion || n < minBatchArrayLen {
		return fmt.Errorf("%w: version %d (%v), %d fields", ErrMalformed, ver, err, n)
	}
	var out Batch
	if out.Model, err = d.name(); err != nil {
		return err
	}
	if out.Worker, err = d.name(); err != nil {
		return err
	}
	if out.Rank, err = r.D.DecodeUint32(); err != nil {
		return err
	}
	if out.Epoch, err = r.D.DecodeUint64(); err != nil {
		return err
	}
	if out.FirstEventID, err = r.D.DecodeUint64(); err != nil {
		return err
	}
	ne, err := r.ArrayLen()
	if err != nil {
		return err
	}
	if ne == 0 || ne > MaxBatchEvents || out.FirstEventID == 0 || out.FirstEventID > math.MaxUint64-uint64(ne) {
		return fmt.Errorf("%w: %d events from id %d", ErrMalformed, ne, out.FirstEventID)
	}
	events, blocks, hashes := d.events[:0], d.blocks[:0], d.hashes[:0]
	for i := 0; i < ne; i++ {
		var ev Event
		if ev, blocks, hashes, err = d.event(blocks, hashes); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		events = append(events, ev)
	}
	for i := minBatchArrayLen; i < n; i++ {
		if err := r.D.Skip(); err != nil {
			return err
		}
	}
	if r.Len() != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrMalformed, r.Len())
	}
	d.events, d.blocks, d.hashes = events, blocks, hashes
	out.Events = events
	*b = out
	return nil
}

func (d *vmBatchDecoder) name() (string, error) {
	p, err := d.r.Str()
	if err != nil {
		return "", err
	}
	if s, ok := d.names[string(p)]; ok {
		return s, nil
	}
	s := string(p)
	d.names[s] = s
	return s, nil
}

func (d *vmBatchDecoder) event(blocks []StoredBlock, hashes []EngineHash) (Event, []StoredBlock, []EngineHash, error) {
	r := d.r
	var ev Event
	n, err := r.ArrayLen()
	if err != nil || n < 1 {
		return ev, blocks, hashes, fmt.Errorf("%w: event array of %d (%v)", ErrMalformed, n, err)
	}
	kind, err := r.D.DecodeUint8()
	if err != nil {
		return ev, blocks, hashes, err
	}
	ev.Kind = EventKind(kind)
	used := 1
	switch ev.Kind {
	case KindStored:
		tier, err := r.D.DecodeUint8()
		if err != nil || n < minStoredArrayLen {
			return ev, blocks, hashes, fmt.Errorf("%w: stored event of %d (%v)", ErrMalformed, n, err)
		}
		ev.Tier = Tier(tier)
		if !r.NextIsNil() {
			p, err := r.D.DecodeUint64()
			if err != nil {
				return ev, blocks, hashes, err
			}
			ev.Parent, ev.HasParent = EngineHash(p), true
		}
		m, err := r.ArrayLen()
		if err != nil || m%2 != 0 || m/2 > MaxEventBlocks {
			return ev, blocks, hashes, fmt.Errorf("%w: block array of %d (%v)", ErrMalformed, m, err)
		}
		start := len(blocks)
		for j := 0; j < m/2; j++ {
			e, err := r.D.DecodeUint64()
			if err != nil {
				return ev, blocks, hashes, err
			}
			s, err := r.D.DecodeUint64()
			if err != nil {
				return ev, blocks, hashes, err
			}
			blocks = append(blocks, StoredBlock{Engine: EngineHash(e), Seq: SeqHash(s)})
		}
		ev.Blocks = blocks[start:len(blocks):len(blocks)]
		used = minStoredArrayLen
	case KindRemoved:
		tier, err := r.D.DecodeUint8()
		if err != nil || n < minRemovedArrayLn {
			return ev, blocks, hashes, fmt.Errorf("%w: removed event of %d (%v)", ErrMalformed, n, err)
		}
		ev.Tier = Tier(tier)
		m, err := r.ArrayLen()
		if err != nil || m > MaxEventBlocks {
			return ev, blocks, hashes, fmt.Errorf("%w: hash array of %d (%v)", ErrMalformed, m, err)
		}
		start := len(hashes)
		for j := 0; j < m; j++ {
			h, err := r.D.DecodeUint64()
			if err != nil {
				return ev, blocks, hashes, err
			}
			hashes = append(hashes, EngineHash(h))
		}
		ev.Removed = hashes[start:len(hashes):len(hashes)]
		used = minRemovedArrayLn
	}
	for ; used < n; used++ {
		if err := r.D.Skip(); err != nil {
			return ev, blocks, hashes, err
		}
	}
	return ev, blocks, hashes, nil
}

// msgpackBenchInputs are the batches both decoders are measured on: the
// 64x16 batch of BenchmarkBatchDecode and a 16x16 one.
func msgpackBenchInputs(t testing.TB) []msgpacktest.Input {
	var wire []msgpacktest.Input
	for _, sz := range [][2]int{{64, 16}, {16, 16}} {
		enc, err := AppendBatch(nil, benchBatch(sz[0], sz[1]))
		if err != nil {
			t.Fatal(err)
		}
		wire = append(wire, msgpacktest.Input{Name: fmt.Sprintf("wire_%dx%d", sz[0], sz[1]), Data: enc})
	}
	return wire
}

// TestMsgpackDecodersAgree: on every benchmark input the vmihailenco-based
// decoder produces what the hand-written one produces, so the benchmark
// compares equal work.
func TestMsgpackDecodersAgree(t *testing.T) {
	var hand BatchDecoder
	var vm vmBatchDecoder
	for _, in := range msgpackBenchInputs(t) {
		var a, b Batch
		if err := hand.Decode(in.Data, &a); err != nil {
			t.Fatalf("%s: hand: %v", in.Name, err)
		}
		if err := vm.Decode(in.Data, &b); err != nil {
			t.Fatalf("%s: vmihailenco: %v", in.Name, err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: decoders disagree:\n hand %+v\n vm   %+v", in.Name, a, b)
		}
	}
}

// BenchmarkMsgpackDecode: impl=hand is BatchDecoder on internal/msgpack
// (what production uses), impl=vmihailenco the same steps on
// vmihailenco/msgpack's low-level Decoder.
func BenchmarkMsgpackDecode(b *testing.B) {
	for _, in := range msgpackBenchInputs(b) {
		b.Run(in.Name+"/impl=hand", func(b *testing.B) {
			var d BatchDecoder
			var out Batch
			msgpacktest.BenchDecode(b, in.Data, func() error { return d.Decode(in.Data, &out) })
		})
		b.Run(in.Name+"/impl=vmihailenco", func(b *testing.B) {
			var d vmBatchDecoder
			var out Batch
			msgpacktest.BenchDecode(b, in.Data, func() error { return d.Decode(in.Data, &out) })
		})
	}
}
