// Package tokenids reads a JSON array of token ids ([1, 2, 3]) by hand. A
// long prompt's ids are a megabyte of digits, and encoding/json's reflection
// spent a third of the gateway's CPU and a fifth of the simulated engines'
// in the gateway-path replay (docs/benchmarks/gateway.md): the gateway reads
// client prompts and engine replies with it, the simulator its prompts.
//
// It owns only the array syntax; callers decide what an id may be beyond
// fitting a uint32.
package tokenids

import (
	"bytes"
	"fmt"
)

// Parse reads a JSON array of integers in 0..2^32-1 at the start of raw
// (after JSON white space) and returns them appended to dst, with the
// number of bytes of raw it read. It accepts exactly what encoding/json
// accepts into a []uint32 (no leading zeros, no sign, no fraction or
// exponent), and nothing else.
func Parse(raw []byte, dst []uint32) ([]uint32, int, error) {
	i := 0
	skip := func() {
		for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
			i++
		}
	}
	skip()
	if i == len(raw) || raw[i] != '[' {
		return nil, 0, fmt.Errorf("tokens: want an array of token ids")
	}
	i++
	skip()
	if i < len(raw) && raw[i] == ']' {
		return dst, i + 1, nil
	}
	for {
		skip()
		start, v := i, uint64(0)
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' && i-start < 11 {
			v = v*10 + uint64(raw[i]-'0')
			i++
		}
		if i == start || v > 1<<32-1 || (raw[start] == '0' && i-start > 1) { // JSON has no leading zeros
			return nil, 0, fmt.Errorf("tokens: entry %d is not a token id (0 to 2^32-1)", len(dst))
		}
		dst = append(dst, uint32(v))
		skip()
		if i < len(raw) && raw[i] == ',' {
			i++
			continue
		}
		if i < len(raw) && raw[i] == ']' {
			return dst, i + 1, nil
		}
		return nil, 0, fmt.Errorf("tokens: entry %d is not a token id (0 to 2^32-1)", len(dst))
	}
}

// Capacity is an upper bound on the ids in raw (its commas plus one, at
// most limit), to size the slice Parse appends to so it is not copied as
// it grows.
func Capacity(raw []byte, limit int) int {
	return min(bytes.Count(raw, comma)+1, limit)
}

var comma = []byte(",")
