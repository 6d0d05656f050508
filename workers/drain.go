package workers

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrDrainTimeout: requests were still in flight when DrainConfig.MaxWait
// ran out; the worker was deregistered anyway. The concrete error is a
// *DrainTimeoutError.
var ErrDrainTimeout = errors.New("workers: drain timed out with requests in flight")

// DrainTimeoutError reports how many requests were still in flight.
type DrainTimeoutError struct {
	InFlight int
	Waited   time.Duration
}

func (e *DrainTimeoutError) Error() string {
	return fmt.Sprintf("workers: drain: %d requests still in flight after %v", e.InFlight, e.Waited)
}

// Unwrap matches ErrDrainTimeout.
func (e *DrainTimeoutError) Unwrap() error { return ErrDrainTimeout }

// Drain defaults.
const (
	DefaultDrainGrace   = 250 * time.Millisecond
	DefaultDrainMaxWait = 30 * time.Second
	DefaultDrainPoll    = 20 * time.Millisecond
)

// DrainConfig configures Registration.Drain. Zero fields take defaults.
type DrainConfig struct {
	// InFlight returns the number of requests the worker is still serving
	// (running or queued). nil means none.
	InFlight func() int
	// Grace is waited after the draining state is written and before
	// in-flight requests are counted, so that requests routed just before
	// routers saw the state have time to arrive. DefaultDrainGrace;
	// negative means no grace.
	Grace time.Duration
	// MaxWait bounds the wait for in-flight requests; DefaultDrainMaxWait.
	// It is also the drain deadline every router replica sees (written
	// into Info.DrainDeadline as now + Grace + MaxWait): routers keep
	// sending the worker the requests of Hard sessions bound to it until
	// then, and confirm its departure at that time even if this process
	// hangs before deregistering.
	MaxWait time.Duration
	// Poll is how often InFlight is called; DefaultDrainPoll.
	Poll time.Duration
	// AfterDeregister runs once the key is deleted (also when deleting
	// failed): the simulated engine publishes its Cleared event here.
	AfterDeregister func(ctx context.Context) error
}

// drainCleanupTimeout bounds deregistration and the hook when the caller's
// context is already done: the key must still be deleted.
const drainCleanupTimeout = 5 * time.Second

// Drain stops the worker gracefully: it sets the draining state with a
// deadline of Grace + MaxWait from now (SetDrainingUntil), waits Grace,
// waits (at most MaxWait) until InFlight reports zero, deregisters (deletes
// the key) and runs AfterDeregister. Meanwhile routers send it no new
// sessions and no unbound work, but keep sending it the requests of the
// Hard sessions bound to it; once it deregisters (or the deadline passes)
// those sessions re-bind elsewhere. Every step runs even when an earlier
// one failed; the errors are joined. If ctx ends while waiting, the wait
// stops and deregistration plus the hook still run under a fresh 5-second
// timeout.
func (r *Registration) Drain(ctx context.Context, cfg DrainConfig) error {
	if cfg.Grace == 0 {
		cfg.Grace = DefaultDrainGrace
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultDrainMaxWait
	}
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultDrainPoll
	}
	var errs []error
	start := time.Now()
	if err := r.SetDrainingUntil(ctx, start.Add(max(cfg.Grace, 0)+cfg.MaxWait)); err != nil {
		errs = append(errs, fmt.Errorf("workers: drain: set draining: %w", err))
	}
	if cfg.Grace > 0 {
		_ = sleepCtx(ctx, cfg.Grace)
	}
	if cfg.InFlight != nil {
		waitCtx, cancel := context.WithTimeout(ctx, cfg.MaxWait)
		for n := cfg.InFlight(); n > 0; n = cfg.InFlight() {
			if sleepCtx(waitCtx, cfg.Poll) != nil {
				if n = cfg.InFlight(); n > 0 {
					errs = append(errs, &DrainTimeoutError{InFlight: n, Waited: time.Since(start)})
				}
				break
			}
		}
		cancel()
	}
	cleanCtx := ctx
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		cleanCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), drainCleanupTimeout)
		defer cancel()
	}
	if err := r.Deregister(cleanCtx); err != nil {
		errs = append(errs, fmt.Errorf("workers: drain: %w", err))
	}
	if cfg.AfterDeregister != nil {
		if err := cfg.AfterDeregister(cleanCtx); err != nil {
			errs = append(errs, fmt.Errorf("workers: drain: after-deregister hook: %w", err))
		}
	}
	return errors.Join(errs...)
}
