package bindings

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// This file keeps the watch-fed cache honest: the watch that feeds it, the
// probe that proves how far behind the bucket it is, and the restart of a
// watch that stalled.
//
// The proof: a probe sent at time T is a quorum mark (quorum.go), and the
// majority gives it the sequence L. Once the watch has delivered an entry
// with revision >= L, the cache holds every write acknowledged before T (a
// revision is a stream sequence; markers advance it too; the mark itself
// comes through the watch). A mark, not the stream leader's word on its
// last sequence: a leader cut off from its peers answers that stale. The cache is
// then "fresh as of T", and a Soft read may use it while now-T <=
// MaxStaleness.

// freshness tracks what the current watch has delivered against what the
// probes have seen in the stream. The watch goroutine calls delivered and
// snapshotDone, the probe goroutine answered, the readers age.
type freshness struct {
	mu          sync.Mutex
	applied     uint64    // highest stream sequence the current watch has shown the cache
	probes      []probe   // answered probes not yet satisfied, oldest first
	lastDeliver time.Time // when the current watch last delivered something

	asOf atomic.Int64 // unix ns: the cache holds every write acknowledged before; 0 = unknown
}

type probe struct {
	sent time.Time // when the probe was sent
	last uint64    // the stream's last sequence in the leader's answer
}

// maxProbes bounds the unsatisfied probes kept; a newer one proves more.
const maxProbes = 16

// reset forgets everything: a new watch starts from nothing.
func (f *freshness) reset() {
	f.mu.Lock()
	f.applied, f.probes, f.lastDeliver = 0, f.probes[:0], time.Now()
	f.asOf.Store(0)
	f.mu.Unlock()
}

// delivered records that the watch showed the cache the entry at rev.
func (f *freshness) delivered(rev uint64, now time.Time) {
	f.mu.Lock()
	f.lastDeliver = now
	if rev > f.applied {
		f.applied = rev
		f.satisfyLocked()
	}
	f.mu.Unlock()
}

// snapshotDone records that the watch has delivered every key as of a
// stream state whose last sequence, read at sent before the watch
// started, was last. The newest revision of the snapshot may be lower
// (its last message can be gone), which is why the watch's own deliveries
// cannot show this.
func (f *freshness) snapshotDone(last uint64, sent time.Time) {
	f.mu.Lock()
	f.lastDeliver = time.Now()
	f.applied = max(f.applied, last)
	f.probes = append(f.probes, probe{})
	copy(f.probes[1:], f.probes)
	f.probes[0] = probe{sent: sent, last: last}
	f.satisfyLocked()
	f.mu.Unlock()
}

// answered records a probe's answer.
func (f *freshness) answered(p probe) {
	f.mu.Lock()
	if len(f.probes) == maxProbes {
		f.probes = append(f.probes[:0], f.probes[1:]...)
	}
	f.probes = append(f.probes, p)
	f.satisfyLocked()
	f.mu.Unlock()
}

// satisfyLocked moves asOf to the newest probe the watch has caught up
// with and drops the probes it satisfies.
func (f *freshness) satisfyLocked() {
	n := 0
	for n < len(f.probes) && f.probes[n].last <= f.applied {
		n++
	}
	if n == 0 {
		return
	}
	if at := f.probes[n-1].sent.UnixNano(); at > f.asOf.Load() {
		f.asOf.Store(at)
	}
	f.probes = append(f.probes[:0], f.probes[n:]...)
}

// age returns how far behind the bucket the cache may be at now; ok is
// false when nothing has been proven since the watch (re)started.
func (f *freshness) age(now time.Time) (time.Duration, bool) {
	at := f.asOf.Load()
	if at == 0 {
		return 0, false
	}
	return now.Sub(time.Unix(0, at)), true
}

// stalled reports whether the stream has moved past what the watch has
// delivered for longer than after, with no delivery meanwhile.
func (f *freshness) stalled(now time.Time, after time.Duration) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.probes) > 0 && now.Sub(f.probes[0].sent) > after && now.Sub(f.lastDeliver) > after
}

// cacheFresh reports whether the cache may answer a read at now: the
// watch runs and has been shown to be at most MaxStaleness behind.
func (t *Table) cacheFresh(now time.Time) bool {
	if t.cfg.StrictReads {
		return false
	}
	age, ok := t.proof.age(now)
	return ok && age <= t.cfg.MaxStaleness
}

// errStalled ends a watch that the probe found stalled.
var errStalled = errors.New("watch stalled: the stream moved on and the watch delivered nothing")

// watchLoop runs the watch that feeds the cache, restarting it (with a
// cache rebuilt from nothing) when it ends or stalls, with a bounded
// backoff, until the table closes. ready is closed once the first watch
// has delivered every existing binding.
func (t *Table) watchLoop(ready chan struct{}) {
	defer t.wg.Done()
	const minBackoff, maxBackoff = 100 * time.Millisecond, 5 * time.Second
	backoff := minBackoff
	episode := false // a failure was logged and not yet its recovery
	// Open waits for the first watch that delivers every existing binding,
	// which need not be the first watch started.
	opened := false
	for first := true; ; first = false {
		if !first {
			t.cache.reset()
			t.proof.reset()
		}
		recovered := func() {
			backoff = minBackoff
			if episode {
				episode = false
				t.cfg.Logger.Info("bindings: watch recovered; reads use the cache again", "bucket", t.cfg.Bucket)
			}
			if !opened {
				opened = true
				close(ready)
			}
		}
		err := t.watchOnce(recovered)
		if t.closed.Load() {
			return
		}
		t.st.watchRestarts.Add(1)
		if !episode {
			episode = true
			t.cfg.Logger.Warn("bindings: watch lost; reading from the stream leader until it is back",
				"bucket", t.cfg.Bucket, "err", err)
		}
		select {
		case <-t.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// watchOnce runs one watch until it ends, stalls or the table closes,
// calling ready once it has delivered every existing binding.
func (t *Table) watchOnce(ready func()) error {
	select {
	case <-t.restart: // a stall of the watch before this one
	default:
	}
	sent := time.Now()
	last, err := t.markWithin(t.probeTimeout)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(t.stopCtx)
	defer cancel()
	w, err := t.createWatch(ctx, cancel)
	if err != nil {
		return err
	}
	defer stopWatch(w)
	for {
		select {
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return fmt.Errorf("watch of bucket %q ended", t.cfg.Bucket)
			case e == nil:
				t.proof.snapshotDone(last, sent)
				if ready != nil {
					ready()
					ready = nil
				}
			default:
				if e.Key() != quorumKey {
					t.cache.apply(e)
				}
				t.proof.delivered(e.Revision(), time.Now())
			}
		case <-t.restart:
			return errStalled
		case <-t.stop:
			return nil
		}
	}
}

// watchCreateTimeout bounds the creation of one watch: its ctx is also the
// watch's lifetime, so a lost reply to the consumer create (a cluster
// electing its meta leader answers nothing) would otherwise hang it for
// good, and with it the table's Open.
const watchCreateTimeout = 5 * time.Second

// createWatch starts a watch of every key under ctx, cancelling ctx (so
// that the create returns) when it takes longer than watchCreateTimeout;
// watchLoop then tries again.
func (t *Table) createWatch(ctx context.Context, cancel context.CancelFunc) (jetstream.KeyWatcher, error) {
	type created struct {
		w   jetstream.KeyWatcher
		err error
	}
	done := make(chan created, 1)
	go func() {
		w, err := t.kv.WatchAll(ctx)
		done <- created{w, err}
	}()
	timer := time.NewTimer(watchCreateTimeout)
	defer timer.Stop()
	select {
	case c := <-done:
		if c.err != nil {
			return nil, fmt.Errorf("watch bucket %q: %w", t.cfg.Bucket, c.err)
		}
		return c.w, nil
	case <-timer.C:
	}
	cancel()
	if c := <-done; c.err == nil {
		stopWatch(c.w)
	}
	return nil, fmt.Errorf("watch bucket %q: no reply to the watch's create within %v", t.cfg.Bucket, watchCreateTimeout)
}

// stopWatch stops w and drains its channel: the subscription's callback
// blocks while the channel is full, so its goroutine could not end.
func stopWatch(w jetstream.KeyWatcher) {
	_ = w.Stop()
	timeout := time.After(2 * time.Second)
	for {
		select {
		case _, ok := <-w.Updates():
			if !ok {
				return
			}
		case <-timeout:
			return
		}
	}
}

// probeLoop writes a quorum mark every MaxStaleness/4 and restarts the
// watch when it has stalled.
func (t *Table) probeLoop() {
	defer t.wg.Done()
	tick := time.NewTicker(t.cfg.MaxStaleness / 4)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
		}
		sent := time.Now()
		last, err := t.markWithin(t.probeTimeout)
		if err != nil {
			t.st.probeErrors.Add(1)
			continue // no proof this time; a leader change passes
		}
		t.st.probes.Add(1)
		t.proof.answered(probe{sent: sent, last: last})
		if t.proof.stalled(time.Now(), t.stallAfter) {
			select {
			case t.restart <- struct{}{}:
			default:
			}
		}
	}
}

// markWithin writes a quorum mark, waiting at most timeout.
func (t *Table) markWithin(timeout time.Duration) (uint64, error) {
	ctx, cancel := context.WithTimeout(t.stopCtx, timeout)
	defer cancel()
	return t.mark(ctx)
}
