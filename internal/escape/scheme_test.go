package escape

import (
	"errors"
	"strings"
	"testing"
)

// alnumDash is an alphabet like the bindings keys': letters, digits and '-'.
func alnumDash(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-'
}

func TestEscapeRoundTrip(t *testing.T) {
	s := New('_', alnumDash)
	for _, tc := range []struct{ name, tok string }{
		{"", "_"},
		{"worker-1", "worker-1"},
		{"a_b", "a_5Fb"},
		{"meta-llama/Llama-3.1-8B", "meta-llama_2FLlama-3_2E1-8B"},
		{"é", "_C3_A9"},
		{"\x00\xff", "_00_FF"},
		{"_", "_5F"},
	} {
		if got := s.Escape(tc.name); got != tc.tok {
			t.Errorf("Escape(%q) = %q, want %q", tc.name, got, tc.tok)
		}
		if got := string(s.Append([]byte("k."), tc.name)); got != "k."+tc.tok {
			t.Errorf("Append(k., %q) = %q, want %q", tc.name, got, "k."+tc.tok)
		}
		if got, err := s.Unescape(tc.tok); err != nil || got != tc.name {
			t.Errorf("Unescape(%q) = %q, %v; want %q", tc.tok, got, err, tc.name)
		}
		if !s.Matches(tc.tok, tc.name) {
			t.Errorf("Matches(%q, %q) = false", tc.tok, tc.name)
		}
	}
}

func TestUnescapeRejects(t *testing.T) {
	s := New('_', alnumDash)
	for _, tc := range []struct{ tok, reason string }{
		{"", "empty token"},
		{"a.b", "unescaped byte 0x2e"},
		{"a_", "truncated escape"},
		{"a_4", "truncated escape"},
		{"a_zz", "bad escape _zz"},
		{"a_2e", "bad escape _2e"}, // lower-case hex is never produced
		{"a_41", `needless escape of 'A'`},
		{"__", "truncated escape"},
		{"\x80", "unescaped byte 0x80"},
	} {
		_, err := s.Unescape(tc.tok)
		var e *Error
		if !errors.As(err, &e) || e.Token != tc.tok || e.Reason != tc.reason {
			t.Errorf("Unescape(%q) error = %#v, want *Error with reason %q", tc.tok, err, tc.reason)
			continue
		}
		if !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("Unescape(%q) error text %q does not say %q", tc.tok, err, tc.reason)
		}
	}
}

func TestMatchesRejects(t *testing.T) {
	s := New('_', alnumDash)
	for _, tc := range []struct{ tok, name string }{
		{"", ""}, {"a", ""}, {"_", "a"}, {"a_2e", "a."}, {"a_2E", "a"}, {"a", "a."}, {"ab", "a"}, {"a_2Ex", "a."},
	} {
		if s.Matches(tc.tok, tc.name) {
			t.Errorf("Matches(%q, %q) = true", tc.tok, tc.name)
		}
	}
}

func TestNoAllocations(t *testing.T) {
	s := New('%', func(c byte) bool { return c > ' ' && c < 0x7f && c != '.' && c != '%' })
	tok := s.Escape("meta-llama/Llama-3.1-8B")
	if n := testing.AllocsPerRun(100, func() {
		if !s.Matches(tok, "meta-llama/Llama-3.1-8B") {
			t.Fatal("no match")
		}
	}); n != 0 {
		t.Errorf("Matches allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = s.Escape("worker-1") }); n != 0 {
		t.Errorf("Escape of a safe name allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = s.Unescape("worker-1") }); n != 0 {
		t.Errorf("Unescape of a token without escapes allocates %v times", n)
	}
}

func TestNewRefusesBadDefinitions(t *testing.T) {
	for name, def := range map[string]func() *Scheme{
		"escape byte safe":  func() *Scheme { return New('-', alnumDash) },
		"hex digit escaped": func() *Scheme { return New('%', func(c byte) bool { return c >= 'a' && c <= 'z' }) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: New accepted the definition", name)
				}
			}()
			def()
		}()
	}
}

// FuzzScheme: every name round-trips and matches its token; every token
// Unescape accepts is the escape of what it returns (one meaning per token).
func FuzzScheme(f *testing.F) {
	for _, s := range []string{"", "worker-1", "a_b", "_", "_5F", "_41", "meta-llama/Llama-3.1-8B", "\x00\xff"} {
		f.Add(s)
	}
	s := New('_', alnumDash)
	f.Fuzz(func(t *testing.T, name string) {
		tok := s.Escape(name)
		for i := 0; i < len(tok); i++ {
			if !s.Safe(tok[i]) && tok[i] != '_' {
				t.Fatalf("Escape(%q) = %q has byte %#x outside the alphabet", name, tok, tok[i])
			}
		}
		if back, err := s.Unescape(tok); err != nil || back != name {
			t.Fatalf("round trip %q -> %q -> %q, %v", name, tok, back, err)
		}
		if !s.Matches(tok, name) {
			t.Fatalf("Matches(%q, %q) = false", tok, name)
		}
		if u, err := s.Unescape(name); err == nil {
			if s.Escape(u) != name || !s.Matches(name, u) {
				t.Fatalf("Unescape(%q) = %q, whose token is %q", name, u, s.Escape(u))
			}
		}
	})
}
