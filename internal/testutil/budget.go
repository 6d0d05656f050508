package testutil

import (
	"testing"
	"time"
)

// DefaultBudget is how long a test without a deadline (a benchmark, or
// go test -timeout 0) may wait for something only load delays.
const DefaultBudget = 5 * time.Minute

// minMargin is the least time Budget leaves before the test's deadline.
const minMargin = 5 * time.Second

// Budget returns how long t may wait for something that only load delays,
// such as an in-process cluster electing its leader: until shortly before
// the test's own deadline (go test -timeout) when it has one, else
// DefaultBudget. A fixed bound fails a correct test on a loaded machine;
// the margin (a tenth of the time left, at least minMargin, at most half)
// lets the wait fail with its own message and the cleanups run before the
// test binary is stopped.
func Budget(t testing.TB) time.Duration {
	d, ok := deadline(t)
	if !ok {
		return DefaultBudget
	}
	left := time.Until(d)
	margin := min(max(left/10, minMargin), left/2)
	return max(left-margin, 0)
}

// deadline is t.Deadline for the testing.TB that have one (*testing.T;
// *testing.B and *testing.F do not).
func deadline(t testing.TB) (time.Time, bool) {
	if dt, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		return dt.Deadline()
	}
	return time.Time{}, false
}
