package kvevents

import (
	"errors"
	"testing"
)

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
