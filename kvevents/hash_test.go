package kvevents

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/zeebo/xxh3"
)

// xxhashSanityVectors are XXH3_64bits_withSeed results published by the
// reference C implementation (Cyan4973/xxHash, cli/xsum_sanity_check.c,
// table XSUM_XXH3_testdata) over refFillTestBuffer(len). They cover every
// XXH3 length class: empty, 1-3, 4-8, 9-16, 17-128, 129-240 and the long
// path with its block and stripe boundaries.
var xxhashSanityVectors = []struct {
	n    int
	seed uint64
	want uint64
}{
	{0, 0, 0x2D06800538D394C2}, {0, 11400714785074694797, 0xA8A6B918B2F0364A},
	{1, 0, 0xC44BDFF4074EECDB}, {1, 11400714785074694797, 0x032BE332DD766EF8},
	{6, 0, 0x27B56A84CD2D7325}, {6, 11400714785074694797, 0x84589C116AB59AB9},
	{12, 0, 0xA713DAF0DFBB77E7}, {12, 11400714785074694797, 0xE7303E1B2336DE0E},
	{24, 0, 0xA3FE70BF9D3510EB}, {24, 11400714785074694797, 0x850E80FC35BDD690},
	{48, 0, 0x397DA259ECBA1F11}, {48, 11400714785074694797, 0xADC2CBAA44ACC616},
	{80, 0, 0xBCDEFBBB2C47C90A}, {80, 11400714785074694797, 0xC6DD0CB699532E73},
	{195, 0, 0xCD94217EE362EC3A}, {195, 11400714785074694797, 0xBA68003D370CB3D9},
	{403, 0, 0xCDEB804D65C6DEA4}, {403, 11400714785074694797, 0x6259F6ECFD6443FD},
	{512, 0, 0x617E49599013CB6B}, {512, 11400714785074694797, 0x3CE457DE14C27708},
	{2048, 0, 0xDD59E2C3A5F038E0}, {2048, 11400714785074694797, 0x66F81670669ABABC},
	{2240, 0, 0x6E73A90539CF2948}, {2240, 11400714785074694797, 0x757BA8487D1B5247},
	{2367, 0, 0xCB37AEB9E5D361ED}, {2367, 11400714785074694797, 0xD2DB3415B942B42A},
}

func TestXXH3SanityVectors(t *testing.T) {
	buf := refFillTestBuffer(2367)
	for _, v := range xxhashSanityVectors {
		in := buf[:v.n]
		if got := refXXH3(in, v.seed); got != v.want {
			t.Errorf("reference XXH3(len %d, seed %#x) = %#016x, want %#016x", v.n, v.seed, got, v.want)
		}
		if got := xxh3.HashSeed(in, v.seed); got != v.want {
			t.Errorf("zeebo XXH3(len %d, seed %#x) = %#016x, want %#016x", v.n, v.seed, got, v.want)
		}
	}
}

// TestXXH3MatchesReference compares zeebo's seeded XXH3-64 with refXXH3 on
// every length from 0 to 2,400 bytes (all short, medium and long paths,
// several 1 KiB blocks) and on seeds that matter here: 0, 1 (the salt
// term), 1337 (HashSeed), the wrapping values SeedFor produces, and random.
func TestXXH3MatchesReference(t *testing.T) {
	buf := refFillTestBuffer(2400)
	rng := rand.New(rand.NewPCG(1, 2))
	seeds := []uint64{0, 1, HashSeed, SeedFor("my-lora", "salt-1"), ^uint64(0), rng.Uint64(), rng.Uint64()}
	for _, seed := range seeds {
		for n := 0; n <= len(buf); n++ {
			if testing.Short() && n > 300 && n%17 != 0 {
				continue
			}
			if got, want := xxh3.HashSeed(buf[:n], seed), refXXH3(buf[:n], seed); got != want {
				t.Fatalf("XXH3(len %d, seed %#x): zeebo %#016x, reference %#016x", n, seed, got, want)
			}
		}
	}
}

// The literals below were computed with refXXH3 (the spec transcription in
// xxh3ref_test.go, itself checked against xxHash's published vectors), never
// with the code under test: LE uint32 token bytes hashed with the seed for
// local hashes, LE64(prev)||LE64(local) hashed with 1337 for the chain, and
// 1337 + ref(lora, 0) + ref(salt, 1) for the seeds.

func TestSeedForKnownAnswers(t *testing.T) {
	tests := []struct {
		lora, salt string
		want       uint64
	}{
		{"", "", 1337},
		{"my-lora", "", 0xb2041cc45cbcfedd},
		{"", "salt-1", 0x495166a56b73fa79},
		{"my-lora", "salt-1", 0xfb558369c830f41d},
	}
	for _, tt := range tests {
		if got := SeedFor(tt.lora, tt.salt); got != tt.want {
			t.Errorf("SeedFor(%q, %q) = %#016x, want %#016x", tt.lora, tt.salt, got, tt.want)
		}
	}
	// The salt term is seeded with 1, the LoRA term with 0: swapping the
	// strings must change the seed.
	if SeedFor("x", "") == SeedFor("", "x") {
		t.Error("SeedFor(x, \"\") == SeedFor(\"\", x): the two terms must be distinguishable")
	}
}

func seqTokens(n int) []uint32 {
	toks := make([]uint32, n)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	return toks
}

func TestSeqHashesKnownAnswers(t *testing.T) {
	tests := []struct {
		name   string
		tokens []uint32
		bs     int
		seed   uint64
		local  []uint64
		want   []SeqHash
	}{
		{
			name:   "1..64 block 16 seed 1337",
			tokens: seqTokens(64), bs: 16, seed: HashSeed,
			local: []uint64{0xea06fc71a5ee6e88, 0x1fbf39bd106be0b5, 0xa8562fe663b7a097, 0x4bad57d34048b86a},
			want:  []SeqHash{0xea06fc71a5ee6e88, 0xad01835a37dd294c, 0x0d55e56c2bccbd1a, 0x445502a8048d6688},
		},
		{
			name:   "1..64 block 16 lora+salt",
			tokens: seqTokens(64), bs: 16, seed: 0xfb558369c830f41d,
			local: []uint64{0xc6a4db48eb9c9d2b, 0x43e8add08ba5c552, 0xe84b63117edfdd77, 0x7736c59cde3379c3},
			want:  []SeqHash{0xc6a4db48eb9c9d2b, 0xee3bfe7f7b6f816b, 0x3838ac1340b9f2a0, 0xbcce5917ec1a92cd},
		},
		{
			name:   "vLLM test-vector tokens block 4",
			tokens: []uint32{1, 127, 128, 255, 256, 65535, 65536, 151644}, bs: 4, seed: HashSeed,
			local: []uint64{0x070bdbe0426ed786, 0x2652e1340fe4f411},
			want:  []SeqHash{0x070bdbe0426ed786, 0xc7084a6d8efef81c},
		},
		{
			name:   "partial trailing block ignored",
			tokens: seqTokens(70), bs: 16, seed: HashSeed,
			local: []uint64{0xea06fc71a5ee6e88, 0x1fbf39bd106be0b5, 0xa8562fe663b7a097, 0x4bad57d34048b86a},
			want:  []SeqHash{0xea06fc71a5ee6e88, 0xad01835a37dd294c, 0x0d55e56c2bccbd1a, 0x445502a8048d6688},
		},
		{name: "shorter than a block", tokens: seqTokens(15), bs: 16, seed: HashSeed},
		{name: "block size 0", tokens: seqTokens(15), bs: 0, seed: HashSeed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i, want := range tt.local {
				blk := tt.tokens[i*tt.bs : (i+1)*tt.bs]
				if got := LocalBlockHash(blk, tt.seed); got != want {
					t.Errorf("LocalBlockHash(block %d) = %#016x, want %#016x", i, got, want)
				}
				if got := localBlockHashPortable(blk, tt.seed); got != want {
					t.Errorf("portable LocalBlockHash(block %d) = %#016x, want %#016x", i, got, want)
				}
			}
			got := SeqHashes(nil, tt.tokens, tt.bs, tt.seed)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) && !(len(got) == 0 && len(tt.want) == 0) {
				t.Fatalf("SeqHashes = %x, want %x", got, tt.want)
			}
			// Continuing from the first hash must give the rest.
			if len(tt.want) > 1 {
				rest := SeqHashesFrom(nil, tt.want[0], tt.tokens[tt.bs:], tt.bs, tt.seed)
				if fmt.Sprint(rest) != fmt.Sprint(tt.want[1:]) {
					t.Fatalf("SeqHashesFrom = %x, want %x", rest, tt.want[1:])
				}
			}
		})
	}
	if got := LocalBlockHash(nil, HashSeed); got != 0xd1f3e77444430ab9 {
		t.Errorf("LocalBlockHash(empty) = %#016x, want 0xd1f3e77444430ab9", got)
	}
}

func TestLocalBlockHashPortableMatches(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for n := 0; n <= 300; n++ {
		toks := make([]uint32, n)
		for i := range toks {
			toks[i] = rng.Uint32()
		}
		seed := rng.Uint64()
		if a, b := LocalBlockHash(toks, seed), localBlockHashPortable(toks, seed); a != b {
			t.Fatalf("%d tokens: in-place %#x, portable %#x", n, a, b)
		}
	}
}

func TestSeqHashesZeroAlloc(t *testing.T) {
	toks := seqTokens(2048)
	dst := make([]SeqHash, 0, 128)
	allocs := testing.AllocsPerRun(100, func() {
		dst = SeqHashes(dst[:0], toks, 16, HashSeed)
	})
	if allocs != 0 {
		t.Fatalf("SeqHashes with capacity allocated %.1f times per run", allocs)
	}
	if len(dst) != 128 {
		t.Fatalf("got %d hashes, want 128", len(dst))
	}
	appended := SeqHashes([]SeqHash{7}, toks[:32], 16, HashSeed)
	if len(appended) != 3 || appended[0] != 7 {
		t.Fatalf("SeqHashes must append to dst: got %x", appended)
	}
}

// BenchmarkSeqHashes2048 hashes a 2,048-token prompt at block size 16
// (128 local hashes + 127 chain steps).
func BenchmarkSeqHashes2048(b *testing.B) {
	toks := seqTokens(2048)
	dst := make([]SeqHash, 0, 128)
	b.ReportAllocs()
	b.SetBytes(int64(len(toks) * 4))
	for b.Loop() {
		dst = SeqHashes(dst[:0], toks, 16, HashSeed)
	}
}
