package vllm

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvrouter/kvrouter/kvevents"
)

// omap is an ordered msgpack map for building test payloads byte-exactly.
type omap []kv
type kv struct {
	k string
	v any
}

// mp encodes v: omap as a map in the given key order, []any as an array,
// anything else through msgpack.Encoder (uint64 -> cf, int64 < 0 -> d3).
func mp(t testing.TB, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	var walk func(v any) error
	walk = func(v any) error {
		switch x := v.(type) {
		case omap:
			if err := enc.EncodeMapLen(len(x)); err != nil {
				return err
			}
			for _, e := range x {
				if err := enc.EncodeString(e.k); err != nil {
					return err
				}
				if err := walk(e.v); err != nil {
					return err
				}
			}
			return nil
		case []any:
			if err := enc.EncodeArrayLen(len(x)); err != nil {
				return err
			}
			for _, e := range x {
				if err := walk(e); err != nil {
					return err
				}
			}
			return nil
		}
		return enc.Encode(v)
	}
	if err := walk(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func u64s(hs ...uint64) []any {
	out := make([]any, len(hs))
	for i, h := range hs {
		out[i] = h
	}
	return out
}

func toks(ts ...uint32) []any {
	out := make([]any, len(ts))
	for i, t := range ts {
		out[i] = t
	}
	return out
}

var vecTokens = []uint32{1, 127, 128, 255, 256, 65535, 65536, 151644}

const (
	vecHash0 = kvevents.EngineHash(0xf1e2d3c4b5a69788)
	vecHash1 = kvevents.EngineHash(0x0123456789abcdef)
	vecSeq0  = kvevents.SeqHash(0x070bdbe0426ed786) // literals from kvevents/hash_test.go (reference XXH3)
	vecSeq1  = kvevents.SeqHash(0xc7084a6d8efef81c)
)
