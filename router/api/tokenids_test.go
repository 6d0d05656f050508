package api

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// TestTokenIDsMatchEncodingJSON decodes many token arrays, well and badly
// formed, and checks the hand decoder against encoding/json: the same ids
// for every array encoding/json accepts, an error naming token_ids for
// every one it refuses. The shapes aim at the edges of the fast path
// (uintArray): ids of 1 to 10 digits, leading zeros, the largest id and
// one past it; spaces, signs, fractions, exponents, strings and empty
// slots at random places.
func TestTokenIDsMatchEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	arraysMatchEncodingJSON(t, r, "token_ids", func() string {
		switch r.IntN(12) {
		case 0:
			return strconv.FormatUint(uint64(r.Uint32()), 10) // up to 10 digits
		case 1:
			return "4294967295"
		case 2:
			return "4294967296"
		case 3:
			return "0"
		default:
			return strconv.Itoa(r.IntN(1 << (r.IntN(27) + 1)))
		}
	})
}

// TestBlockHashesMatchEncodingJSON is the same for block hashes: 1 to 20
// digits (the fast path takes up to 19), the largest hash and one past it.
// Quoted hashes, which this decoder reads and encoding/json does not, are
// left out here (TestDecodeRouteRequest covers them).
func TestBlockHashesMatchEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 17))
	arraysMatchEncodingJSON(t, r, "block_hashes", func() string {
		switch r.IntN(12) {
		case 0, 1, 2:
			return strconv.FormatUint(r.Uint64(), 10) // mostly 19 or 20 digits
		case 3:
			return "18446744073709551615"
		case 4:
			return "18446744073709551616"
		case 5:
			return "9999999999999999999"
		case 6:
			return "0"
		default:
			return strconv.FormatUint(r.Uint64()>>r.IntN(64), 10)
		}
	})
}

// arraysMatchEncodingJSON decodes 20,000 route requests whose field is an
// array of id()s, a third of them with some elements mangled, and checks
// the hand decoder against encoding/json (see the callers).
func arraysMatchEncodingJSON(t *testing.T, r *rand.Rand, field string, id func() string) {
	t.Helper()
	mangle := func(s string) string {
		switch r.IntN(16) {
		case 0:
			return "0" + s
		case 1:
			return " " + s
		case 2:
			return s + " "
		case 3:
			return "-" + s
		case 4:
			return s + ".5"
		case 5:
			return s + "e2"
		case 6:
			return ""
		case 7:
			if field == "token_ids" {
				return `"` + s + `"`
			}
			return s + `"`
		case 8:
			return "\n" + s + "\t"
		case 9:
			return s + string([]byte{byte(0xF0 + r.IntN(16))}) // a byte above ASCII (invalid UTF-8) after an id
		case 10:
			return s[:len(s)/2] + string([]byte{byte(0x2F + r.IntN(2)*0xB)}) + s[len(s)/2:] // '/' or ':', either side of the digits
		}
		return s
	}
	for i := range 20000 {
		n := r.IntN(40)
		ids := make([]string, n)
		bad := r.IntN(3) == 0
		for j := range ids {
			ids[j] = id()
			if bad && r.IntN(8) == 0 {
				ids[j] = mangle(ids[j])
			}
		}
		arr := "[" + strings.Join(ids, ",") + "]"
		body := `{"model":"m",` + strings.Repeat(" ", r.IntN(9)) + `"` + field + `":` + arr + strings.Repeat(",\"x\":1", r.IntN(2)) + "}"
		var std struct {
			TokenIDs    []uint32 `json:"token_ids"`
			BlockHashes []uint64 `json:"block_hashes"`
		}
		stdErr := json.Unmarshal([]byte(body), &std)
		var got RouteRequest
		err := DecodeRouteRequest([]byte(body), &got)
		want, have := any(std.TokenIDs), any(got.TokenIDs)
		empty := len(std.TokenIDs) == 0 && len(got.TokenIDs) == 0
		if field == "block_hashes" {
			want, have = std.BlockHashes, got.BlockHashes
			empty = len(std.BlockHashes) == 0 && len(got.BlockHashes) == 0
		}
		switch {
		case stdErr != nil && err == nil:
			t.Fatalf("case %d: %s: accepted, encoding/json refuses it: %v", i, body, stdErr)
		case stdErr == nil && err != nil:
			t.Fatalf("case %d: %s: refused (%v), encoding/json accepts it", i, body, err)
		case err != nil:
			if !strings.Contains(err.Error(), field) {
				t.Fatalf("case %d: %s: error does not name %s: %v", i, body, field, err)
			}
		case empty:
		case !reflect.DeepEqual(have, want):
			t.Fatalf("case %d: %s:\n got %v\nwant %v", i, body, have, want)
		}
	}
}

// TestTokenIDsLimit: the limit holds at every count around it.
func TestTokenIDsLimit(t *testing.T) {
	for _, n := range []int{MaxTokens - 1, MaxTokens, MaxTokens + 1} {
		var b strings.Builder
		b.WriteString(`{"model":"m","token_ids":[`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(i % 100000))
		}
		b.WriteString("]}")
		var r RouteRequest
		err := DecodeRouteRequest([]byte(b.String()), &r)
		if n <= MaxTokens && (err != nil || len(r.TokenIDs) != n) {
			t.Fatalf("%d ids: %v, %d decoded", n, err, len(r.TokenIDs))
		}
		if n > MaxTokens && (err == nil || !strings.Contains(err.Error(), "more than")) {
			t.Fatalf("%d ids: want the limit's error, got %v", n, err)
		}
	}
}
