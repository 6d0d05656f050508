package api

import (
	"errors"
	"testing"
)

// A retryable error carries retry_after_ms in its envelope, survives the
// round trip, and gives the Retry-After header in whole seconds (rounded
// up); other errors carry neither.
func TestErrorRetryAfter(t *testing.T) {
	e := NewError(CodeBindingsUnavailable, "bindings table did not answer", nil)
	e.RetryAfterMS = 1500
	b := AppendError(nil, e)
	want := `{"error":{"code":"bindings_unavailable","status":503,"message":"bindings table did not answer","retry_after_ms":1500}}`
	if string(b) != want {
		t.Fatalf("got %s\nwant %s", b, want)
	}
	got := DecodeError(b)
	if got == nil || got.RetryAfterMS != 1500 || got.Status != 503 || !errors.Is(got, ErrBindingsUnavailable) {
		t.Fatalf("decoded %#v", got)
	}
	for _, tc := range []struct {
		ms   int64
		want string
	}{{0, ""}, {1, "1"}, {1000, "1"}, {1500, "2"}, {2000, "2"}} {
		e.RetryAfterMS = tc.ms
		if s := e.RetryAfterSeconds(); s != tc.want {
			t.Errorf("RetryAfterMS %d: Retry-After %q, want %q", tc.ms, s, tc.want)
		}
	}
}
