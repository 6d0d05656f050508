package gateway

import (
	"testing"
	"time"
)

func TestServerTimingRoundTrip(t *testing.T) {
	for _, tc := range []struct{ route, queue time.Duration }{
		{0, 0},
		{412 * time.Microsecond, 0},
		{3*time.Millisecond + 250*time.Microsecond, time.Millisecond},
		{2 * time.Second, 1500 * time.Millisecond},
	} {
		h := ServerTiming(tc.route, tc.queue)
		route, queue, ok := ParseServerTiming([]string{h})
		if !ok || route != tc.route || queue != tc.queue {
			t.Errorf("ServerTiming(%v, %v) = %q, parsed back as %v, %v, %v", tc.route, tc.queue, h, route, queue, ok)
		}
	}
}

func TestParseServerTiming(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name         string
		values       []string
		route, queue time.Duration
		ok           bool
	}{
		{"ours", []string{"route;dur=0.412, queue;dur=0.100"}, 412 * time.Microsecond, 100 * time.Microsecond, true},
		{"no header", nil, 0, 0, false},
		{"empty", []string{""}, 0, 0, false},
		{"route only", []string{"route;dur=2"}, 2 * ms, 0, true},
		{"queue only", []string{"queue;dur=2"}, 0, 2 * ms, false},
		{"other metrics around, spaces, desc and case", []string{`cache;desc="hit, warm";dur=0.1 , route ; desc="a;dur=9" ; DUR=1.5,db;dur=53`}, 1500 * time.Microsecond, 0, true},
		{"several lines, a proxy's first", []string{"edge;dur=7", "route;dur=3, queue;dur=1"}, 3 * ms, ms, true},
		{"no dur", []string{"route;desc=x"}, 0, 0, false},
		{"negative", []string{"route;dur=-1"}, 0, 0, false},
		{"not a number", []string{"route;dur=abc", "queue;dur=NaN"}, 0, 0, false},
		{"infinite", []string{"route;dur=Inf"}, 0, 0, false},
		{"over an hour", []string{"route;dur=1e300"}, 0, 0, false},
		{"quoted dur", []string{`route;dur="4"`}, 4 * ms, 0, true},
		{"unterminated quote", []string{`route;desc="x, queue;dur=1`}, 0, 0, false},
		{"no name", []string{";dur=1"}, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			route, queue, ok := ParseServerTiming(tc.values)
			if route != tc.route || queue != tc.queue || ok != tc.ok {
				t.Errorf("ParseServerTiming(%q) = %v, %v, %v; want %v, %v, %v", tc.values, route, queue, ok, tc.route, tc.queue, tc.ok)
			}
		})
	}
}

// FuzzParseServerTiming: any header parses without panicking, and what it
// reads is a duration a route could take.
func FuzzParseServerTiming(f *testing.F) {
	for _, s := range []string{"route;dur=0.412, queue;dur=0.100", `a;desc="x,y";dur=1, route;dur=2`, `route;dur="`, ";;,,", "route;dur=1e-9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		route, queue, ok := ParseServerTiming([]string{s})
		if route < 0 || queue < 0 || route > time.Hour || queue > time.Hour {
			t.Fatalf("ParseServerTiming(%q) = %v, %v", s, route, queue)
		}
		if !ok && route != 0 {
			t.Fatalf("ParseServerTiming(%q) = %v without a route entry", s, route)
		}
	})
}
