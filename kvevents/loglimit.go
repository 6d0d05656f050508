package kvevents

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// logLimiter logs at most once per key per interval and reports how many
// messages it suppressed in between, so a flood of bad input costs a log
// line per worker per interval rather than one per message.
type logLimiter struct {
	log      *slog.Logger
	interval time.Duration

	mu   sync.Mutex
	keys map[string]*limitState
}

type limitState struct {
	last       time.Time
	suppressed int
}

const maxLimiterKeys = 4096

func newLogLimiter(log *slog.Logger, interval time.Duration) *logLimiter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if interval <= 0 {
		interval = 10 * time.Second
	}
	return &logLimiter{log: log, interval: interval, keys: make(map[string]*limitState)}
}

// log emits msg at level for key unless key was logged within the interval.
func (l *logLimiter) logf(level slog.Level, key, msg string, attrs ...slog.Attr) {
	now := time.Now()
	l.mu.Lock()
	st := l.keys[key]
	if st == nil {
		if len(l.keys) >= maxLimiterKeys {
			clear(l.keys)
		}
		st = &limitState{}
		l.keys[key] = st
	} else if now.Sub(st.last) < l.interval {
		st.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := st.suppressed
	st.last, st.suppressed = now, 0
	l.mu.Unlock()
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("suppressed", suppressed))
	}
	l.log.LogAttrs(context.Background(), level, msg, attrs...)
}
