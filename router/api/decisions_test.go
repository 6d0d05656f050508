package api

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"slices"
	"testing"

	"github.com/kvrouter/kvrouter/workerref"
)

type testDecision struct {
	key    workerref.Target
	hashes []uint64
}

func encodeDecisions(replica string, ds []testDecision) []byte {
	buf := AppendDecisionHeader(nil, replica)
	for _, d := range ds {
		buf = AppendDecision(buf, d.key, d.hashes)
	}
	SetDecisionCount(buf, len(replica), len(ds))
	return buf
}

func TestDecisionRoundTrip(t *testing.T) {
	long := make([]uint64, MaxDecisionHashes+5)
	for i := range long {
		long[i] = uint64(i * 3)
	}
	tests := []struct {
		name string
		ds   []testDecision
		want []testDecision // nil = ds
	}{
		{"none", nil, nil},
		{"one", []testDecision{{workerref.Target{Worker: "w-1", Rank: 0}, []uint64{1, 2, 3}}}, nil},
		{"several", []testDecision{
			{workerref.Target{Worker: "w-1", Rank: 3}, []uint64{1 << 63, 2}},
			{workerref.Target{Worker: "ü", Rank: 1<<32 - 1}, []uint64{}},
			{workerref.Target{Worker: "w-1", Rank: 0}, []uint64{7}},
		}, nil},
		{"long prompt cut to the bound", []testDecision{{workerref.Target{Worker: "w"}, long}},
			[]testDecision{{workerref.Target{Worker: "w"}, long[:MaxDecisionHashes]}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			msg := encodeDecisions("rep-a", tc.ds)
			var b DecisionBatch[uint64]
			if err := DecodeDecisions(msg, &b); err != nil {
				t.Fatal(err)
			}
			want := tc.want
			if want == nil {
				want = tc.ds
			}
			if string(b.Replica) != "rep-a" || len(b.Decisions) != len(want) {
				t.Fatalf("replica %q, %d decisions; want rep-a, %d", b.Replica, len(b.Decisions), len(want))
			}
			for i, d := range b.Decisions {
				if d.Key != want[i].key || !slices.Equal(b.Hashes(d), want[i].hashes) {
					t.Fatalf("decision %d: %v %v, want %v %v", i, d.Key, b.Hashes(d), want[i].key, want[i].hashes)
				}
			}
		})
	}
}

// The example of docs/protocol.md.
func TestDecisionDocExample(t *testing.T) {
	msg := encodeDecisions("r1", []testDecision{{workerref.Target{Worker: "w0", Rank: 1}, []uint64{0x1122334455667788, 0x99}}})
	const want = "4b5652440100020072310100020077300100000002000000887766554433221199000000000000000"
	if got := hex.EncodeToString(msg); got != want[:len(want)-1] {
		t.Fatalf("hex %s, want %s", got, want[:len(want)-1])
	}
}

func TestDecodeDecisionsRejects(t *testing.T) {
	good := encodeDecisions("r1", []testDecision{{workerref.Target{Worker: "w0"}, []uint64{1, 2}}})
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	tests := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"bad magic", mut(func(b []byte) []byte { b[0] = 'X'; return b })},
		{"future version", mut(func(b []byte) []byte { b[4] = 2; return b })},
		{"empty replica id", mut(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[6:], 0); return b })},
		{"replica id past the end", mut(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[6:], 60000); return b })},
		{"too many decisions", mut(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[10:], MaxDecisionsPerMsg+1); return b })},
		{"count above content", mut(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[10:], 2); return b })},
		{"hash count above content", mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[20:], 3); return b })},
		{"hash count above bound", mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[20:], 1<<31); return b })},
		{"truncated", good[:len(good)-1]},
		{"trailing byte", append(bytes.Clone(good), 0)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b DecisionBatch[uint64]
			if err := DecodeDecisions(tc.data, &b); !errors.Is(err, ErrBadDecisions) {
				t.Fatalf("decode: %v, want ErrBadDecisions", err)
			}
		})
	}
}

func TestDecodeDecisionsZeroAlloc(t *testing.T) {
	hs := make([]uint64, 128)
	msg := encodeDecisions("r1", []testDecision{{workerref.Target{Worker: "w0"}, hs}, {workerref.Target{Worker: "w1"}, hs}})
	var b DecisionBatch[uint64]
	if err := DecodeDecisions(msg, &b); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _ = DecodeDecisions(msg, &b) }); n != 0 {
		t.Fatalf("%v allocations per decode, want 0", n)
	}
}

// FuzzDecodeDecisions: the decoder never panics, rejects with
// ErrBadDecisions, and what it accepts re-encodes to the same bytes.
func FuzzDecodeDecisions(f *testing.F) {
	f.Add(encodeDecisions("r1", []testDecision{{workerref.Target{Worker: "w0", Rank: 1}, []uint64{1, 2}}}))
	f.Add(encodeDecisions("replica-b", nil))
	f.Add([]byte("KVRD\x01\x00"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var b DecisionBatch[uint64]
		err := DecodeDecisions(data, &b)
		if err != nil {
			if !errors.Is(err, ErrBadDecisions) {
				t.Fatalf("error %v is not ErrBadDecisions", err)
			}
			return
		}
		var ds []testDecision
		for _, d := range b.Decisions {
			ds = append(ds, testDecision{d.Key, b.Hashes(d)})
		}
		again := encodeDecisions(string(b.Replica), ds)
		// The flags byte is reserved: the decoder ignores it.
		if len(data) > 5 {
			again[5] = data[5]
		}
		if !bytes.Equal(again, data) {
			t.Fatalf("re-encoded %x, want %x", again, data)
		}
	})
}
