package kvevents

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// This file justifies msgpack.go. BenchmarkMsgpackDecode decodes the same
// batches into the same structures twice: with the hand-written decoders
// (BatchDecoder, DecodeVLLMBatch over mpReader) and with the same decoding
// steps written on vmihailenco/msgpack's low-level Decoder (DecodeArrayLen,
// DecodeUint64, DecodeBytesLen + ReadFull, PeekCode, Skip), reusing one
// Decoder and every buffer so neither side pays for allocation it need not.
// TestMsgpackDecodersAgree checks that both give the same result on every
// benchmark input. The vmihailenco versions are test code only: they leave
// out some of the hand decoders' checks and the vLLM fields the inputs do
// not carry (locality, metadata, cache salts in extra_keys), which can only
// flatter them. Figures: docs/benchmarks/events.md.

// vmReader is the primitives the decoders need, over vmihailenco's Decoder.
type vmReader struct {
	br  bytes.Reader
	d   *msgpack.Decoder
	buf []byte // the last string read; valid until the next str call
}

func newVMReader() *vmReader {
	r := &vmReader{}
	r.d = msgpack.NewDecoder(&r.br)
	return r
}

// reset points the reader at data; bytes.Reader is an io.ByteScanner, so
// the Decoder reads it directly, with no bufio layer.
func (r *vmReader) reset(data []byte) {
	r.br.Reset(data)
	r.d.ResetReader(&r.br)
}

// arrayLen reads an array header bounded by the bytes left, like mpReader's.
func (r *vmReader) arrayLen() (int, error) {
	n, err := r.d.DecodeArrayLen()
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if n < 0 || n > r.br.Len() {
		return 0, fmt.Errorf("%w: array of %d elements with %d bytes left", ErrTruncated, n, r.br.Len())
	}
	return n, nil
}

func (r *vmReader) mapLen() (int, error) {
	n, err := r.d.DecodeMapLen()
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if n < 0 || 2*n > r.br.Len() {
		return 0, fmt.Errorf("%w: map of %d pairs with %d bytes left", ErrTruncated, n, r.br.Len())
	}
	return n, nil
}

func (r *vmReader) str() ([]byte, error) {
	n, err := r.d.DecodeBytesLen()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if n < 0 || n > r.br.Len() {
		return nil, fmt.Errorf("%w: string of %d bytes with %d left", ErrTruncated, n, r.br.Len())
	}
	r.buf = slices.Grow(r.buf[:0], n)[:n]
	return r.buf, r.d.ReadFull(r.buf)
}

func (r *vmReader) nextIsNil() bool {
	if c, err := r.d.PeekCode(); err == nil && c == 0xc0 {
		return r.d.DecodeNil() == nil
	}
	return false
}

func (r *vmReader) peekIsMap() bool {
	c, err := r.d.PeekCode()
	return err == nil && isMap(c)
}

// vmBatchDecoder is BatchDecoder's decode written on vmReader.
type vmBatchDecoder struct {
	r      *vmReader
	events []Event
	blocks []StoredBlock
	hashes []EngineHash
	names  map[string]string
}

func (d *vmBatchDecoder) Decode(data []byte, b *Batch) error {
	*b = Batch{}
	if d.r == nil {
		d.r, d.names = newVMReader(), make(map[string]string)
	}
	r := d.r
	r.reset(data)
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	ver, err := r.d.DecodeUint64()
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
	if out.Rank, err = r.d.DecodeUint32(); err != nil {
		return err
	}
	if out.Epoch, err = r.d.DecodeUint64(); err != nil {
		return err
	}
	if out.FirstEventID, err = r.d.DecodeUint64(); err != nil {
		return err
	}
	ne, err := r.arrayLen()
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
		if err := r.d.Skip(); err != nil {
			return err
		}
	}
	if r.br.Len() != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrMalformed, r.br.Len())
	}
	d.events, d.blocks, d.hashes = events, blocks, hashes
	out.Events = events
	*b = out
	return nil
}

func (d *vmBatchDecoder) name() (string, error) {
	p, err := d.r.str()
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
	n, err := r.arrayLen()
	if err != nil || n < 1 {
		return ev, blocks, hashes, fmt.Errorf("%w: event array of %d (%v)", ErrMalformed, n, err)
	}
	kind, err := r.d.DecodeUint8()
	if err != nil {
		return ev, blocks, hashes, err
	}
	ev.Kind = EventKind(kind)
	used := 1
	switch ev.Kind {
	case KindStored:
		tier, err := r.d.DecodeUint8()
		if err != nil || n < minStoredArrayLen {
			return ev, blocks, hashes, fmt.Errorf("%w: stored event of %d (%v)", ErrMalformed, n, err)
		}
		ev.Tier = Tier(tier)
		if !r.nextIsNil() {
			p, err := r.d.DecodeUint64()
			if err != nil {
				return ev, blocks, hashes, err
			}
			ev.Parent, ev.HasParent = EngineHash(p), true
		}
		m, err := r.arrayLen()
		if err != nil || m%2 != 0 || m/2 > MaxEventBlocks {
			return ev, blocks, hashes, fmt.Errorf("%w: block array of %d (%v)", ErrMalformed, m, err)
		}
		start := len(blocks)
		for j := 0; j < m/2; j++ {
			e, err := r.d.DecodeUint64()
			if err != nil {
				return ev, blocks, hashes, err
			}
			s, err := r.d.DecodeUint64()
			if err != nil {
				return ev, blocks, hashes, err
			}
			blocks = append(blocks, StoredBlock{Engine: EngineHash(e), Seq: SeqHash(s)})
		}
		ev.Blocks = blocks[start:len(blocks):len(blocks)]
		used = minStoredArrayLen
	case KindRemoved:
		tier, err := r.d.DecodeUint8()
		if err != nil || n < minRemovedArrayLn {
			return ev, blocks, hashes, fmt.Errorf("%w: removed event of %d (%v)", ErrMalformed, n, err)
		}
		ev.Tier = Tier(tier)
		m, err := r.arrayLen()
		if err != nil || m > MaxEventBlocks {
			return ev, blocks, hashes, fmt.Errorf("%w: hash array of %d (%v)", ErrMalformed, m, err)
		}
		start := len(hashes)
		for j := 0; j < m; j++ {
			h, err := r.d.DecodeUint64()
			if err != nil {
				return ev, blocks, hashes, err
			}
			hashes = append(hashes, EngineHash(h))
		}
		ev.Removed = hashes[start:len(hashes):len(hashes)]
		used = minRemovedArrayLn
	}
	for ; used < n; used++ {
		if err := r.d.Skip(); err != nil {
			return ev, blocks, hashes, err
		}
	}
	return ev, blocks, hashes, nil
}

// vmVLLMDecoder is DecodeVLLMBatch written on vmReader, for the fields the
// benchmark inputs carry.
type vmVLLMDecoder struct {
	r      *vmReader
	b      *VLLMBatch
	events []VLLMEvent
	tokens []uint32
	hashes []EngineHash
}

func (d *vmVLLMDecoder) Decode(data []byte, into *VLLMBatch) error {
	if d.r == nil {
		d.r = newVMReader()
	}
	d.r.reset(data)
	into.TS, into.DPRank, into.HasDPRank = 0, 0, false
	d.b, d.events, d.tokens, d.hashes = into, into.Events[:0], into.tokens[:0], into.hashes[:0]
	into.Events = nil
	err := d.batch()
	into.tokens, into.hashes = d.tokens, d.hashes
	if err == nil && d.r.br.Len() != 0 {
		err = fmt.Errorf("%w: %d trailing bytes", ErrMalformed, d.r.br.Len())
	}
	if err != nil {
		into.Events = d.events[:0]
		return err
	}
	into.Events = d.events
	return nil
}

func (d *vmVLLMDecoder) batch() error {
	r := d.r
	if r.peekIsMap() {
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			key, err := r.str()
			if err != nil {
				return err
			}
			switch string(key) {
			case "ts":
				err = d.ts()
			case "events":
				err = d.eventList()
			case "data_parallel_rank", "attn_dp_rank":
				err = d.dpRank()
			default:
				err = r.d.Skip()
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	n, err := r.arrayLen()
	if err != nil || n < 2 {
		return fmt.Errorf("%w: batch array of %d (%v)", ErrMalformed, n, err)
	}
	if err := d.ts(); err != nil {
		return err
	}
	if err := d.eventList(); err != nil {
		return err
	}
	if n >= 3 {
		if err := d.dpRank(); err != nil {
			return err
		}
	}
	for i := 3; i < n; i++ {
		if err := r.d.Skip(); err != nil {
			return err
		}
	}
	return nil
}

func (d *vmVLLMDecoder) ts() (err error) {
	if !d.r.nextIsNil() {
		d.b.TS, err = d.r.d.DecodeFloat64()
	}
	return err
}

func (d *vmVLLMDecoder) dpRank() (err error) {
	if !d.r.nextIsNil() {
		d.b.DPRank, err = d.r.d.DecodeInt64()
		d.b.HasDPRank = err == nil
	}
	return err
}

func (d *vmVLLMDecoder) eventList() error {
	n, err := d.r.arrayLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		d.events = append(d.events, VLLMEvent{})
		if err := d.event(&d.events[len(d.events)-1]); err != nil {
			return fmt.Errorf("vLLM event %d: %w", i, err)
		}
	}
	return nil
}

func (d *vmVLLMDecoder) event(ev *VLLMEvent) error {
	r := d.r
	tokStart, hashStart := len(d.tokens), len(d.hashes)
	if r.peekIsMap() {
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			key, err := r.str()
			if err != nil {
				return err
			}
			if err := d.field(ev, mapField(key)); err != nil {
				return err
			}
		}
	} else {
		n, err := r.arrayLen()
		if err != nil || n < 1 {
			return fmt.Errorf("%w: event array of %d (%v)", ErrMalformed, n, err)
		}
		if err := d.field(ev, fTag); err != nil {
			return err
		}
		var order []int
		switch ev.Kind {
		case KindStored:
			order = storedFields[:]
		case KindRemoved:
			order = removedFields[:]
		}
		for i := 1; i < n; i++ {
			f := fUnknown
			if i < len(order) {
				f = order[i]
			}
			if err := d.field(ev, f); err != nil {
				return err
			}
		}
	}
	ev.Tier = mediumTier(ev.Medium)
	if len(d.hashes) > hashStart {
		ev.BlockHashes = d.hashes[hashStart:len(d.hashes):len(d.hashes)]
	}
	if len(d.tokens) > tokStart {
		ev.TokenIDs = d.tokens[tokStart:len(d.tokens):len(d.tokens)]
	}
	return nil
}

func (d *vmVLLMDecoder) field(ev *VLLMEvent, f int) error {
	r := d.r
	var err error
	switch f {
	case fTag:
		var tag []byte
		if tag, err = r.str(); err != nil {
			return err
		}
		switch string(tag) {
		case "BlockStored":
			ev.Kind = KindStored
		case "BlockRemoved":
			ev.Kind = KindRemoved
		case "AllBlocksCleared":
			ev.Kind = KindCleared
		}
	case fBlockHashes:
		var n int
		if n, err = r.arrayLen(); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			h, err := r.d.DecodeUint64()
			if err != nil {
				return err
			}
			d.hashes = append(d.hashes, EngineHash(h))
		}
	case fParent:
		if !r.nextIsNil() {
			var h uint64
			h, err = r.d.DecodeUint64()
			ev.Parent, ev.HasParent = EngineHash(h), err == nil
		}
	case fTokenIDs:
		var n int
		if n, err = r.arrayLen(); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			t, err := r.d.DecodeUint32()
			if err != nil {
				return err
			}
			d.tokens = append(d.tokens, t)
		}
	case fBlockSize:
		var v uint64
		if v, err = r.d.DecodeUint64(); err == nil && (v < 1 || v > maxVLLMBlockSize) {
			err = fmt.Errorf("%w: block_size %d", ErrMalformed, v)
		}
		ev.BlockSize = int(v)
	case fLoraID:
		if !r.nextIsNil() {
			ev.LoraID, err = r.d.DecodeInt64()
			ev.HasLoraID = err == nil
		}
	case fMedium:
		ev.Medium, err = d.optString()
	case fLoraName:
		ev.LoraName, err = d.optString()
	case fSpecKind:
		ev.SpecKind, err = d.optString()
	case fExtraKeys:
		if !r.nextIsNil() {
			var n int
			if n, err = r.arrayLen(); err != nil {
				return err
			}
			ev.HasExtraKeys, ev.ExtraKeyCount = true, n
			for i := 0; i < n && err == nil; i++ {
				err = r.d.Skip()
			}
		}
	case fGroupIdx:
		if !r.nextIsNil() {
			ev.GroupIdx, err = r.d.DecodeInt64()
			ev.HasGroupIdx = err == nil
		}
	case fSlidingWindow:
		if !r.nextIsNil() {
			ev.SlidingWindow, err = r.d.DecodeInt64()
			ev.HasSlidingWindow = err == nil
		}
	default:
		err = r.d.Skip()
	}
	return err
}

// optString reads a string or nil; the well-known values need no
// allocation, as with the hand decoder's intern table.
func (d *vmVLLMDecoder) optString() (string, error) {
	if d.r.nextIsNil() {
		return "", nil
	}
	s, err := d.r.str()
	if err != nil {
		return "", err
	}
	switch string(s) {
	case "GPU":
		return "GPU", nil
	case "full_attention":
		return "full_attention", nil
	}
	return string(s), nil
}

// namedInput is one benchmark payload.
type namedInput struct {
	name string
	data []byte
}

// msgpackBenchInputs are the batches both decoders are measured on: our
// wire format (the 64x16 batch of BenchmarkBatchDecode and a 16x16 one) and
// vLLM's (the three test vectors, and one 16-block x 16-token BlockStored in
// the positional and the map form).
func msgpackBenchInputs(t testing.TB) (wire, vllm []namedInput) {
	for _, sz := range [][2]int{{64, 16}, {16, 16}} {
		enc, err := AppendBatch(nil, benchBatch(sz[0], sz[1]))
		if err != nil {
			t.Fatal(err)
		}
		wire = append(wire, namedInput{fmt.Sprintf("wire_%dx%d", sz[0], sz[1]), enc})
	}
	vecs := loadVLLMVectors(t)
	for _, name := range vllmVectorFiles {
		vllm = append(vllm, namedInput{"vllm_" + name[len("vllm_kvbatch_"):len("vllm_kvbatch_")+1], vecs[name]})
	}
	vllm = append(vllm, namedInput{"vllm_16x16_positional", vllmStored16x16(t, false)},
		namedInput{"vllm_16x16_map", vllmStored16x16(t, true)})
	return wire, vllm
}

// TestMsgpackDecodersAgree: on every benchmark input the vmihailenco-based
// decoders produce what the hand-written ones produce, so the benchmark
// compares equal work.
func TestMsgpackDecodersAgree(t *testing.T) {
	wire, vllm := msgpackBenchInputs(t)
	var hand BatchDecoder
	var vm vmBatchDecoder
	for _, in := range wire {
		var a, b Batch
		if err := hand.Decode(in.data, &a); err != nil {
			t.Fatalf("%s: hand: %v", in.name, err)
		}
		if err := vm.Decode(in.data, &b); err != nil {
			t.Fatalf("%s: vmihailenco: %v", in.name, err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: decoders disagree:\n hand %+v\n vm   %+v", in.name, a, b)
		}
	}
	var vmv vmVLLMDecoder
	for _, in := range vllm {
		var a, b VLLMBatch
		if err := DecodeVLLMBatch(in.data, &a); err != nil {
			t.Fatalf("%s: hand: %v", in.name, err)
		}
		if err := vmv.Decode(in.data, &b); err != nil {
			t.Fatalf("%s: vmihailenco: %v", in.name, err)
		}
		if a.TS != b.TS || a.DPRank != b.DPRank || a.HasDPRank != b.HasDPRank || !reflect.DeepEqual(a.Events, b.Events) {
			t.Fatalf("%s: decoders disagree:\n hand %+v\n vm   %+v", in.name, a.Events, b.Events)
		}
	}
}

// BenchmarkMsgpackDecode: impl=hand is msgpack.go's decoders (what
// production uses), impl=vmihailenco the same steps on vmihailenco/msgpack's
// low-level Decoder. Decoding only; conversion and hashing are the same
// code either way.
func BenchmarkMsgpackDecode(b *testing.B) {
	wire, vllm := msgpackBenchInputs(b)
	for _, in := range wire {
		b.Run(in.name+"/impl=hand", func(b *testing.B) {
			var d BatchDecoder
			var out Batch
			benchDecode(b, in.data, func() error { return d.Decode(in.data, &out) })
		})
		b.Run(in.name+"/impl=vmihailenco", func(b *testing.B) {
			var d vmBatchDecoder
			var out Batch
			benchDecode(b, in.data, func() error { return d.Decode(in.data, &out) })
		})
	}
	for _, in := range vllm {
		b.Run(in.name+"/impl=hand", func(b *testing.B) {
			var vb VLLMBatch
			benchDecode(b, in.data, func() error { return DecodeVLLMBatch(in.data, &vb) })
		})
		b.Run(in.name+"/impl=vmihailenco", func(b *testing.B) {
			var d vmVLLMDecoder
			var vb VLLMBatch
			benchDecode(b, in.data, func() error { return d.Decode(in.data, &vb) })
		})
	}
}

func benchDecode(b *testing.B, data []byte, decode func() error) {
	if err := decode(); err != nil { // warm the reused buffers
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
