package progress

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestBarRedraws(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(0, 0)
	b := New(&buf, "policy", 10, Options{Every: time.Second, now: func() time.Time { return now }})
	b.Add(1, 0) // first draw (last is zero time)
	b.Add(1, 0) // throttled
	now = now.Add(2 * time.Second)
	b.Add(3, 1)
	b.Add(5, 0) // reaches total: always drawn
	b.Finish()
	out := buf.String()
	if strings.Count(out, "\r") != 4 || !strings.HasSuffix(out, "\n") {
		t.Fatalf("%q", out)
	}
	if !strings.Contains(out, "10/10 100%") || !strings.Contains(out, "(1 not served)") || !strings.Contains(out, "5/10  50%") {
		t.Fatalf("%q", out)
	}
}

func TestBarLines(t *testing.T) {
	var buf bytes.Buffer
	b := New(&buf, "x", 100, Options{Lines: true})
	for i := 0; i < 100; i++ {
		b.Add(1, 0)
	}
	b.Finish()
	b.Finish()
	if n := strings.Count(buf.String(), "\n"); n != 10 {
		t.Fatalf("%d lines: %s", n, buf.String())
	}
}

func TestNilBar(t *testing.T) {
	var b *Bar
	b.Add(1, 1)
	b.Finish()
}
