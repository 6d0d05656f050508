package kvevents

import (
	"encoding/binary"
	"slices"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// HashSeed is the XXH3 seed of every router-side hash: the per-block hash
// when no LoRA name or cache salt applies, and every sequence-chain step.
// It is NVIDIA Dynamo's XXH3_SEED, so the same tokens give the same keys in
// both systems.
const HashSeed = 1337

// saltInnerSeed is the seed of the cache-salt term in SeedFor. Dynamo uses 1
// (not 0, the LoRA term's seed) so that salt = s and lora = s give different
// seeds.
const saltInnerSeed = 1

// SeedFor returns the seed of the per-block hash for a request with the given
// LoRA adapter name and cache salt. It is Dynamo's compute_salt_hash:
//
//	seed = 1337
//	if loraName != "":  seed += XXH3-64(loraName, seed 0)
//	if cacheSalt != "": seed += XXH3-64(cacheSalt, seed 1)
//
// with wrapping (mod 2^64) additions over the UTF-8 bytes of the strings. An
// empty string means "absent": its term is left out entirely (it is not
// hashed as an empty input), so SeedFor("", "") == HashSeed, SeedFor(l, "")
// has only the LoRA term and SeedFor("", s) only the salt term.
func SeedFor(loraName string, cacheSalt string) uint64 {
	seed := uint64(HashSeed)
	if loraName != "" {
		seed += xxh3.HashStringSeed(loraName, 0)
	}
	if cacheSalt != "" {
		seed += xxh3.HashStringSeed(cacheSalt, saltInnerSeed)
	}
	return seed
}

// hostLittleEndian says whether a []uint32 is already its little-endian byte
// encoding in memory, so LocalBlockHash can hash it in place.
var hostLittleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// LocalBlockHash returns XXH3-64 over the block's token ids written as
// little-endian uint32 values, with the given seed (HashSeed, or SeedFor's
// result when a LoRA name or cache salt applies). It hashes whatever tokens
// it is given; callers pass exactly one full block.
func LocalBlockHash(tokens []uint32, seed uint64) uint64 {
	if len(tokens) == 0 {
		return xxh3.HashSeed(nil, seed)
	}
	if hostLittleEndian {
		// The in-memory layout is the wire layout: hash without copying.
		b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), len(tokens)*4)
		return xxh3.HashSeed(b, seed)
	}
	return localBlockHashPortable(tokens, seed)
}

// localBlockHashPortable is LocalBlockHash for big-endian hosts (and the test
// that pins both paths to the same answer): it copies into a little-endian
// buffer, on the stack for blocks up to 256 tokens.
func localBlockHashPortable(tokens []uint32, seed uint64) uint64 {
	var stack [1024]byte
	var buf []byte
	if n := len(tokens) * 4; n <= len(stack) {
		buf = stack[:n]
	} else {
		buf = make([]byte, n)
	}
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(buf[i*4:], t)
	}
	return xxh3.HashSeed(buf, seed)
}

// NextSeqHash extends a sequence hash by one block:
// XXH3-64(LE64(prev) || LE64(local), seed HashSeed). The chain seed is always
// HashSeed; a LoRA name or salt enters only through the local hashes.
func NextSeqHash(prev SeqHash, local uint64) SeqHash {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[0:8], uint64(prev))
	binary.LittleEndian.PutUint64(b[8:16], local)
	return SeqHash(xxh3.HashSeed(b[:], HashSeed))
}

// SeqHashes appends to dst the sequence hashes of the full blocks of tokens
// (a trailing partial block is ignored): seq[0] = local[0] and
// seq[i] = NextSeqHash(seq[i-1], local[i]), where local[i] is
// LocalBlockHash(block i, seed). It does not allocate when dst has room for
// len(tokens)/blockSize more hashes. A blockSize below 1 yields no hashes.
func SeqHashes(dst []SeqHash, tokens []uint32, blockSize int, seed uint64) []SeqHash {
	if blockSize < 1 || len(tokens) < blockSize {
		return dst
	}
	local := LocalBlockHash(tokens[:blockSize], seed)
	dst = append(dst, SeqHash(local))
	return SeqHashesFrom(dst, SeqHash(local), tokens[blockSize:], blockSize, seed)
}

// SeqHashesFrom is SeqHashes for blocks that continue a sequence whose last
// block has sequence hash parent: every appended hash, the first included,
// is chained onto its predecessor. It is what a converter uses when an
// engine reports blocks whose parent is already known.
func SeqHashesFrom(dst []SeqHash, parent SeqHash, tokens []uint32, blockSize int, seed uint64) []SeqHash {
	if blockSize < 1 {
		return dst
	}
	n := len(tokens) / blockSize
	dst = slices.Grow(dst, n)
	prev := parent
	for i := 0; i < n; i++ {
		prev = NextSeqHash(prev, LocalBlockHash(tokens[i*blockSize:(i+1)*blockSize], seed))
		dst = append(dst, prev)
	}
	return dst
}
