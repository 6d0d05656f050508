package kvevents

import (
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func sampleBatch() *Batch {
	return &Batch{
		Model: "llama", Worker: "w1", Rank: 1, Epoch: 0x0123456789abcdef, FirstEventID: 42,
		Events: []Event{
			{Kind: KindStored, Tier: TierDevice, Blocks: []StoredBlock{{Engine: 0xf1e2d3c4b5a69788, Seq: 0x070bdbe0426ed786}}},
			{Kind: KindStored, Tier: TierHost, Parent: 0xf1e2d3c4b5a69788, HasParent: true,
				Blocks: []StoredBlock{{Engine: 0x0123456789abcdef, Seq: 0xc7084a6d8efef81c}, {Engine: 7, Seq: 8}}},
			{Kind: KindRemoved, Tier: TierDevice, Removed: []EngineHash{0x0123456789abcdef}},
			{Kind: KindCleared},
		},
	}
}

// goldenBatchHex is the encoding of sampleBatch, shown byte by byte in
// docs/protocol.md. It pins the layout: a change here is a
// wire-format change.
const goldenBatchHex = "97" + "01" + "a56c6c616d61" + "a27731" + "01" + "cf0123456789abcdef" + "2a" + "94" +
	"9401" + "00" + "c0" + "92" + "cff1e2d3c4b5a69788" + "cf070bdbe0426ed786" +
	"9401" + "01" + "cff1e2d3c4b5a69788" + "94" + "cf0123456789abcdef" + "cfc7084a6d8efef81c" + "07" + "08" +
	"9302" + "00" + "91" + "cf0123456789abcdef" +
	"9103"

// sampleSeqBatch is a sequence-keyed batch (wire version 2).
func sampleSeqBatch() *Batch {
	return &Batch{
		Model: "llama", Worker: "w1", Rank: 1, Epoch: 0x0123456789abcdef, FirstEventID: 42, SeqKeyed: true,
		Events: []Event{
			{Kind: KindStored, Tier: TierDevice, Blocks: []StoredBlock{{Seq: 0x070bdbe0426ed786}, {Seq: 8}}},
			{Kind: KindRemoved, Tier: TierHost, RemovedSeqs: []SeqHash{0xc7084a6d8efef81c}},
			{Kind: KindCleared},
		},
	}
}

// goldenSeqBatchHex is the encoding of sampleSeqBatch (docs/protocol.md).
const goldenSeqBatchHex = "97" + "02" + "a56c6c616d61" + "a27731" + "01" + "cf0123456789abcdef" + "2a" + "93" +
	"9301" + "00" + "92" + "cf070bdbe0426ed786" + "08" +
	"9302" + "01" + "91" + "cfc7084a6d8efef81c" +
	"9103"

func TestBatchGoldenEncoding(t *testing.T) {
	for _, tt := range []struct {
		name string
		b    *Batch
		want string
	}{
		{"engine-keyed", sampleBatch(), goldenBatchHex},
		{"sequence-keyed", sampleSeqBatch(), goldenSeqBatchHex},
	} {
		got, err := AppendBatch(nil, tt.b)
		if err != nil {
			t.Fatal(err)
		}
		if hex.EncodeToString(got) != tt.want {
			t.Fatalf("%s: encoding changed:\n got %x\nwant %s", tt.name, got, tt.want)
		}
		// The layout is plain msgpack: a generic decoder reads it too.
		var generic []any
		if err := msgpack.Unmarshal(got, &generic); err != nil || len(generic) != 7 {
			t.Fatalf("%s: generic msgpack decode: %v, %v", tt.name, generic, err)
		}
	}
}

func TestBatchRoundTrip(t *testing.T) {
	big := &Batch{Model: string(bytes.Repeat([]byte("m"), 300)), Worker: "w", Epoch: 1, FirstEventID: 1 << 40}
	for i := 0; i < 70; i++ {
		ev := Event{Kind: KindStored, Tier: TierDisk}
		for j := 0; j < i; j++ {
			ev.Blocks = append(ev.Blocks, StoredBlock{Engine: EngineHash(j * 1000003), Seq: SeqHash(^uint64(j))})
		}
		big.Events = append(big.Events, ev)
	}
	tests := []*Batch{
		sampleBatch(),
		sampleSeqBatch(),
		{Model: "", Worker: "", Epoch: 0, FirstEventID: 1, Events: []Event{{Kind: KindCleared}}},
		{Worker: "w", FirstEventID: 1, SeqKeyed: true, Events: []Event{{Kind: KindCleared}, {Kind: KindStored}, {Kind: KindRemoved, Tier: TierDisk}}},
		{Model: "m", Worker: "w", Rank: 1 << 31, Epoch: ^uint64(0), FirstEventID: ^uint64(0) - 1,
			Events: []Event{{Kind: KindRemoved, Tier: TierExternal, Removed: []EngineHash{0, 1, 127, 128, 255, 256, 65535, 65536, 1 << 32}}}},
		big,
	}
	var d BatchDecoder
	for i, in := range tests {
		enc, err := AppendBatch(nil, in)
		if err != nil {
			t.Fatalf("case %d: encode: %v", i, err)
		}
		var fresh, reused Batch
		if err := DecodeBatch(enc, &fresh); err != nil {
			t.Fatalf("case %d: DecodeBatch: %v", i, err)
		}
		if err := d.Decode(enc, &reused); err != nil {
			t.Fatalf("case %d: BatchDecoder: %v", i, err)
		}
		for _, got := range []*Batch{&fresh, &reused} {
			if !batchEqual(got, in) {
				t.Fatalf("case %d: round trip mismatch\n got %+v\nwant %+v", i, got, in)
			}
		}
	}
}

// batchEqual compares batches treating nil and empty slices alike.
func batchEqual(a, b *Batch) bool {
	if a.Model != b.Model || a.Worker != b.Worker || a.Rank != b.Rank || a.Epoch != b.Epoch ||
		a.FirstEventID != b.FirstEventID || a.SeqKeyed != b.SeqKeyed || len(a.Events) != len(b.Events) {
		return false
	}
	for i := range a.Events {
		x, y := a.Events[i], b.Events[i]
		if x.Kind != y.Kind || x.Tier != y.Tier || x.HasParent != y.HasParent || x.Parent != y.Parent ||
			len(x.Blocks) != len(y.Blocks) || len(x.Removed) != len(y.Removed) || len(x.RemovedSeqs) != len(y.RemovedSeqs) {
			return false
		}
		if len(x.RemovedSeqs) > 0 && !reflect.DeepEqual(x.RemovedSeqs, y.RemovedSeqs) {
			return false
		}
		if len(x.Blocks) > 0 && !reflect.DeepEqual(x.Blocks, y.Blocks) {
			return false
		}
		if len(x.Removed) > 0 && !reflect.DeepEqual(x.Removed, y.Removed) {
			return false
		}
	}
	return true
}

func TestAppendBatchRejects(t *testing.T) {
	tests := map[string]*Batch{
		"no events":    {Worker: "w", FirstEventID: 1},
		"first id 0":   {Worker: "w", Events: []Event{{Kind: KindCleared}}},
		"bad kind":     {Worker: "w", FirstEventID: 1, Events: []Event{{Kind: 9}}},
		"ids overflow": {Worker: "w", FirstEventID: ^uint64(0), Events: []Event{{Kind: KindCleared}}},
		"long name":    {Worker: string(make([]byte, MaxNameBytes+1)), FirstEventID: 1, Events: []Event{{Kind: KindCleared}}},
		"seq removals in an engine-keyed batch": {Worker: "w", FirstEventID: 1,
			Events: []Event{{Kind: KindRemoved, RemovedSeqs: []SeqHash{1}}}},
		"engine removals in a sequence-keyed batch": {Worker: "w", FirstEventID: 1, SeqKeyed: true,
			Events: []Event{{Kind: KindRemoved, Removed: []EngineHash{1}}}},
		"engine hash in a sequence-keyed batch": {Worker: "w", FirstEventID: 1, SeqKeyed: true,
			Events: []Event{{Kind: KindStored, Blocks: []StoredBlock{{Engine: 1, Seq: 2}}}}},
		"parent in a sequence-keyed batch": {Worker: "w", FirstEventID: 1, SeqKeyed: true,
			Events: []Event{{Kind: KindStored, HasParent: true, Blocks: []StoredBlock{{Seq: 2}}}}},
	}
	for name, b := range tests {
		if _, err := AppendBatch(nil, b); !errors.Is(err, ErrInvalidBatch) {
			t.Errorf("%s: error %v, want ErrInvalidBatch", name, err)
		}
	}
}

func TestDecodeBatchTruncated(t *testing.T) {
	for _, in := range []*Batch{sampleBatch(), sampleSeqBatch()} {
		enc, _ := AppendBatch(nil, in)
		for n := 0; n < len(enc); n++ {
			var b Batch
			err := DecodeBatch(enc[:n], &b)
			if err == nil {
				t.Fatalf("prefix of %d/%d bytes decoded without error", n, len(enc))
			}
			if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrMalformed) {
				t.Fatalf("prefix %d: error %v is neither ErrTruncated nor ErrMalformed", n, err)
			}
		}
	}
}

func TestDecodeBatchRejects(t *testing.T) {
	h := func(s string) []byte {
		b, err := hex.DecodeString(s)
		if err != nil {
			panic(err)
		}
		return b
	}
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"not an array", h("a3616263"), ErrMalformed},
		{"version 3", h("9703a0a0000001919103"), ErrUnsupportedVersion},
		{"version 0", h("9700a0a0000001919103"), ErrUnsupportedVersion},
		{"short sequence-keyed stored", h("9702a0a0000001919201" + "00"), ErrMalformed},
		{"sequence-keyed stored with a parent", h("9702a0a000000191940100c0" + "90"), ErrMalformed},
		{"sequence-keyed removal of a string", h("9702a0a0000001919302" + "0091a161"), ErrMalformed},
		{"short batch array", h("9601a0a0000001"), ErrMalformed},
		{"no events", h("9701a0a000000190"), ErrMalformed},
		{"first id 0", h("9701a0a0000000919103"), ErrMalformed},
		{"ids overflow", h("9701a0a00000cfffffffffffffffff929103" + "9103"), ErrMalformed},
		{"rank over uint32", h("9701a0a0cf0000000100000000000001919103"), ErrMalformed},
		{"negative epoch", h("9701a0a000ff01919103"), ErrMalformed},
		{"huge array count", h("9701a0a0000001ddffffffff"), ErrOversized},
		{"array count past end", h("9701a0a0000001dd00010000" + "9103"), ErrTruncated},
		{"long model name", append(append(h("9701da0401"), bytes.Repeat([]byte("a"), 1025)...), h("a0000001919103")...), ErrOversized},
		{"string past end", h("9701a5616263"), ErrTruncated},
		{"trailing bytes", append(h("9701a0a0000001919103"), 0), ErrMalformed},
		{"odd block array", h("9701a0a0000001919401" + "00c091" + "01"), ErrMalformed},
		{"short stored", h("9701a0a000000191930100c0"), ErrMalformed},
		{"tier 256", h("9701a0a00000019193" + "02cd010090"), ErrMalformed},
		{"bad type byte", h("9701a0a0000001919401" + "00c190"), ErrMalformed},
		{"oversized", make([]byte, MaxBatchBytes+1), ErrOversized},
	}
	for _, tt := range tests {
		var b Batch
		err := DecodeBatch(tt.in, &b)
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: error %v, want %v", tt.name, err, tt.want)
		}
		if b.Events != nil {
			t.Errorf("%s: batch not zeroed on error", tt.name)
		}
	}
}

func TestDecodeBatchForwardCompatible(t *testing.T) {
	// A version-1 batch from a later revision: an extra batch field, an
	// extra stored-event field, and an event kind this decoder does not know.
	in := "98" + "01" + "a16d" + "a177" + "00" + "05" + "01" + "93" +
		"95" + "01" + "00" + "c0" + "92" + "0102" + "a5" + "6c61746572" +
		"92" + "07" + "81a178c3" +
		"9103" +
		"c3"
	data, _ := hex.DecodeString(in)
	var b Batch
	if err := DecodeBatch(data, &b); err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 3 || b.Events[0].Blocks[0] != (StoredBlock{1, 2}) || b.Events[1].Kind != 7 || b.Events[2].Kind != KindCleared {
		t.Fatalf("got %+v", b)
	}
}

func TestBatchDecoderZeroAlloc(t *testing.T) {
	enc, _ := AppendBatch(nil, sampleBatch())
	var d BatchDecoder
	var b Batch
	if err := d.Decode(enc, &b); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if err := d.Decode(enc, &b); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("BatchDecoder.Decode allocated %.1f times per run", allocs)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	enc, _ := AppendBatch(nil, sampleBatch())
	f.Add(enc)
	enc, _ = AppendBatch(nil, sampleSeqBatch())
	f.Add(enc)
	f.Add([]byte{})
	if b, err := hex.DecodeString("9701a0a0000001919103"); err == nil {
		f.Add(b)
	}
	// vLLM's test vectors (kvevents/vllm's testdata): msgpack of another
	// layout, which must fail cleanly.
	vecs, err := filepath.Glob(filepath.Join("vllm", "testdata", "vllm", "*.bin"))
	if err != nil || len(vecs) == 0 {
		f.Fatalf("vLLM vectors in vllm/testdata/vllm: %d files, %v", len(vecs), err)
	}
	for _, name := range vecs {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatalf("read vLLM vector: %v", err)
		}
		f.Add(b)
	}
	var d BatchDecoder
	f.Fuzz(func(t *testing.T, data []byte) {
		var a, b Batch
		errA := DecodeBatch(data, &a)
		errB := d.Decode(data, &b)
		if (errA == nil) != (errB == nil) {
			t.Fatalf("DecodeBatch err %v, BatchDecoder err %v", errA, errB)
		}
		if errA != nil {
			if !errors.Is(errA, ErrTruncated) && !errors.Is(errA, ErrMalformed) &&
				!errors.Is(errA, ErrOversized) && !errors.Is(errA, ErrUnsupportedVersion) {
				t.Fatalf("untyped error %v", errA)
			}
			return
		}
		if !batchEqual(&a, &b) {
			t.Fatal("decoders disagree")
		}
		// A decoded batch with known kinds re-encodes and decodes the same.
		for _, ev := range a.Events {
			if ev.Kind < KindStored || ev.Kind > KindCleared {
				return
			}
		}
		re, err := AppendBatch(nil, &a)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		var c Batch
		if err := DecodeBatch(re, &c); err != nil || !batchEqual(&a, &c) {
			t.Fatalf("re-decode: %v", err)
		}
	})
}

func BenchmarkBatchEncode(b *testing.B) {
	batch := benchBatch(64, 16)
	buf := make([]byte, 0, 64<<10)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = AppendBatch(buf[:0], batch); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
	b.ReportMetric(float64(64*16)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
}

func BenchmarkBatchDecode(b *testing.B) {
	batch := benchBatch(64, 16)
	enc, _ := AppendBatch(nil, batch)
	var d BatchDecoder
	var out Batch
	b.ReportAllocs()
	b.SetBytes(int64(len(enc)))
	for b.Loop() {
		if err := d.Decode(enc, &out); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(64*16)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
}

// benchBatch is a batch of events stored events of blocks blocks each.
func benchBatch(events, blocks int) *Batch {
	b := &Batch{Model: "llama-3.1-8b", Worker: "worker-0001", Epoch: 0x9e3779b97f4a7c15, FirstEventID: 1}
	h := uint64(0x9e3779b97f4a7c15)
	for i := 0; i < events; i++ {
		ev := Event{Kind: KindStored, Parent: EngineHash(h), HasParent: i > 0}
		for j := 0; j < blocks; j++ {
			h = h*6364136223846793005 + 1442695040888963407
			ev.Blocks = append(ev.Blocks, StoredBlock{Engine: EngineHash(h), Seq: SeqHash(h ^ 0xabcdef)})
		}
		b.Events = append(b.Events, ev)
	}
	return b
}

func TestMsgID(t *testing.T) {
	if got := MsgID("llama.3", "w1", 1, 0x0123456789abcdef, 42); got != "llama%2E3.w1.1.81985529216486895.42" {
		t.Fatalf("MsgID = %q", got)
	}
	// Everything that scopes an event id is in the id.
	ids := map[string]bool{}
	for _, id := range []string{
		MsgID("m", "w", 0, 1, 1), MsgID("m", "w", 1, 1, 1), MsgID("m", "v", 0, 1, 1),
		MsgID("n", "w", 0, 1, 1), MsgID("m", "w", 0, 2, 1), MsgID("m", "w", 0, 1, 2),
		MsgID("m.w", "", 0, 1, 1), MsgID("m", "w.", 0, 1, 1),
	} {
		if ids[id] {
			t.Fatalf("MsgID %q produced twice", id)
		}
		ids[id] = true
	}
}
