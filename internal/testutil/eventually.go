package testutil

import (
	"testing"
	"time"
)

// Eventually polls cond until it holds or within has passed, and then fails
// the test with what() (the state worth seeing when a wait times out; nil
// for none). The poll interval starts at 1 ms and doubles up to 25 ms, so a
// condition that holds at once costs almost nothing and a slow one does not
// spin. It must be called from the test's goroutine.
func Eventually(t testing.TB, within time.Duration, cond func() bool, what func() string) {
	t.Helper()
	deadline := time.Now().Add(within)
	wait := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			msg := "condition not met"
			if what != nil {
				msg = what()
			}
			t.Fatalf("after %v: %s", within, msg)
		}
		time.Sleep(wait)
		if wait < 25*time.Millisecond {
			wait *= 2
		}
	}
}
