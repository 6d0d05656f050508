package bindings

import (
	"errors"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/session"
	"github.com/kvrouter/kvrouter/workerref"
)

var kvKeyRE = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)

func checkKVKey(t testing.TB, key string) {
	t.Helper()
	if !kvKeyRE.MatchString(key) || strings.HasPrefix(key, ".") || strings.HasSuffix(key, ".") {
		t.Fatalf("key %q is not a valid KV key", key)
	}
	if strings.Count(key, ".") != 1 {
		t.Fatalf("key %q must have exactly two tokens", key)
	}
}

func TestKeyEscaping(t *testing.T) {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	cases := []struct {
		name, model, session, want string
	}{
		{"plain", "llama", "abc-123", "llama.abc-123"},
		{"uuid", "m", "3f2a9c1e-0b7d-4e21-9a55-1c2d3e4f5a6b", "m.3f2a9c1e-0b7d-4e21-9a55-1c2d3e4f5a6b"},
		{"model with slash and dot", "meta-llama/Llama-3.1-8B", "s", "meta-llama_2FLlama-3_2E1-8B.s"},
		{"empty model", "", "s", "_.s"},
		{"underscore escaped", "m", "a_b", "m.a_5Fb"},
		{"dot and star", "m", ".*>", "m._2E_2A_3E"},
		{"unicode", "m", "é", "m._C3_A9"},
		{"max session", "m", strings.Repeat("z", MaxSessionLen), "m." + strings.Repeat("z", MaxSessionLen)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k, err := Key(c.model, c.session)
			if err != nil {
				t.Fatal(err)
			}
			if k != c.want {
				t.Fatalf("Key(%q, %q) = %q, want %q", c.model, c.session, k, c.want)
			}
			checkKVKey(t, k)
			m, s, err := ParseKey(k)
			if err != nil || m != c.model || s != c.session {
				t.Fatalf("ParseKey(%q) = %q, %q, %v", k, m, s, err)
			}
		})
	}
	k, err := Key(string(all), string(all))
	if err != nil {
		t.Fatal(err)
	}
	checkKVKey(t, k)
	if len(k) > maxKeyLen {
		t.Fatalf("key length %d > %d", len(k), maxKeyLen)
	}
}

func TestKeyBadInput(t *testing.T) {
	cases := []struct {
		name, model, session string
		want                 error
	}{
		{"empty session", "m", "", ErrInvalidSession},
		{"long session", "m", strings.Repeat("x", MaxSessionLen+1), ErrInvalidSession},
		{"long model", strings.Repeat("x", MaxModelLen+1), "s", ErrInvalidModel},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Key(c.model, c.session)
			if !errors.Is(err, c.want) {
				t.Fatalf("Key: %v, want %v", err, c.want)
			}
		})
	}
	for _, bad := range []string{"", "nodot", "a.b.c", "m.", ".s", "m.a_", "m.a_4", "m.a_zz", "m.a_41", "m.a*b", "m.a_2e"} {
		if _, _, err := ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) accepted", bad)
		}
	}
}

func TestDecodeRecord(t *testing.T) {
	good := `{"model":"m","session":"s","worker":"w1","rank":2,"mode":"soft","version":3,"writer":"r1","created":"2026-01-02T03:04:05Z","renewed":"2026-01-02T03:04:06Z","ttl_s":600,"nonce":"ab-0","future":1}`
	r, err := decodeRecord([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	b := r.binding(7)
	if b.Worker != "w1" || b.AnyRank || b.Rank != 2 || b.Mode != session.Soft || b.Version != 3 || b.Revision != 7 || r.ttl() != 10*time.Minute {
		t.Fatalf("decoded %+v", b)
	}
	bad := map[string]string{
		"not json":     `{"worker":`,
		"no worker":    `{"session":"s","mode":"hard","version":1,"nonce":"n"}`,
		"unknown mode": `{"session":"s","worker":"w","mode":"sticky","version":1,"nonce":"n"}`,
		"no mode":      `{"session":"s","worker":"w","version":1,"nonce":"n"}`,
		"version 0":    `{"session":"s","worker":"w","mode":"hard","version":0,"nonce":"n"}`,
		"no nonce":     `{"session":"s","worker":"w","mode":"hard","version":1}`,
		"no session":   `{"worker":"w","mode":"hard","version":1,"nonce":"n"}`,
		"negative ttl": `{"session":"s","worker":"w","mode":"hard","version":1,"nonce":"n","ttl_s":-1}`,
		"array":        `[]`,
		"empty":        ``,
	}
	for name, v := range bad {
		if _, err := decodeRecord([]byte(v)); err == nil {
			t.Errorf("%s: accepted %q", name, v)
		}
	}
	if _, err := decodeRecord([]byte(`{"session":"s","worker":"w","mode":"sticky","version":1,"nonce":"n"}`)); !errors.Is(err, session.ErrUnknownMode) {
		t.Errorf("unknown mode: %v does not wrap ErrUnknownMode", err)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	for _, tgt := range []workerref.Target{workerref.Any("w"), workerref.Of("w", 0), workerref.Of("w", 7)} {
		r := recordFor("m", "s", tgt, session.Hard, 1, "r", now, now, 10*time.Minute, makeNonce(0xabc, 2))
		data, err := encodeRecord(&r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeRecord(data)
		if err != nil {
			t.Fatal(err)
		}
		if b := got.binding(1); b.Target != tgt || !b.Created.Equal(now) {
			t.Fatalf("round trip of %v: %+v", tgt, b)
		}
		if i, ok := nonceIndex(got.Nonce, 0xabc); !ok || i != 2 {
			t.Fatalf("nonceIndex(%q) = %d, %v", got.Nonce, i, ok)
		}
		if _, ok := nonceIndex(got.Nonce, 0xabd); ok {
			t.Fatalf("nonce %q matched another base", got.Nonce)
		}
	}
}

// A nonce is <16 hex>-<attempt> (docs/protocol.md) whatever the base: a
// base from the random source whose top bits are zero keeps its leading
// zeros, and nonceIndex finds the write index in exactly that form.
func TestNonceForm(t *testing.T) {
	form := regexp.MustCompile(`^[0-9a-f]{16}-(0|[1-9][0-9]*)$`)
	src := rand.New(rand.NewPCG(1, 2))
	for shift := 0; shift < 64; shift += 4 {
		base := src.Uint64() >> shift // the top shift bits are zero
		for _, attempt := range []int{0, 7, maxAttemptsLimit - 1} {
			n := makeNonce(base, attempt)
			if !form.MatchString(n) {
				t.Fatalf("makeNonce(%#x, %d) = %q, not <16 hex>-<attempt>", base, attempt, n)
			}
			if i, ok := nonceIndex(n, base); !ok || i != attempt {
				t.Fatalf("nonceIndex(%q, %#x) = %d, %v; want %d", n, base, i, ok, attempt)
			}
			if _, ok := nonceIndex(n, base^1); ok {
				t.Fatalf("nonce %q matched base %#x", n, base^1)
			}
		}
		// The unpadded form is not this call's nonce.
		if short := strconv.FormatUint(base, 16) + "-0"; len(short) < 18 {
			if _, ok := nonceIndex(short, base); ok {
				t.Fatalf("unpadded nonce %q matched base %#x", short, base)
			}
		}
	}
}

// FuzzDecodeRecord: no stored value may panic the decoder, and whatever it
// accepts must re-encode to a value it accepts again.
func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte(`{"model":"m","session":"s","worker":"w1","rank":2,"mode":"soft","version":3,"writer":"r1","created":"2026-01-02T03:04:05Z","renewed":"2026-01-02T03:04:06Z","ttl_s":600,"nonce":"ab-0"}`))
	f.Add([]byte(`{"worker":"w","mode":"hard"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decodeRecord(data)
		if err != nil {
			return
		}
		out, err := encodeRecord(&r)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if _, err := decodeRecord(out); err != nil {
			t.Fatalf("re-decode of %s: %v", out, err)
		}
	})
}

// FuzzKey: every valid (model, session) makes a valid KV key that parses
// back to itself.
func FuzzKey(f *testing.F) {
	f.Add("m", "s")
	f.Add("", "a_b.c")
	f.Add("meta-llama/Llama-3.1-8B", "\x00\xff")
	f.Fuzz(func(t *testing.T, model, session string) {
		k, err := Key(model, session)
		if err != nil {
			return
		}
		checkKVKey(t, k)
		m, s, err := ParseKey(k)
		if err != nil || m != model || s != session {
			t.Fatalf("ParseKey(Key(%q, %q)) = %q, %q, %v", model, session, m, s, err)
		}
	})
}

// bindingKeyGolden is the escaped form of every byte value in a key token, 16
// bytes per row (row i holds bytes 16i..16i+15): the keys bindings have been
// stored under. A change here loses every stored session binding.
var bindingKeyGolden = [16]string{
	"_00_01_02_03_04_05_06_07_08_09_0A_0B_0C_0D_0E_0F",
	"_10_11_12_13_14_15_16_17_18_19_1A_1B_1C_1D_1E_1F",
	"_20_21_22_23_24_25_26_27_28_29_2A_2B_2C-_2E_2F",
	"0123456789_3A_3B_3C_3D_3E_3F",
	"_40ABCDEFGHIJKLMNO",
	"PQRSTUVWXYZ_5B_5C_5D_5E_5F",
	"_60abcdefghijklmno",
	"pqrstuvwxyz_7B_7C_7D_7E_7F",
	"_80_81_82_83_84_85_86_87_88_89_8A_8B_8C_8D_8E_8F",
	"_90_91_92_93_94_95_96_97_98_99_9A_9B_9C_9D_9E_9F",
	"_A0_A1_A2_A3_A4_A5_A6_A7_A8_A9_AA_AB_AC_AD_AE_AF",
	"_B0_B1_B2_B3_B4_B5_B6_B7_B8_B9_BA_BB_BC_BD_BE_BF",
	"_C0_C1_C2_C3_C4_C5_C6_C7_C8_C9_CA_CB_CC_CD_CE_CF",
	"_D0_D1_D2_D3_D4_D5_D6_D7_D8_D9_DA_DB_DC_DD_DE_DF",
	"_E0_E1_E2_E3_E4_E5_E6_E7_E8_E9_EA_EB_EC_ED_EE_EF",
	"_F0_F1_F2_F3_F4_F5_F6_F7_F8_F9_FA_FB_FC_FD_FE_FF",
}

func TestKeyGolden(t *testing.T) {
	for row, tok := range bindingKeyGolden {
		in := string(byteRange(16*row, 16))
		if k, err := Key(in, in); err != nil || k != tok+"."+tok {
			t.Errorf("Key(bytes %#x.., twice) = %q, %v; want %q", 16*row, k, err, tok+"."+tok)
		}
		if m, s, err := ParseKey(tok + "." + tok); err != nil || m != in || s != in {
			t.Errorf("ParseKey(%q) = %q, %q, %v; want bytes %#x.. twice", tok+"."+tok, m, s, err, 16*row)
		}
	}
}

// byteRange returns the n bytes from, from+1, ...
func byteRange(from, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(from + i)
	}
	return b
}
