package kvevents

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/zeebo/xxh3"
)

// naiveMediaHashes is the media hashing rule written out plainly, from the
// definitions: for every full block, the items that hold at least one of
// its tokens, found by testing every item; the local hash over the block's
// tokens as little-endian bytes; each pair mixed in as 24 bytes; the chain.
// An unknown identifier ends the hashes before its first block.
func naiveMediaHashes(tokens []uint32, bs int, seed uint64, items []MediaItem) []SeqHash {
	var out []SeqHash
	for b := 0; (b+1)*bs <= len(tokens); b++ {
		s, e := b*bs, (b+1)*bs
		raw := make([]byte, 0, 4*bs)
		for _, t := range tokens[s:e] {
			raw = binary.LittleEndian.AppendUint32(raw, t)
		}
		local := xxh3.HashSeed(raw, seed)
		for _, it := range items {
			if it.Offset >= e || it.Offset+it.Length <= s {
				continue
			}
			if it.ID == "" {
				return out
			}
			var pair []byte
			pair = binary.LittleEndian.AppendUint64(pair, local)
			pair = binary.LittleEndian.AppendUint64(pair, xxh3.HashSeed([]byte(it.ID), 0))
			pair = binary.LittleEndian.AppendUint64(pair, uint64(int64(it.Offset-s)))
			local = xxh3.HashSeed(pair, HashSeed)
		}
		if b == 0 {
			out = append(out, SeqHash(local))
			continue
		}
		var chain []byte
		chain = binary.LittleEndian.AppendUint64(chain, uint64(out[b-1]))
		chain = binary.LittleEndian.AppendUint64(chain, local)
		out = append(out, SeqHash(xxh3.HashSeed(chain, HashSeed)))
	}
	return out
}

// randomItems places up to four items of 1 to 3 blocks' worth of
// placeholders, sorted and disjoint, some starting mid-block, some
// adjacent, in a prompt of n tokens; unknown makes one identifier "".
func randomItems(rng *rand.Rand, n, bs int, unknown bool) []MediaItem {
	var items []MediaItem
	pos := rng.IntN(2 * bs)
	for len(items) < 4 {
		l := 1 + rng.IntN(3*bs)
		if pos+l > n {
			break
		}
		items = append(items, MediaItem{ID: fmt.Sprintf("img-%d", rng.IntN(3)), Offset: pos, Length: l})
		pos += l + rng.IntN(2*bs) // 0: the next item starts right after
	}
	if unknown && len(items) > 0 {
		items[rng.IntN(len(items))].ID = ""
	}
	return items
}

func randomTokens(rng *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(rng.IntN(1000))
	}
	return out
}

// The router's hashes with items equal the naive definition, for random
// layouts, block sizes, seeds and unknown identifiers.
func TestSeqHashesMediaMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 2000 {
		bs := []int{1, 2, 4, 16}[i%4]
		n := rng.IntN(12 * bs)
		tokens := randomTokens(rng, n)
		items := randomItems(rng, n, bs, i%5 == 0)
		seed := []uint64{HashSeed, SeedFor("lora", ""), SeedFor("", "salt")}[i%3]
		want := naiveMediaHashes(tokens, bs, seed, items)
		if got := SeqHashesMedia(nil, tokens, bs, seed, items); !slices.Equal(got, want) {
			t.Fatalf("case %d: bs %d, %d tokens, items %+v:\n got %x\nwant %x", i, bs, n, items, got, want)
		}
	}
}

// Without items the media functions are SeqHashes and SeqHashesFrom, and
// allocate nothing when dst has room.
func TestSeqHashesMediaWithoutItems(t *testing.T) {
	tokens := randomTokens(rand.New(rand.NewPCG(5, 6)), 100)
	if got, want := SeqHashesMedia(nil, tokens, 16, HashSeed, nil), SeqHashes(nil, tokens, 16, HashSeed); !slices.Equal(got, want) {
		t.Fatalf("got %x, want %x", got, want)
	}
	if got, want := SeqHashesFromMedia(nil, 7, tokens, 32, 16, HashSeed, nil), SeqHashesFrom(nil, 7, tokens, 16, HashSeed); !slices.Equal(got, want) {
		t.Fatalf("from: got %x, want %x", got, want)
	}
	if got, want := SeqHashesKeyed(nil, 7, true, tokens, 16, HashSeed, nil), SeqHashesFrom(nil, 7, tokens, 16, HashSeed); !slices.Equal(got, want) {
		t.Fatalf("keyed: got %x, want %x", got, want)
	}
	dst := make([]SeqHash, 0, 16)
	if a := testing.AllocsPerRun(100, func() { dst = SeqHashesMedia(dst[:0], tokens, 16, HashSeed, nil) }); a != 0 {
		t.Fatalf("%v allocations per call without items", a)
	}
	items := []MediaItem{{ID: "x", Offset: 20, Length: 30}}
	if a := testing.AllocsPerRun(100, func() { dst = SeqHashesMedia(dst[:0], tokens, 16, HashSeed, items) }); a != 0 {
		t.Fatalf("%v allocations per call with an item", a)
	}
}

// An engine's view (the pairs it publishes per block, AppendMediaKeys,
// rehashed with SeqHashesKeyed) equals the router's (SeqHashesMedia), also
// when the engine reports the sequence in several runs, each chained onto
// the last (SeqHashesFromMedia for the engine's own incremental hashing).
func TestMediaKeysAgreeWithItems(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range 1000 {
		bs := []int{1, 4, 16}[i%3]
		nb := rng.IntN(12)
		tokens := randomTokens(rng, nb*bs)
		items := randomItems(rng, nb*bs, bs, false)
		want := SeqHashesMedia(nil, tokens, bs, HashSeed, items)
		cut := rng.IntN(nb + 1)
		got := SeqHashesKeyed(nil, 0, false, tokens[:cut*bs], bs, HashSeed, AppendMediaKeys(nil, items, 0, cut, bs))
		if cut > 0 {
			got = SeqHashesKeyed(got, got[cut-1], true, tokens[cut*bs:], bs, HashSeed, AppendMediaKeys(nil, items, cut*bs, nb-cut, bs))
		} else {
			got = SeqHashesKeyed(got, 0, false, tokens, bs, HashSeed, AppendMediaKeys(nil, items, 0, nb, bs))
		}
		if !slices.Equal(got, want) {
			t.Fatalf("case %d: keyed in two runs at block %d: got %x, want %x", i, cut, got, want)
		}
		inc := SeqHashesMedia(nil, tokens[:cut*bs], bs, HashSeed, items)
		if cut > 0 {
			inc = SeqHashesFromMedia(inc, inc[cut-1], tokens[cut*bs:], cut*bs, bs, HashSeed, items)
		} else {
			inc = SeqHashesMedia(inc, tokens, bs, HashSeed, items)
		}
		if !slices.Equal(inc, want) {
			t.Fatalf("case %d: incremental from block %d: got %x, want %x", i, cut, inc, want)
		}
	}
}

// vLLM's example layouts: an item inside one block, one spanning blocks
// (negative offsets after its first), one starting exactly on a block
// boundary, two in one block.
func TestAppendMediaKeysLayouts(t *testing.T) {
	items := []MediaItem{{ID: "a", Offset: 2, Length: 1}, {ID: "b", Offset: 3, Length: 6}, {ID: "c", Offset: 12, Length: 4}}
	got := AppendMediaKeys(nil, items, 0, 4, 4)
	want := []MediaKey{{0, "a", 2}, {0, "b", 3}, {1, "b", -1}, {2, "b", -5}, {3, "c", 0}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// Two images with the same placeholder tokens give the same hashes before
// the first block they overlap and different ones from it on; the same
// image at another position differs too (the offset).
func TestDifferentMediaDiverge(t *testing.T) {
	tokens := make([]uint32, 64)
	for i := range tokens {
		tokens[i] = 9 // placeholders equal everywhere
	}
	a := SeqHashesMedia(nil, tokens, 16, HashSeed, []MediaItem{{ID: "cat", Offset: 20, Length: 30}})
	b := SeqHashesMedia(nil, tokens, 16, HashSeed, []MediaItem{{ID: "dog", Offset: 20, Length: 30}})
	c := SeqHashesMedia(nil, tokens, 16, HashSeed, []MediaItem{{ID: "cat", Offset: 21, Length: 30}})
	if a[0] != b[0] || a[0] != c[0] {
		t.Fatal("the block before the images differs")
	}
	for i := 1; i < len(a); i++ {
		if a[i] == b[i] || a[i] == c[i] {
			t.Fatalf("block %d: different images or offsets give equal hashes", i)
		}
	}
	// Without identifiers, nothing from the first image's block on.
	if got := SeqHashesMedia(nil, tokens, 16, HashSeed, []MediaItem{{Offset: 20, Length: 30}}); len(got) != 1 || got[0] != a[0] {
		t.Fatalf("unknown identifier: %x, want the one block before it", got)
	}
}
