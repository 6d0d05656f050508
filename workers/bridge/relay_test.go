package bridge

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/kvevents/vllmzmq"
	"github.com/kvrouter/kvrouter/workerref"
)

// relay sits between an engine's PUB socket and a bridge: it forwards
// every message except those drop says to lose, as a lossy network or a
// full high-water mark would.
type relay struct {
	sub      *vllmzmq.Subscriber
	pub      zmq4.Socket
	endpoint string
	mu       sync.Mutex
	drop     func(seq uint64) bool
	dropped  int
	stop     context.CancelFunc
	done     chan struct{}
}

func startRelay(t *testing.T, from string) *relay {
	t.Helper()
	sub, err := vllmzmq.NewSubscriber(vllmzmq.SubscriberConfig{Endpoint: from})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pub := zmq4.NewPub(ctx)
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	r := &relay{sub: sub, pub: pub, endpoint: "tcp://" + pub.Addr().String(), stop: cancel, done: make(chan struct{}),
		drop: func(uint64) bool { return false }}
	go r.run(ctx)
	t.Cleanup(func() { cancel(); sub.Close(); <-r.done; pub.Close() })
	return r
}

func (r *relay) run(ctx context.Context) {
	defer close(r.done)
	for {
		m, err := r.sub.Recv(ctx)
		if err != nil {
			return
		}
		r.mu.Lock()
		lose := r.drop(m.Seq)
		if lose {
			r.dropped++
		}
		r.mu.Unlock()
		if lose {
			continue
		}
		r.pub.SendMulti(zmq4.NewMsgFrom([]byte(m.Topic), binary.BigEndian.AppendUint64(nil, m.Seq), m.Payload))
	}
}

func (r *relay) setDrop(f func(uint64) bool) {
	r.mu.Lock()
	r.drop = f
	r.mu.Unlock()
}

func (r *relay) droppedN() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dropped
}

func counter(b *Bridge, name string) float64 {
	fams, err := b.met.reg.Gather()
	if err != nil {
		return -1
	}
	total := 0.0
	for _, f := range fams {
		if f.GetName() == "kvr_bridge_"+name {
			for _, m := range f.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

func waitRegistered(t *testing.T, f *fleet, id string) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, func() bool { _, ok := registered(t, f.js, id); return ok },
		func() string { return "worker " + id + " to register" })
}

// bridged is engine w1 with o and a registered bridge on it (its config
// changed by mutate when not nil).
func bridged(t *testing.T, o engineOpts, mutate func(*Config, *engine)) (*fleet, *engine, *running) {
	t.Helper()
	f := newFleet(t)
	e := startEngine(t, "w1", o)
	cfg := bridgeCfg(e, "w1")
	if mutate != nil {
		mutate(&cfg, e)
	}
	br := runBridge(t, f, cfg)
	waitRegistered(t, f, "w1")
	return f, e, br
}

// relayed is bridged with the events going through a relay; a first
// workload has converged.
func relayed(t *testing.T, o engineOpts) (*fleet, *engine, *relay, *running) {
	t.Helper()
	var rl *relay
	f, e, br := bridged(t, o, func(c *Config, e *engine) {
		rl = startRelay(t, e.eventsEndpoint())
		c.KVEvents = rl.endpoint
	})
	e.workload(t, 0, 5, 1)
	converged(t, f, e, "w1")
	return f, e, rl, br
}

// Lost frames are replayed from the engine's replay socket and the index
// converges without a resync.
func TestGapIsReplayed(t *testing.T) {
	f, e, rl, br := relayed(t, engineOpts{kvBlocks: 48})
	resyncs := counter(br.b, "resyncs_total")
	rl.setDrop(func(seq uint64) bool { return seq%3 == 0 })
	e.workload(t, 0, 40, 2)
	rl.setDrop(func(uint64) bool { return false })
	e.workload(t, 0, 3, 3) // a frame after the last loss reveals it
	converged(t, f, e, "w1")
	if rl.droppedN() == 0 || counter(br.b, "gaps_total") == 0 || counter(br.b, "replays_total") < 2 {
		t.Fatalf("dropped %d, gaps %v, replays %v: the test lost nothing", rl.droppedN(),
			counter(br.b, "gaps_total"), counter(br.b, "replays_total"))
	}
	if got := counter(br.b, "resyncs_total"); got != resyncs {
		t.Fatalf("resyncs %v -> %v: a replayable gap must not resync", resyncs, got)
	}
}

// Losing more than buffer_steps batches makes the replay late: the bridge
// resyncs (routers clear the rank), and once the engine has evicted what
// it held before, the index equals its cache again. With the simulator a
// resync can only clear: vLLM's protocol has no way to ask an engine for
// the blocks it holds, so blocks stored before the loss stay unknown to
// routers until the engine evicts them (an under-count, never a phantom).
func TestOverrunResyncs(t *testing.T) {
	f, e, rl, br := relayed(t, engineOpts{kvBlocks: 48, bufferSteps: 4})
	rl.setDrop(func(uint64) bool { return true })
	e.workload(t, 0, 20, 2)
	// The relay reads asynchronously: under load it may not have seen
	// (and lost) any of the workload's frames yet.
	testutil.Eventually(t, 15*time.Second, func() bool { return rl.droppedN() > 0 },
		func() string { return "the relay to lose the workload's frames" })
	rl.setDrop(func(uint64) bool { return false })
	// Generous: one replay request may take up to ReplayTimeout on a
	// loaded machine before its failure is a resync too.
	testutil.Eventually(t, 15*time.Second, func() bool {
		e.workload(t, 0, 1, 4)
		return counter(br.b, "resyncs_total") > 0
	}, func() string {
		return fmt.Sprintf("a resync after the overrun (dropped %d, gaps %v, replays %v)", rl.droppedN(),
			counter(br.b, "gaps_total"), counter(br.b, "replays_total"))
	})
	// Once the events in flight have arrived (the engine is idle), the
	// index holds no block the engine does not.
	phantom := 0
	testutil.Eventually(t, 5*time.Second, func() bool {
		phantom = extra(f.mirror.seqs(key("w1")), e.eng.Dump()[key("w1")])
		return phantom == 0
	}, func() string { return fmt.Sprintf("no phantom blocks after the resync (%d)", phantom) })
	// Prompts of new families evict everything stored before the loss.
	// (Prompts on the old prefixes would not converge: the engine keeps
	// those first blocks cached and never announces them again.)
	e.workload(t, 0, 60, 5)
	converged(t, f, e, "w1")
}

func key(w string) workerref.Target { return workerref.Target{Worker: w} }

// extra counts the hashes of got that are not in want (both sorted).
func extra(got, want []kvevents.SeqHash) int { return len(got) - common(got, want) }

// An engine restart (seq back to 0, empty cache) clears the rank; the
// index follows the new incarnation.
func TestEngineRestart(t *testing.T) {
	f, e, br := bridged(t, engineOpts{kvBlocks: 48}, nil)
	e.workload(t, 0, 15, 1)
	converged(t, f, e, "w1")
	if err := e.eng.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.workload(t, 0, 5, 2)
	converged(t, f, e, "w1")
	if counter(br.b, "resyncs_total") == 0 {
		t.Fatal("no resync counted for the restart")
	}
}

// A bridge restart replays the engine's buffer from seq 0 under a new
// publisher epoch: routers drop the old epoch's blocks and rebuild from the
// replay, so they end with exactly the engine's cache, and never hold a
// block the engine dropped meanwhile.
func TestBridgeRestart(t *testing.T) {
	f, e, br := bridged(t, engineOpts{kvBlocks: 48}, nil)
	e.workload(t, 0, 15, 1)
	converged(t, f, e, "w1")
	if err := br.halt(t); err != nil {
		t.Fatal(err)
	}
	e.workload(t, 0, 20, 2) // while no bridge runs
	br2 := runBridge(t, f, bridgeCfg(e, "w1"))
	waitRegistered(t, f, "w1")
	converged(t, f, e, "w1")
	if counter(br2.b, "resyncs_total") != 0 {
		t.Fatal("the bridge resynced although the engine's buffer held everything")
	}
}
