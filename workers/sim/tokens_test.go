package sim

import (
	"slices"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
)

func TestExpandBlockIDs(t *testing.T) {
	// Pinned values (checked against an independent implementation of the
	// documented splitmix64 formula): changing them silently would break
	// every client that computes the same tokens.
	golden := []uint32{
		920347954, 935679830, 1255487920, 848559865, // id 0
		778240675, 553446172, 407116208, 59518880, // id 1
		1697413359, 536104526, 366349098, 1570524036, // id 12345
	}
	tests := []struct {
		name        string
		ids         []uint64
		blockTokens int
		inputLength int
		want        []uint32
	}{
		{"full blocks", []uint64{0, 1, 12345}, 4, 0, golden},
		{"input length equals full", []uint64{0, 1, 12345}, 4, 12, golden},
		{"partial last block", []uint64{0, 1, 12345}, 4, 10, golden[:10]},
		{"input longer than blocks is cut to blocks", []uint64{0, 1}, 4, 100, golden[:8]},
		{"no ids", nil, 4, 10, []uint32{}},
	}
	for _, tt := range tests {
		got := ExpandBlockIDs(nil, tt.ids, tt.blockTokens, tt.inputLength)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
	// Default block size is Mooncake's 512; a token depends only on (id, j).
	a := ExpandBlockIDs(nil, []uint64{7, 8}, 0, 0)
	b := ExpandBlockIDs(nil, []uint64{9, 8}, 512, 700)
	if len(a) != 1024 || len(b) != 700 || !slices.Equal(a[512:700], b[512:]) || slices.Equal(a[:512], b[:512]) {
		t.Fatalf("lengths %d %d or per-id determinism broken", len(a), len(b))
	}
	// Appends to dst.
	if got := ExpandBlockIDs([]uint32{42}, []uint64{0}, 4, 0); !slices.Equal(got, append([]uint32{42}, golden[:4]...)) {
		t.Fatalf("append: %v", got)
	}
	for _, tok := range a {
		if tok >= 1<<31 {
			t.Fatalf("token %d is not 31-bit", tok)
		}
	}
}

func TestExpandBlockIDsZeroAlloc(t *testing.T) {
	ids := []uint64{1, 2, 3, 4}
	dst := make([]uint32, 0, 4*512)
	if n := testing.AllocsPerRun(100, func() { dst = ExpandBlockIDs(dst[:0], ids, 512, 1900) }); n != 0 {
		t.Fatalf("%v allocs per run", n)
	}
}

// Requests sharing Mooncake block ids share sequence hashes at any engine
// block size dividing 512, so the router sees their common prefix.
func TestExpandedPrefixesShareHashes(t *testing.T) {
	a := ExpandBlockIDs(nil, []uint64{0, 1, 2}, 512, 1536)
	b := ExpandBlockIDs(nil, []uint64{0, 1, 3, 4}, 512, 2000)
	for _, bs := range []int{16, 64, 512} {
		ha := kvevents.SeqHashes(nil, a, bs, kvevents.HashSeed)
		hb := kvevents.SeqHashes(nil, b, bs, kvevents.HashSeed)
		shared := 1024 / bs
		if !slices.Equal(ha[:shared], hb[:shared]) || ha[shared] == hb[shared] {
			t.Fatalf("block size %d: first %d hashes should match, then differ", bs, shared)
		}
	}
}

func BenchmarkExpandBlockIDs(b *testing.B) {
	ids := make([]uint64, 24) // a 12k-token Mooncake prompt
	for i := range ids {
		ids[i] = uint64(i)
	}
	dst := make([]uint32, 0, 24*512)
	b.ReportAllocs()
	for b.Loop() {
		dst = ExpandBlockIDs(dst[:0], ids, 512, 12035)
	}
}
