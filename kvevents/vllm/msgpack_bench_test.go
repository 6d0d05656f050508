package vllm

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/kvrouter/kvrouter/internal/msgpack/msgpacktest"
	"github.com/kvrouter/kvrouter/kvevents"
)

// This file justifies internal/msgpack for vLLM's format (kvevents has the
// same benchmark for our wire format). BenchmarkMsgpackDecode decodes the
// same batches into the same structures twice: with DecodeBatch over
// msgpack.Reader and with the same decoding steps written on
// vmihailenco/msgpack's low-level Decoder (DecodeArrayLen, DecodeUint64,
// DecodeBytesLen + ReadFull, PeekCode, Skip), reusing one Decoder and every
// buffer so neither side pays for allocation it need not.
// TestMsgpackDecodersAgree checks that both give the same result on every
// benchmark input. The vmihailenco version is test code only: it leaves out
// some of the hand decoder's checks and the vLLM fields the inputs do not
// carry (locality, metadata, cache salts in extra_keys), which can only
// flatter it. Figures: docs/benchmarks/events.md.

// vmDecoder is DecodeBatch written on msgpacktest.VMReader, for the fields
// the benchmark inputs carry.
type vmDecoder struct {
	r      *msgpacktest.VMReader
	b      *Batch
	events []Event
	tokens []uint32
	hashes []kvevents.EngineHash
}

func (d *vmDecoder) Decode(data []byte, into *Batch) error {
	if d.r == nil {
		d.r = msgpacktest.NewVMReader()
	}
	d.r.Reset(data)
	into.TS, into.DPRank, into.HasDPRank = 0, 0, false
	d.b, d.events, d.tokens, d.hashes = into, into.Events[:0], into.tokens[:0], into.hashes[:0]
	into.Events = nil
	err := d.batch()
	into.tokens, into.hashes = d.tokens, d.hashes
	if err == nil && d.r.Len() != 0 {
		err = fmt.Errorf("%w: %d trailing bytes", kvevents.ErrMalformed, d.r.Len())
	}
	if err != nil {
		into.Events = d.events[:0]
		return err
	}
	into.Events = d.events
	return nil
}

func (d *vmDecoder) batch() error {
	r := d.r
	if r.PeekIsMap() {
		n, err := r.MapLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			key, err := r.Str()
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
				err = r.D.Skip()
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	n, err := r.ArrayLen()
	if err != nil || n < 2 {
		return fmt.Errorf("%w: batch array of %d (%v)", kvevents.ErrMalformed, n, err)
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
		if err := r.D.Skip(); err != nil {
			return err
		}
	}
	return nil
}

func (d *vmDecoder) ts() (err error) {
	if !d.r.NextIsNil() {
		d.b.TS, err = d.r.D.DecodeFloat64()
	}
	return err
}

func (d *vmDecoder) dpRank() (err error) {
	if !d.r.NextIsNil() {
		d.b.DPRank, err = d.r.D.DecodeInt64()
		d.b.HasDPRank = err == nil
	}
	return err
}

func (d *vmDecoder) eventList() error {
	n, err := d.r.ArrayLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		d.events = append(d.events, Event{})
		if err := d.event(&d.events[len(d.events)-1]); err != nil {
			return fmt.Errorf("vLLM event %d: %w", i, err)
		}
	}
	return nil
}

func (d *vmDecoder) event(ev *Event) error {
	r := d.r
	tokStart, hashStart := len(d.tokens), len(d.hashes)
	if r.PeekIsMap() {
		n, err := r.MapLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			key, err := r.Str()
			if err != nil {
				return err
			}
			if err := d.field(ev, mapField(key)); err != nil {
				return err
			}
		}
	} else {
		n, err := r.ArrayLen()
		if err != nil || n < 1 {
			return fmt.Errorf("%w: event array of %d (%v)", kvevents.ErrMalformed, n, err)
		}
		if err := d.field(ev, fTag); err != nil {
			return err
		}
		var order []int
		switch ev.Kind {
		case kvevents.KindStored:
			order = storedFields[:]
		case kvevents.KindRemoved:
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

func (d *vmDecoder) field(ev *Event, f int) error {
	r := d.r
	var err error
	switch f {
	case fTag:
		var tag []byte
		if tag, err = r.Str(); err != nil {
			return err
		}
		switch string(tag) {
		case "BlockStored":
			ev.Kind = kvevents.KindStored
		case "BlockRemoved":
			ev.Kind = kvevents.KindRemoved
		case "AllBlocksCleared":
			ev.Kind = kvevents.KindCleared
		}
	case fBlockHashes:
		var n int
		if n, err = r.ArrayLen(); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			h, err := r.D.DecodeUint64()
			if err != nil {
				return err
			}
			d.hashes = append(d.hashes, kvevents.EngineHash(h))
		}
	case fParent:
		if !r.NextIsNil() {
			var h uint64
			h, err = r.D.DecodeUint64()
			ev.Parent, ev.HasParent = kvevents.EngineHash(h), err == nil
		}
	case fTokenIDs:
		var n int
		if n, err = r.ArrayLen(); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			t, err := r.D.DecodeUint32()
			if err != nil {
				return err
			}
			d.tokens = append(d.tokens, t)
		}
	case fBlockSize:
		var v uint64
		if v, err = r.D.DecodeUint64(); err == nil && (v < 1 || v > maxBlockSize) {
			err = fmt.Errorf("%w: block_size %d", kvevents.ErrMalformed, v)
		}
		ev.BlockSize = int(v)
	case fLoraID:
		if !r.NextIsNil() {
			ev.LoraID, err = r.D.DecodeInt64()
			ev.HasLoraID = err == nil
		}
	case fMedium:
		ev.Medium, err = d.optString()
	case fLoraName:
		ev.LoraName, err = d.optString()
	case fSpecKind:
		ev.SpecKind, err = d.optString()
	case fExtraKeys:
		if !r.NextIsNil() {
			var n int
			if n, err = r.ArrayLen(); err != nil {
				return err
			}
			ev.HasExtraKeys, ev.ExtraKeyCount = true, n
			for i := 0; i < n && err == nil; i++ {
				err = r.D.Skip()
			}
		}
	case fGroupIdx:
		if !r.NextIsNil() {
			ev.GroupIdx, err = r.D.DecodeInt64()
			ev.HasGroupIdx = err == nil
		}
	case fSlidingWindow:
		if !r.NextIsNil() {
			ev.SlidingWindow, err = r.D.DecodeInt64()
			ev.HasSlidingWindow = err == nil
		}
	default:
		err = r.D.Skip()
	}
	return err
}

// optString reads a string or nil; the well-known values need no
// allocation, as with the hand decoder's intern table.
func (d *vmDecoder) optString() (string, error) {
	if d.r.NextIsNil() {
		return "", nil
	}
	s, err := d.r.Str()
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

// msgpackBenchInputs are the batches both decoders are measured on: the
// three test vectors, and one 16-block x 16-token BlockStored in the
// positional and the map form.
func msgpackBenchInputs(t testing.TB) []msgpacktest.Input {
	var vllm []msgpacktest.Input
	vecs := loadVLLMVectors(t)
	for _, name := range vllmVectorFiles {
		vllm = append(vllm, msgpacktest.Input{Name: "vllm_" + name[len("vllm_kvbatch_"):len("vllm_kvbatch_")+1], Data: vecs[name]})
	}
	return append(vllm, msgpacktest.Input{Name: "vllm_16x16_positional", Data: vllmStored16x16(t, false)},
		msgpacktest.Input{Name: "vllm_16x16_map", Data: vllmStored16x16(t, true)})
}

// TestMsgpackDecodersAgree: on every benchmark input the vmihailenco-based
// decoder produces what DecodeBatch produces, so the benchmark compares
// equal work.
func TestMsgpackDecodersAgree(t *testing.T) {
	var vmv vmDecoder
	for _, in := range msgpackBenchInputs(t) {
		var a, b Batch
		if err := DecodeBatch(in.Data, &a); err != nil {
			t.Fatalf("%s: hand: %v", in.Name, err)
		}
		if err := vmv.Decode(in.Data, &b); err != nil {
			t.Fatalf("%s: vmihailenco: %v", in.Name, err)
		}
		if a.TS != b.TS || a.DPRank != b.DPRank || a.HasDPRank != b.HasDPRank || !reflect.DeepEqual(a.Events, b.Events) {
			t.Fatalf("%s: decoders disagree:\n hand %+v\n vm   %+v", in.Name, a.Events, b.Events)
		}
	}
}

// BenchmarkMsgpackDecode: impl=hand is DecodeBatch on internal/msgpack
// (what production uses), impl=vmihailenco the same steps on
// vmihailenco/msgpack's low-level Decoder. Decoding only; conversion and
// hashing are the same code either way.
func BenchmarkMsgpackDecode(b *testing.B) {
	for _, in := range msgpackBenchInputs(b) {
		b.Run(in.Name+"/impl=hand", func(b *testing.B) {
			var vb Batch
			msgpacktest.BenchDecode(b, in.Data, func() error { return DecodeBatch(in.Data, &vb) })
		})
		b.Run(in.Name+"/impl=vmihailenco", func(b *testing.B) {
			var d vmDecoder
			var vb Batch
			msgpacktest.BenchDecode(b, in.Data, func() error { return d.Decode(in.Data, &vb) })
		})
	}
}
