package kvevents

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
		got := SubjectToken(tt.in)
		if got != tt.want {
			t.Errorf("SubjectToken(%q) = %q, want %q", tt.in, got, tt.want)
		}
		back, err := UnescapeSubjectToken(got)
		if err != nil || back != tt.in {
			t.Errorf("UnescapeSubjectToken(%q) = %q, %v; want %q", got, back, err, tt.in)
		}
		if !tokenMatches(got, tt.in) {
			t.Errorf("tokenMatches(%q, %q) = false", got, tt.in)
		}
	}
}

func TestUnescapeSubjectTokenRejects(t *testing.T) {
	for _, tok := range []string{"", "a.b", "a b", "%4", "%", "%zz", "%2e", "%41", "a%", "x*", "%%", "\x80"} {
		if tok == "%" {
			continue // the empty string's encoding
		}
		if _, err := UnescapeSubjectToken(tok); !errors.Is(err, ErrBadSubjectToken) {
			t.Errorf("UnescapeSubjectToken(%q) error = %v, want ErrBadSubjectToken", tok, err)
		}
	}
}

func TestEventSubject(t *testing.T) {
	if got := EventSubject("", "llama.3", "w 1"); got != "kvr.events.llama%2E3.w%201" {
		t.Fatalf("EventSubject = %q", got)
	}
	if got := EventSubject("acme.kvr", "m", "w"); got != "acme.kvr.events.m.w" {
		t.Fatalf("EventSubject with dotted prefix = %q", got)
	}
	if got := EventSubjectFilter(""); got != "kvr.events.>" {
		t.Fatalf("EventSubjectFilter = %q", got)
	}
	m, w, err := ParseEventSubject("acme.kvr", EventSubject("acme.kvr", "llama.3", ""))
	if err != nil || m != "llama.3" || w != "" {
		t.Fatalf("ParseEventSubject = %q, %q, %v", m, w, err)
	}
	for _, bad := range []string{"kvr.events.m", "kvr.events.m.w.x", "other.events.m.w", "kvr.events.m.%zz"} {
		if _, _, err := ParseEventSubject("", bad); !errors.Is(err, ErrBadSubjectToken) {
			t.Errorf("ParseEventSubject(%q) error = %v, want ErrBadSubjectToken", bad, err)
		}
	}
}

func FuzzSubjectToken(f *testing.F) {
	for _, s := range []string{"", "worker-1", "meta-llama/Llama-3.1-8B", "a b", "%", "%25", "*.>", "ü\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok := SubjectToken(s)
		if tok == "" || strings.ContainsAny(tok, ".*> \t\r\n") {
			t.Fatalf("SubjectToken(%q) = %q is not a valid token", s, tok)
		}
		for i := 0; i < len(tok); i++ {
			if tok[i] <= ' ' || tok[i] >= 0x7f {
				t.Fatalf("SubjectToken(%q) = %q has byte %#x", s, tok, tok[i])
			}
		}
		back, err := UnescapeSubjectToken(tok)
		if err != nil || back != s {
			t.Fatalf("round trip %q -> %q -> %q, %v", s, tok, back, err)
		}
		if !tokenMatches(tok, s) {
			t.Fatalf("tokenMatches(%q, %q) = false", tok, s)
		}
		// Interpreted as a token, s either is rejected or is canonical.
		if u, err := UnescapeSubjectToken(s); err == nil {
			if SubjectToken(u) != s {
				t.Fatalf("UnescapeSubjectToken(%q) = %q but SubjectToken of that is %q", s, u, SubjectToken(u))
			}
			if !tokenMatches(s, u) {
				t.Fatalf("tokenMatches(%q, %q) = false", s, u)
			}
		}
	})
}
