package sim

import "github.com/zeebo/xxh3"

// Mooncake traces carry no text, only one id per 512-token block, where an id
// always names the same prefix. ExpandBlockIDs turns such ids into concrete
// tokens so that the engine, the bench client and the router all hash the
// same tokens: token j of the block with id k is mixToken(k, j), whatever the
// request. A partial last block is the first tokens of its id's block.

// ExpandBlockIDs appends to dst the tokens of the blocks ids, blockTokens
// tokens per id (DefaultMooncakeBlock when blockTokens <= 0), cut to
// inputLength tokens when 0 < inputLength < len(ids)·blockTokens. It does not
// allocate when dst has room. Token j of id k is
//
//	x := k·0x9E3779B97F4A7C15 + j + 0x632BE59BD9B4E019
//	x ^= x>>30; x *= 0xBF58476D1CE4E5B9; x ^= x>>27; x *= 0x94D049BB133111EB; x ^= x>>31
//	token = uint32(x >> 33)    // 31 bits: a valid int32 token id everywhere
func ExpandBlockIDs(dst []uint32, ids []uint64, blockTokens, inputLength int) []uint32 {
	if blockTokens <= 0 {
		blockTokens = DefaultMooncakeBlock
	}
	n := len(ids) * blockTokens
	if inputLength > 0 && inputLength < n {
		n = inputLength
	}
	dst = grow(dst, n)
	for _, id := range ids {
		for j := 0; j < blockTokens; j++ {
			if n == 0 {
				return dst
			}
			dst = append(dst, mixToken(id, uint64(j)))
			n--
		}
	}
	return dst
}

// mixToken is splitmix64 over (k, j), cut to 31 bits.
func mixToken(k, j uint64) uint32 {
	x := k*0x9E3779B97F4A7C15 + j + 0x632BE59BD9B4E019
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return uint32(x >> 33)
}

// outputSeed is the seed of a request's generated tokens: output token i of
// request id is mixToken(outputSeed(id), i), so a client can predict (and a
// later turn can resend) exactly what the engine produced.
func outputSeed(requestID string) uint64 { return xxh3.HashString(requestID) }

// outputToken is the request's next generated token: mixToken of its
// output seed and index, mapped into its vocabulary when it has one.
func (r *request) outputToken() uint32 {
	tok := mixToken(r.outSeed, uint64(r.generated))
	if len(r.vocab) > 0 {
		tok = r.vocab[tok%uint32(len(r.vocab))]
	}
	return tok
}

func grow(s []uint32, n int) []uint32 {
	if cap(s)-len(s) >= n {
		return s
	}
	out := make([]uint32, len(s), len(s)+n)
	copy(out, s)
	return out
}
