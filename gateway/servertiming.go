package gateway

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// The gateway tells the client how long routing took in the standard
// Server-Timing header (W3C Server Timing): browsers' developer tools,
// curl users and load generators read it without knowing kvrouter. Two
// metrics, durations in milliseconds:
//
//	route  the route calls of the request (both, when it was retried on
//	       another worker): the router's queue, its decision and booking,
//	       and over NATS the round trip
//	queue  the part of the last route call spent in the router's queue
const (
	timingRoute = "route"
	timingQueue = "queue"
)

// ServerTiming formats the Server-Timing value for a request's routing
// time and router queue wait.
func ServerTiming(route, queue time.Duration) string {
	var b [64]byte
	out := append(b[:0], timingRoute+";dur="...)
	out = appendMS(out, route)
	out = append(out, ", "+timingQueue+";dur="...)
	out = appendMS(out, queue)
	return string(out)
}

func appendMS(b []byte, d time.Duration) []byte {
	return strconv.AppendFloat(b, float64(d.Nanoseconds())/1e6, 'f', 3, 64)
}

// ParseServerTiming reads the route and queue durations from the
// Server-Timing header's values (any number of lines, each a
// comma-separated list of metrics). ok reports a route metric with a
// valid duration; queue is 0 when absent. Other metrics and parameters are
// skipped, a malformed entry is ignored, and nothing here panics on any
// input (FuzzParseServerTiming).
func ParseServerTiming(values []string) (route, queue time.Duration, ok bool) {
	for _, v := range values {
		for v != "" {
			var entry string
			entry, v = cutUnquoted(v, ',')
			name, dur, valid := parseTimingEntry(entry)
			if !valid {
				continue
			}
			switch name {
			case timingRoute:
				route, ok = dur, true
			case timingQueue:
				queue = dur
			}
		}
	}
	return route, queue, ok
}

// cutUnquoted splits s at its first sep outside a quoted string.
func cutUnquoted(s string, sep byte) (before, after string) {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if quoted {
				i++
			}
		case '"':
			quoted = !quoted
		case sep:
			if !quoted {
				return s[:i], s[i+1:]
			}
		}
	}
	return s, ""
}

// parseTimingEntry reads one metric: its name and its dur parameter
// (milliseconds, finite, not negative). valid is false without both.
func parseTimingEntry(e string) (name string, dur time.Duration, valid bool) {
	name, e = cutUnquoted(e, ';')
	name = strings.TrimSpace(name)
	if name == "" {
		return "", 0, false
	}
	for e != "" {
		var p string
		p, e = cutUnquoted(e, ';')
		k, val, found := strings.Cut(p, "=")
		if !found || !strings.EqualFold(strings.TrimSpace(k), "dur") {
			continue
		}
		ms, err := strconv.ParseFloat(strings.Trim(strings.TrimSpace(val), `"`), 64)
		// An hour bounds any routing time and keeps the conversion exact.
		if err != nil || math.IsNaN(ms) || ms < 0 || ms > float64(time.Hour/time.Millisecond) {
			return "", 0, false
		}
		return name, time.Duration(ms * 1e6), true
	}
	return "", 0, false
}
