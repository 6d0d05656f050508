package testutil

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestEventuallyWaitsForCondition(t *testing.T) {
	var n atomic.Int32
	go func() {
		time.Sleep(20 * time.Millisecond)
		n.Store(1)
	}()
	Eventually(t, 5*time.Second, func() bool { return n.Load() == 1 }, nil)
}

// fakeT records a failure instead of stopping the real test.
type fakeT struct {
	testing.TB
	failed string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = format
	panic(f) // Fatalf must not return; unwound by the caller below
}

func TestEventuallyFailsWithWhat(t *testing.T) {
	f := &fakeT{TB: t}
	func() {
		defer func() {
			if r := recover(); r != nil && r != any(f) {
				panic(r)
			}
		}()
		Eventually(f, 10*time.Millisecond, func() bool { return false }, func() string { return "still false" })
	}()
	if f.failed == "" {
		t.Fatal("Eventually returned on a condition that never held")
	}
}

// deadlineT is a test whose deadline the test sets.
type deadlineT struct {
	testing.TB
	at time.Time
}

func (d deadlineT) Deadline() (time.Time, bool) { return d.at, true }

func TestBudgetEndsBeforeTheDeadline(t *testing.T) {
	for _, left := range []time.Duration{10 * time.Minute, 30 * time.Second, 4 * time.Second} {
		b := Budget(deadlineT{TB: t, at: time.Now().Add(left)})
		if b < left/3 || b >= left {
			t.Errorf("budget with %v left = %v, want in [%v, %v)", left, b, left/3, left)
		}
	}
	if b := Budget(deadlineT{TB: t, at: time.Now().Add(-time.Second)}); b != 0 {
		t.Errorf("budget past the deadline = %v, want 0", b)
	}
}

func TestBudgetWithoutDeadline(t *testing.T) {
	var b *testing.B
	if got := Budget(b); got != DefaultBudget {
		t.Errorf("budget of a benchmark = %v, want %v", got, DefaultBudget)
	}
}
