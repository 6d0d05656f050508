package workers

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestDrain(t *testing.T) {
	_, js := setup(t)
	cfg := testCfg()
	m, rec, reg := watchAndRegisterW1(t, js, cfg)

	var inflight atomic.Int32
	inflight.Store(3)
	go func() { // requests finish one by one
		for inflight.Load() > 0 {
			time.Sleep(50 * time.Millisecond)
			inflight.Add(-1)
		}
	}()
	var mu sync.Mutex
	var hookAt time.Time
	var availableAtHook, doneAtHook bool
	start := time.Now()
	err := reg.Drain(ctxT(t), DrainConfig{
		InFlight: func() int { return int(inflight.Load()) },
		Grace:    50 * time.Millisecond,
		AfterDeregister: func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			hookAt = time.Now()
			availableAtHook, doneAtHook = m.Available("w1"), inflight.Load() == 0
			return nil
		},
	})
	if err != nil {
		t.Fatalf("Drain: %v", err)
	}
	u := rec.wait(t, "update", "w1", time.Second)
	if u.info.State != StateDraining {
		t.Fatalf("first change is %v, want draining", u)
	}
	d := rec.wait(t, "depart", "w1", time.Second)
	mu.Lock()
	defer mu.Unlock()
	if hookAt.IsZero() || !doneAtHook || availableAtHook {
		t.Fatalf("hook: called=%v, in-flight done=%v, available=%v", !hookAt.IsZero(), doneAtHook, availableAtHook)
	}
	if u.at.After(d.at) || d.at.Sub(start) > 2*time.Second {
		t.Fatalf("order/timing: draining at %v, depart at %v", u.at.Sub(start), d.at.Sub(start))
	}
}

func TestDrainTimeout(t *testing.T) {
	_, js := setup(t)
	cfg := testCfg()
	m, rec, reg := watchAndRegisterW1(t, js, cfg)

	hookErr := errors.New("publish cleared failed")
	err := reg.Drain(ctxT(t), DrainConfig{
		InFlight:        func() int { return 2 },
		Grace:           -1,
		MaxWait:         100 * time.Millisecond,
		AfterDeregister: func(context.Context) error { return hookErr },
	})
	var te *DrainTimeoutError
	if !errors.Is(err, ErrDrainTimeout) || !errors.As(err, &te) || te.InFlight != 2 || !errors.Is(err, hookErr) {
		t.Fatalf("Drain = %v, want a drain timeout with 2 in flight and the hook's error", err)
	}
	rec.wait(t, "depart", "w1", time.Second) // deregistered anyway
	if m.Live("w1") {
		t.Fatal("still live")
	}
}

// A caller whose context ends mid-wait still gets the key deleted.
func TestDrainContextCancelled(t *testing.T) {
	_, js := setup(t)
	cfg := testCfg()
	_, rec, reg := watchAndRegisterW1(t, js, cfg)

	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	var hooked atomic.Bool
	err := reg.Drain(ctx, DrainConfig{
		InFlight:        func() int { return 1 },
		Grace:           -1,
		AfterDeregister: func(ctx context.Context) error { hooked.Store(ctx.Err() == nil); return nil },
	})
	if !errors.Is(err, ErrDrainTimeout) {
		t.Fatalf("Drain = %v, want ErrDrainTimeout", err)
	}
	rec.wait(t, "depart", "w1", time.Second)
	if !hooked.Load() {
		t.Fatal("hook not called with a live context")
	}
}
