package host

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// msgPool runs a message handler off the subscription's goroutine on
// goroutines kept between messages. A goroutine started per message
// begins on a small stack and grows it on every route (runtime.copystack
// was about 13 µs of CPU per route in BenchmarkRouteNATS's profile,
// docs/benchmarks/scheduler.md); a kept one grew it once.
//
// A message goes to an idle goroutine when one is waiting, else to a new
// one; a goroutine that finishes waits for the next message while fewer
// than maxIdle others wait, for at most idleFor, and until stop closes.
type msgPool struct {
	handle  func(*nats.Msg)
	work    chan *nats.Msg // unbuffered: a send succeeds only into a waiting goroutine
	stop    <-chan struct{}
	idle    atomic.Int32
	maxIdle int32
	idleFor time.Duration
	wg      *sync.WaitGroup // the replica's background group: Close waits for it
}

const (
	msgPoolMaxIdle = 64
	msgPoolIdleFor = 10 * time.Second
)

func newMsgPool(handle func(*nats.Msg), stop <-chan struct{}, wg *sync.WaitGroup) *msgPool {
	return &msgPool{handle: handle, work: make(chan *nats.Msg), stop: stop, wg: wg, maxIdle: msgPoolMaxIdle, idleFor: msgPoolIdleFor}
}

// run hands m to an idle goroutine or starts one.
func (p *msgPool) run(m *nats.Msg) {
	select {
	case p.work <- m:
	default:
		p.wg.Add(1)
		go p.serve(m)
	}
}

func (p *msgPool) serve(m *nats.Msg) {
	defer p.wg.Done()
	p.handle(m)
	var t *time.Timer
	for p.idle.Add(1) <= p.maxIdle {
		if t == nil {
			t = time.NewTimer(p.idleFor)
			defer t.Stop()
		} else {
			t.Reset(p.idleFor)
		}
		select {
		case m = <-p.work:
			p.idle.Add(-1)
			p.handle(m)
			continue
		case <-t.C:
		case <-p.stop:
		}
		break
	}
	p.idle.Add(-1)
}
