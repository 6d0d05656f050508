package progress

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Bar is a progress bar; safe for concurrent use. A nil *Bar does nothing,
// so callers need not check whether progress is wanted.
type Bar struct {
	mu       sync.Mutex
	w        io.Writer
	label    string
	total    int
	done     int
	failed   int
	start    time.Time
	last     time.Time
	every    time.Duration
	lines    bool // write whole lines (not a terminal)
	nextLine int  // percent at which the next line is due
	now      func() time.Time
	finished bool
}

// Options tune a bar.
type Options struct {
	// Lines writes a line at every 10 % instead of redrawing one line with
	// '\r' (use it when the writer is not a terminal).
	Lines bool
	// Every bounds the redraw rate (default 200 ms).
	Every time.Duration
	now   func() time.Time
}

// New starts a bar for total units.
func New(w io.Writer, label string, total int, opt Options) *Bar {
	if opt.Every <= 0 {
		opt.Every = 200 * time.Millisecond
	}
	if opt.now == nil {
		opt.now = time.Now
	}
	b := &Bar{w: w, label: label, total: total, every: opt.Every, lines: opt.Lines, now: opt.now, nextLine: 10}
	b.start = b.now()
	return b
}

// Add records n finished units, failed of which failed.
func (b *Bar) Add(n, failed int) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done += n
	b.failed += failed
	now := b.now()
	if b.lines {
		if b.total > 0 && 100*b.done >= b.nextLine*b.total {
			for 100*b.done >= b.nextLine*b.total {
				b.nextLine += 10
			}
			fmt.Fprintln(b.w, b.render(now))
		}
		return
	}
	if now.Sub(b.last) >= b.every || b.done >= b.total {
		b.last = now
		fmt.Fprint(b.w, "\r"+b.render(now))
	}
}

// Finish draws the final state and ends the line.
func (b *Bar) Finish() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.finished {
		return
	}
	b.finished = true
	if b.lines {
		if b.nextLine <= 100 || b.done < b.total {
			fmt.Fprintln(b.w, b.render(b.now()))
		}
		return
	}
	fmt.Fprint(b.w, "\r"+b.render(b.now())+"\n")
}

const width = 30

func (b *Bar) render(now time.Time) string {
	frac := 1.0
	if b.total > 0 {
		frac = min(float64(b.done)/float64(b.total), 1)
	}
	fill := int(frac * width)
	bar := strings.Repeat("=", fill)
	if fill < width {
		bar += ">" + strings.Repeat(" ", width-fill-1)
	}
	el := now.Sub(b.start)
	s := fmt.Sprintf("%-14s [%s] %d/%d %3.0f%% %s", b.label, bar, b.done, b.total, 100*frac, el.Round(100*time.Millisecond))
	if frac > 0 && frac < 1 {
		eta := time.Duration(float64(el) * (1 - frac) / frac)
		s += " eta " + eta.Round(time.Second).String()
	}
	if b.failed > 0 {
		s += fmt.Sprintf(" (%d not served)", b.failed)
	}
	return s
}
