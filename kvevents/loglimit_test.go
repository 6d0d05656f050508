package kvevents

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// logRecords keeps every record's message and its "suppressed" attribute.
type logRecords struct {
	mu   sync.Mutex
	msgs []string
	supp []int64 // -1: no suppressed attribute
}

func (h *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecords) WithGroup(string) slog.Handler            { return h }
func (h *logRecords) Handle(_ context.Context, r slog.Record) error {
	supp := int64(-1)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "suppressed" {
			supp = a.Value.Int64()
		}
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Message)
	h.supp = append(h.supp, supp)
	return nil
}

func (h *logRecords) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.msgs)
}

// fakeClock is a logLimiter clock the test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// TestSubscriberBadInputLogBound: 20,000 bad messages on 20,000 distinct
// subjects write MaxLogLines lines in one interval (not 20,000), every one
// is counted, and the first bad message after the interval is preceded by
// one summary line that reports the rest.
func TestSubscriberBadInputLogBound(t *testing.T) {
	const n, maxLines = 20000, 7
	for _, tc := range []struct {
		name     string
		maxLines int
		want     int
	}{{"configured", maxLines, maxLines}, {"default", 0, defaultMaxLogLines}} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &logRecords{}
			sub := newSubscriber(nil, SubscriberConfig{Sink: &recSink{}, Logger: slog.New(logs),
				LogInterval: time.Minute, MaxLogLines: tc.maxLines})
			clock := &fakeClock{t: time.Unix(1700000000, 0)}
			sub.log.now = clock.now
			for i := range n {
				sub.process(EventSubject("", "m", fmt.Sprintf("w%d", i)), uint64(i+1), []byte{0xc1})
			}
			if st := sub.Stats(); st.Bad != n || st.Malformed != n {
				t.Fatalf("stats %+v, want %d bad (malformed) messages", st, n)
			}
			if got := logs.len(); got != tc.want {
				t.Fatalf("%d bad messages on distinct subjects wrote %d log lines in one interval, want %d", n, got, tc.want)
			}
			clock.t = clock.t.Add(time.Minute)
			sub.process(EventSubject("", "m", "late"), n+1, []byte{0xc1})
			if got := logs.len(); got != tc.want+2 {
				t.Fatalf("after the interval: %d log lines, want %d (summary + the new line)", got, tc.want+2)
			}
			if logs.msgs[tc.want] != summaryMsg || logs.supp[tc.want] != int64(n-tc.want) {
				t.Fatalf("summary line %q suppressed=%d, want %q suppressed=%d",
					logs.msgs[tc.want], logs.supp[tc.want], summaryMsg, n-tc.want)
			}
			if logs.msgs[tc.want+1] != "kvevents: skipping bad event message" {
				t.Fatalf("line after the summary: %q", logs.msgs[tc.want+1])
			}
		})
	}
}

// TestLogLimiterPerKey: one line per key per interval; the key's next line
// reports how many it suppressed; other keys are not held back by it.
func TestLogLimiterPerKey(t *testing.T) {
	logs := &logRecords{}
	l := newLogLimiter(slog.New(logs), time.Minute, 100)
	clock := &fakeClock{t: time.Unix(1700000000, 0)}
	l.now = clock.now
	for range 50 {
		l.logf(slog.LevelWarn, "a", "line a")
	}
	l.logf(slog.LevelWarn, "b", "line b")
	clock.t = clock.t.Add(time.Minute)
	l.logf(slog.LevelWarn, "a", "line a")
	want := []string{"line a", "line b", "line a"}
	wantSupp := []int64{-1, -1, 49}
	if fmt.Sprint(logs.msgs) != fmt.Sprint(want) || fmt.Sprint(logs.supp) != fmt.Sprint(wantSupp) {
		t.Fatalf("lines %q suppressed %v, want %q %v", logs.msgs, logs.supp, want, wantSupp)
	}
}
