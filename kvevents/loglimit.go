package kvevents

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// logLimiter bounds the log lines a flood of bad input can write, twice:
//
//   - per key (a subject): at most one line per key per interval; the next
//     line for that key says how many it suppressed in between;
//   - over all keys: at most maxLines lines per interval. Past that, lines
//     are only counted, and the first call after the interval ends writes
//     one summary line with the count before anything else.
//
// So N bad messages on distinct subjects write at most maxLines lines plus
// one summary per interval, whatever N is. The per-key table is cleared when
// it holds maxLimiterKeys keys (that only loses per-key suppressed counts;
// the global bound still holds).
type logLimiter struct {
	log      *slog.Logger
	interval time.Duration
	maxLines int
	now      func() time.Time // time.Now; tests move it

	mu   sync.Mutex
	keys map[string]*limitState
	// The global window: lines written since windowStart, and lines
	// suppressed by the global bound since the last summary.
	windowStart time.Time
	lines       int
	suppressed  int
}

type limitState struct {
	last       time.Time
	suppressed int
}

const (
	maxLimiterKeys = 4096
	// defaultMaxLogLines is the global bound per interval when the config
	// leaves it at 0.
	defaultMaxLogLines = 20
	// summaryMsg is the line that reports what the global bound held back.
	summaryMsg = "kvevents: suppressed log lines about bad input"
)

func newLogLimiter(log *slog.Logger, interval time.Duration, maxLines int) *logLimiter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if interval <= 0 {
		interval = 10 * time.Second
	}
	if maxLines <= 0 {
		maxLines = defaultMaxLogLines
	}
	return &logLimiter{log: log, interval: interval, maxLines: maxLines, now: time.Now, keys: make(map[string]*limitState)}
}

// logf emits msg at level for key unless key was logged within the interval
// or the interval's global budget is spent.
func (l *logLimiter) logf(level slog.Level, key, msg string, attrs ...slog.Attr) {
	now := l.now()
	l.mu.Lock()
	summary := l.rollWindow(now)
	write := l.admitKey(now, key, &attrs)
	l.mu.Unlock()
	if summary > 0 {
		l.log.LogAttrs(context.Background(), slog.LevelWarn, summaryMsg,
			slog.Int("suppressed", summary), slog.Duration("interval", l.interval))
	}
	if write {
		l.log.LogAttrs(context.Background(), level, msg, attrs...)
	}
}

// rollWindow starts a new global window once the interval has passed and
// returns the count the summary line must report (0: no summary).
func (l *logLimiter) rollWindow(now time.Time) int {
	if now.Sub(l.windowStart) < l.interval {
		return 0
	}
	summary := l.suppressed
	l.windowStart, l.lines, l.suppressed = now, 0, 0
	if summary > 0 {
		l.lines++ // the summary spends the new window's budget like any line
	}
	return summary
}

// admitKey applies the per-key then the global bound and reports whether the
// line is written; it appends the key's suppressed count to attrs if so.
func (l *logLimiter) admitKey(now time.Time, key string, attrs *[]slog.Attr) bool {
	st := l.keys[key]
	if st == nil {
		if len(l.keys) >= maxLimiterKeys {
			clear(l.keys)
		}
		st = &limitState{}
		l.keys[key] = st
	} else if now.Sub(st.last) < l.interval {
		st.suppressed++
		return false
	}
	if l.lines >= l.maxLines {
		// Counted once, in the summary; the key keeps its old timestamp,
		// so it may log again as soon as the global budget allows.
		l.suppressed++
		return false
	}
	l.lines++
	if st.suppressed > 0 {
		*attrs = append(*attrs, slog.Int("suppressed", st.suppressed))
	}
	st.last, st.suppressed = now, 0
	return true
}
