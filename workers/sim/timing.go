package sim

import (
	"context"
	"math"
	"sync"
	"time"
)

// Timing is the cost model of one engine step: a quadratic in the number of
// new (uncached) prompt tokens computed in the step, plus a quadratic in the
// fraction of KV blocks in use when the step also decodes. The defaults are
// NVIDIA Dynamo's mocker polynomial (docs/mocker/mocker.md).
//
//	prefill ms = PrefillA·T² + PrefillB·T + PrefillC      (T > 0)
//	decode ms  = max(DecodeMin, DecodeA·p² + DecodeB·p + DecodeC)
type Timing struct {
	PrefillA, PrefillB, PrefillC float64
	DecodeA, DecodeB, DecodeC    float64
	DecodeMin                    float64
}

// DefaultTiming returns the Dynamo mocker's polynomial coefficients.
func DefaultTiming() Timing {
	return Timing{
		PrefillA: 4.209989e-7, PrefillB: 1.518344e-2, PrefillC: 16.50142,
		DecodeA: -25.74, DecodeB: 54.01, DecodeC: 5.74,
		DecodeMin: 1,
	}
}

// PrefillMs is the model time in milliseconds to compute t new prompt
// tokens in one step; 0 when t <= 0.
func (m Timing) PrefillMs(t int) float64 {
	if t <= 0 {
		return 0
	}
	x := float64(t)
	return m.PrefillA*x*x + m.PrefillB*x + m.PrefillC
}

// DecodeMs is the model time in milliseconds of one decode pass when a
// fraction p (0..1) of the KV blocks is in use by running requests.
func (m Timing) DecodeMs(p float64) float64 {
	return math.Max(m.DecodeMin, m.DecodeA*p*p+m.DecodeB*p+m.DecodeC)
}

// StepMs is the model time of a step that computes prefillTokens new prompt
// tokens and decodes decodes sequences at KV usage p. As in Dynamo's mocker,
// the prefill and decode parts of a mixed step add up. Custom coefficients
// that would make it negative (or NaN) give 0.
func (m Timing) StepMs(prefillTokens, decodes int, p float64) float64 {
	ms := m.PrefillMs(prefillTokens)
	if decodes > 0 {
		ms += m.DecodeMs(p)
	}
	if !(ms > 0) {
		return 0
	}
	return ms
}

// msToDuration converts model milliseconds to a Duration, rounded to the
// nanosecond.
func msToDuration(ms float64) time.Duration {
	return time.Duration(math.Round(ms * 1e6))
}

// Clock is the engine's source of time. The step loop sleeps on it for each
// step's model time divided by the speed-up; request timestamps come from
// Now. WallClock runs in real time; VirtualClock makes every Sleep return at
// once after advancing its time, so tests and fast replays run on virtual
// time without sleeping.
type Clock interface {
	Now() time.Time
	// Sleep waits for d on this clock; it returns ctx.Err() if ctx ends first.
	Sleep(ctx context.Context, d time.Duration) error
}

// WallClock is real time.
type WallClock struct{}

// Now returns time.Now().
func (WallClock) Now() time.Time { return time.Now() }

// Sleep waits for d of real time or until ctx is done.
func (WallClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// VirtualClock is a clock that only moves when someone sleeps on it: Sleep(d)
// advances it by d and returns at once. Give each engine its own
// VirtualClock (an engine gives its ranks after the first their own copies):
// engines sharing one would add their step times up. An engine on a
// VirtualClock driven by RunUntilIdle or AdvanceTo is fully deterministic.
type VirtualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewVirtualClock returns a virtual clock that starts at start.
func NewVirtualClock(start time.Time) *VirtualClock { return &VirtualClock{now: start} }

// Now returns the virtual time.
func (c *VirtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Sleep advances the virtual time by d (if positive).
func (c *VirtualClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.Advance(d)
	return nil
}

// Advance moves the virtual time forward by d (if positive), e.g. to model
// the gap between two arrivals.
func (c *VirtualClock) Advance(d time.Duration) {
	if d <= 0 {
		return
	}
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
