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
