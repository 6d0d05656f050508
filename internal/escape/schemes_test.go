package escape

import (
	"errors"
	"strings"
	"testing"
)

func TestSubjectToken(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "%"},
		{"worker-1", "worker-1"},
		{"meta-llama/Llama-3.1-8B", "meta-llama/Llama-3%2E1-8B"},
		{"a b\tc", "a%20b%09c"},
		{"*", "%2A"},
		{">", "%3E"},
		{"50%", "50%25"},
		{"ü", "%C3%BC"},
		{"\x00\x7f", "%00%7F"},
		{"$JS", "$JS"},
	}
	for _, tt := range tests {
		got := SubjectToken.Escape(tt.in)
		if got != tt.want {
			t.Errorf("SubjectToken(%q) = %q, want %q", tt.in, got, tt.want)
		}
		back, err := SubjectToken.Unescape(got)
		if err != nil || back != tt.in {
			t.Errorf("SubjectToken.Unescape(%q) = %q, %v; want %q", got, back, err, tt.in)
		}
		if !SubjectToken.Matches(got, tt.in) {
			t.Errorf("SubjectToken.Matches(%q, %q) = false", got, tt.in)
		}
	}
}

func TestSubjectTokenRejects(t *testing.T) {
	for _, tok := range []string{"", "a.b", "a b", "%4", "%", "%zz", "%2e", "%41", "a%", "x*", "%%", "\x80"} {
		if tok == "%" {
			continue // the empty string's encoding
		}
		var e *Error
		if _, err := SubjectToken.Unescape(tok); !errors.As(err, &e) {
			t.Errorf("SubjectToken.Unescape(%q) error = %v, want an *Error", tok, err)
		}
	}
}

func FuzzSubjectToken(f *testing.F) {
	for _, s := range []string{"", "worker-1", "meta-llama/Llama-3.1-8B", "a b", "%", "%25", "*.>", "ü\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok := SubjectToken.Escape(s)
		if tok == "" || strings.ContainsAny(tok, ".*> \t\r\n") {
			t.Fatalf("SubjectToken(%q) = %q is not a valid token", s, tok)
		}
		for i := 0; i < len(tok); i++ {
			if tok[i] <= ' ' || tok[i] >= 0x7f {
				t.Fatalf("SubjectToken(%q) = %q has byte %#x", s, tok, tok[i])
			}
		}
		back, err := SubjectToken.Unescape(tok)
		if err != nil || back != s {
			t.Fatalf("round trip %q -> %q -> %q, %v", s, tok, back, err)
		}
		if !SubjectToken.Matches(tok, s) {
			t.Fatalf("SubjectToken.Matches(%q, %q) = false", tok, s)
		}
		// Interpreted as a token, s either is rejected or is canonical.
		if u, err := SubjectToken.Unescape(s); err == nil {
			if SubjectToken.Escape(u) != s {
				t.Fatalf("SubjectToken.Unescape(%q) = %q but SubjectToken of that is %q", s, u, SubjectToken.Escape(u))
			}
			if !SubjectToken.Matches(s, u) {
				t.Fatalf("SubjectToken.Matches(%q, %q) = false", s, u)
			}
		}
	})
}

// subjectGolden is SubjectToken of every byte value, 16 bytes per row (row i
// holds bytes 16i..16i+15), as the wire has carried it since the first
// release: event and load subjects and message ids depend on these bytes, so
// a change here breaks every subscriber filter and deduplication window.
var subjectGolden = [16]string{
	"%00%01%02%03%04%05%06%07%08%09%0A%0B%0C%0D%0E%0F",
	"%10%11%12%13%14%15%16%17%18%19%1A%1B%1C%1D%1E%1F",
	"%20!\"#$%25&'()%2A+,-%2E/",
	"0123456789:;<=%3E?",
	"@ABCDEFGHIJKLMNO",
	"PQRSTUVWXYZ[\\]^_",
	"`abcdefghijklmno",
	"pqrstuvwxyz{|}~%7F",
	"%80%81%82%83%84%85%86%87%88%89%8A%8B%8C%8D%8E%8F",
	"%90%91%92%93%94%95%96%97%98%99%9A%9B%9C%9D%9E%9F",
	"%A0%A1%A2%A3%A4%A5%A6%A7%A8%A9%AA%AB%AC%AD%AE%AF",
	"%B0%B1%B2%B3%B4%B5%B6%B7%B8%B9%BA%BB%BC%BD%BE%BF",
	"%C0%C1%C2%C3%C4%C5%C6%C7%C8%C9%CA%CB%CC%CD%CE%CF",
	"%D0%D1%D2%D3%D4%D5%D6%D7%D8%D9%DA%DB%DC%DD%DE%DF",
	"%E0%E1%E2%E3%E4%E5%E6%E7%E8%E9%EA%EB%EC%ED%EE%EF",
	"%F0%F1%F2%F3%F4%F5%F6%F7%F8%F9%FA%FB%FC%FD%FE%FF",
}

func TestSubjectTokenGolden(t *testing.T) {
	var all strings.Builder
	for row, want := range subjectGolden {
		in := byteRow(row)
		if got := SubjectToken.Escape(in); got != want {
			t.Errorf("SubjectToken(bytes %#x..%#x) = %q, want %q", row*16, row*16+15, got, want)
		}
		if back, err := SubjectToken.Unescape(want); err != nil || back != in {
			t.Errorf("SubjectToken.Unescape(%q) = %q, %v; want bytes %#x..%#x", want, back, err, row*16, row*16+15)
		}
		if !SubjectToken.Matches(want, in) {
			t.Errorf("SubjectToken.Matches(%q, bytes %#x..) = false", want, row*16)
		}
		all.WriteString(want)
	}
	if got := SubjectToken.Escape(byteRows()); got != all.String() {
		t.Errorf("SubjectToken(all bytes) = %q, want the rows concatenated", got)
	}
}

// byteRow returns the 16 bytes 16*row .. 16*row+15.
func byteRow(row int) string {
	b := make([]byte, 16)
	for i := range b {
		b[i] = byte(16*row + i)
	}
	return string(b)
}

// byteRows returns every byte value once, in order.
func byteRows() string {
	b := make([]byte, 256)
	for i := range b {
		b[i] = byte(i)
	}
	return string(b)
}

// BenchmarkSubjectToken: the escaping every publish and every subscriber
// check pays (Matches runs per received message).
func BenchmarkSubjectToken(b *testing.B) {
	names := []string{"worker-00017", "meta-llama/Llama-3.1-8B"}
	b.Run("escape", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			_ = SubjectToken.Escape(names[i&1])
		}
	})
	toks := []string{SubjectToken.Escape(names[0]), SubjectToken.Escape(names[1])}
	b.Run("matches", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if !SubjectToken.Matches(toks[i&1], names[i&1]) {
				b.Fatal("no match")
			}
		}
	})
	b.Run("unescape", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := SubjectToken.Unescape(toks[i&1]); err != nil {
				b.Fatal(err)
			}
		}
	})
}
