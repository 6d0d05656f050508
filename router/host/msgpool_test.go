package host

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/nats-io/nats.go"
)

// The route pool keeps a goroutine between messages, starts one when none
// is idle, keeps at most maxIdle, lets an idle one go after idleFor, and
// ends them all when stop closes.
func TestMsgPool(t *testing.T) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[string]int{}
	release := make(chan struct{})
	p := newMsgPool(func(m *nats.Msg) {
		mu.Lock()
		seen[m.Subject]++
		mu.Unlock()
		if m.Subject == "block" {
			<-release
		}
	}, stop, &wg)
	handled := func(subject string, n int) {
		t.Helper()
		testutil.Eventually(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return seen[subject] == n },
			func() string { return fmt.Sprintf("%s not handled %d times", subject, n) })
	}
	p.maxIdle, p.idleFor = 2, time.Hour
	idle := func(n int32) {
		t.Helper()
		testutil.Eventually(t, 5*time.Second, func() bool { return p.idle.Load() == n },
			func() string { return fmt.Sprintf("%d idle goroutines, want %d", p.idle.Load(), n) })
	}
	// A goroutine counts itself idle just before it waits on the work
	// channel; run hands a message only to one already waiting. So before
	// a message that must reuse it, wait until it really waits there.
	// (CI sent "b" in between and saw two idle goroutines.)
	parked := func(n int) {
		t.Helper()
		testutil.Eventually(t, 5*time.Second, func() bool { return waitingServers() == n },
			func() string { return fmt.Sprintf("%d goroutines waiting for work, want %d", waitingServers(), n) })
	}

	// One at a time: the second message goes to the goroutine the first
	// left idle (one idle goroutine, not two).
	p.run(&nats.Msg{Subject: "a"})
	handled("a", 1)
	idle(1)
	parked(1)
	p.run(&nats.Msg{Subject: "b"})
	handled("b", 1)
	idle(1)
	parked(1)

	// Five at once: new goroutines for the four the idle one cannot take;
	// when they finish, two stay and three end.
	for range 5 {
		p.run(&nats.Msg{Subject: "block"})
	}
	handled("block", 5)
	idle(0)
	close(release)
	idle(2)

	// stop ends the idle ones; the group then drains.
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("goroutines left after stop: %d idle", p.idle.Load())
	}
}

// waitingServers counts the msgPool goroutines blocked in serve's wait
// for work (no test in this package runs in parallel, and a closed
// replica's pool goroutines have ended, so they are TestMsgPool's).
func waitingServers() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.HasPrefix(g, "goroutine ") && strings.Contains(g, " [select") && strings.Contains(g, ".(*msgPool).serve(") {
			n++
		}
	}
	return n
}

// An idle goroutine ends after idleFor.
func TestMsgPoolIdleExpiry(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	var wg sync.WaitGroup
	p := newMsgPool(func(*nats.Msg) {}, stop, &wg)
	p.idleFor = 10 * time.Millisecond
	p.run(&nats.Msg{Subject: "a"})
	testutil.Eventually(t, 5*time.Second, func() bool { return p.idle.Load() == 0 }, func() string { return "the idle goroutine stayed" })
	wg.Wait()
}
