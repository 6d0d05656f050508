package kvevents

import (
	"encoding/binary"
	"math/bits"
)

// refXXH3 is a deliberately slow, direct transcription of XXH3_64bits_withSeed
// from the xxHash specification (doc/xxhash_spec.md, "XXH3 Algorithm
// Description" for small, medium and large inputs). It shares no code with
// github.com/zeebo/xxh3, so agreement between the two on every length is
// evidence that the library implements the algorithm Dynamo uses (Rust
// xxhash_rust::xxh3::xxh3_64_with_seed). It is itself pinned to the
// reference C implementation by the literal sanity vectors in hash_test.go.

const (
	refP32_1 = 0x9E3779B1
	refP32_2 = 0x85EBCA77
	refP32_3 = 0xC2B2AE3D
	refP64_1 = 0x9E3779B185EBCA87
	refP64_2 = 0xC2B2AE3D27D4EB4F
	refP64_3 = 0x165667B19E3779F9
	refP64_4 = 0x85EBCA77C2B2AE63
	refP64_5 = 0x27D4EB2F165667C5
	refPMX1  = 0x165667919E3779F9
	refPMX2  = 0x9FB21C651E98DF25
)

var refDefaultSecret = [192]byte{
	0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
	0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
	0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
	0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
	0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
	0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
	0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
	0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
	0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
	0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
	0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
	0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
}

func r32(b []byte, off int) uint32 { return binary.LittleEndian.Uint32(b[off:]) }
func r64(b []byte, off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }

func refMulFold(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// refAvalanche is the spec's avalanche().
func refAvalanche(x uint64) uint64 {
	x ^= x >> 37
	x *= refPMX1
	x ^= x >> 32
	return x
}

// refAvalancheXXH64 is the spec's avalanche_XXH64().
func refAvalancheXXH64(x uint64) uint64 {
	x ^= x >> 33
	x *= refP64_2
	x ^= x >> 29
	x *= refP64_3
	x ^= x >> 32
	return x
}

func refMixStep(data []byte, secret []byte, off int, seed uint64) uint64 {
	lo := r64(data, 0) ^ (r64(secret, off) + seed)
	hi := r64(data, 8) ^ (r64(secret, off+8) - seed)
	return refMulFold(lo, hi)
}

func refXXH3(in []byte, seed uint64) uint64 {
	secret := refDefaultSecret[:]
	n := len(in)
	switch {
	case n == 0:
		return refAvalancheXXH64(seed ^ r64(secret, 56) ^ r64(secret, 64))
	case n <= 3:
		combined := uint32(in[n-1]) | uint32(n)<<8 | uint32(in[0])<<16 | uint32(in[n>>1])<<24
		v := (uint64(r32(secret, 0)^r32(secret, 4)) + seed) ^ uint64(combined)
		return refAvalancheXXH64(v)
	case n <= 8:
		first, last := r32(in, 0), r32(in, n-4)
		modSeed := seed ^ uint64(bits.ReverseBytes32(uint32(seed)))<<32
		combined := uint64(last) | uint64(first)<<32
		v := ((r64(secret, 8) ^ r64(secret, 16)) - modSeed) ^ combined
		v ^= bits.RotateLeft64(v, 49) ^ bits.RotateLeft64(v, 24)
		v *= refPMX2
		v ^= (v >> 35) + uint64(n)
		v *= refPMX2
		v ^= v >> 28
		return v
	case n <= 16:
		lo := ((r64(secret, 24) ^ r64(secret, 32)) + seed) ^ r64(in, 0)
		hi := ((r64(secret, 40) ^ r64(secret, 48)) - seed) ^ r64(in, n-8)
		v := uint64(n) + bits.ReverseBytes64(lo) + hi + refMulFold(lo, hi)
		return refAvalanche(v)
	case n <= 128:
		acc := uint64(n) * refP64_1
		rounds := ((n - 1) >> 5) + 1
		for i := rounds - 1; i >= 0; i-- {
			acc += refMixStep(in[i*16:], secret, i*32, seed)
			acc += refMixStep(in[n-i*16-16:], secret, i*32+16, seed)
		}
		return refAvalanche(acc)
	case n <= 240:
		acc := uint64(n) * refP64_1
		chunks := n >> 4
		for i := 0; i < 8; i++ {
			acc += refMixStep(in[i*16:], secret, i*16, seed)
		}
		acc = refAvalanche(acc)
		for i := 8; i < chunks; i++ {
			acc += refMixStep(in[i*16:], secret, (i-8)*16+3, seed)
		}
		acc += refMixStep(in[n-16:], secret, 119, seed)
		return refAvalanche(acc)
	}
	// Large input: the seed only derives the secret.
	derived := make([]byte, len(secret))
	copy(derived, secret)
	for i := 0; i < 12; i++ {
		binary.LittleEndian.PutUint64(derived[16*i:], r64(derived, 16*i)+seed)
		binary.LittleEndian.PutUint64(derived[16*i+8:], r64(derived, 16*i+8)-seed)
	}
	return refLarge(in, derived)
}

func refLarge(in, secret []byte) uint64 {
	acc := [8]uint64{refP32_3, refP64_1, refP64_2, refP64_3, refP64_4, refP32_2, refP64_5, refP32_1}
	secretLen := len(secret)
	stripesPerBlock := (secretLen - 64) / 8
	blockSize := 64 * stripesPerBlock
	accumulate := func(stripe []byte, off int) {
		for i := 0; i < 8; i++ {
			lane := r64(stripe, 8*i)
			v := lane ^ r64(secret, off+8*i)
			acc[i^1] += lane
			acc[i] += (v & 0xFFFFFFFF) * (v >> 32)
		}
	}
	scramble := func() {
		for i := 0; i < 8; i++ {
			acc[i] ^= acc[i] >> 47
			acc[i] ^= r64(secret, secretLen-64+8*i)
			acc[i] *= refP32_1
		}
	}
	p := in
	for len(p) > blockSize {
		for s := 0; s < stripesPerBlock; s++ {
			accumulate(p[s*64:], s*8)
		}
		scramble()
		p = p[blockSize:]
	}
	full := (len(p) - 1) / 64
	for s := 0; s < full; s++ {
		accumulate(p[s*64:], s*8)
	}
	accumulate(in[len(in)-64:], secretLen-71)
	result := uint64(len(in)) * refP64_1
	for i := 0; i < 4; i++ {
		result += refMulFold(acc[2*i]^r64(secret, 11+16*i), acc[2*i+1]^r64(secret, 11+16*i+8))
	}
	return refAvalanche(result)
}

// refFillTestBuffer is xxHash's XSUM_fillTestBuffer (cli/xsum_sanity_check.c):
// the input its published sanity vectors are computed over.
func refFillTestBuffer(n int) []byte {
	b := make([]byte, n)
	gen := uint64(2654435761) // PRIME32
	for i := range b {
		b[i] = byte(gen >> 56)
		gen *= 11400714785074694797 // PRIME64
	}
	return b
}
