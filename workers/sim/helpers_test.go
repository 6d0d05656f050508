package sim

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// zmq4's parked goroutines behind closed sockets (testutil.IgnoreZMQ4);
	// everything else must stop.
	goleak.VerifyTestMain(m, append(testutil.IgnoreZMQ4(), testutil.IgnoreNATSAsyncReply())...)
}

// recorder is an in-memory EventEmitter that deep-copies what it gets.
type recorder struct {
	mu     sync.Mutex
	rank   uint32
	epoch  uint64
	events []kvevents.Event
	closed bool
	fail   error // returned by Emit when set
}

func (r *recorder) Emit(ev kvevents.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("recorder: emit after close")
	}
	if r.fail != nil {
		return r.fail
	}
	ev.Blocks = slices.Clone(ev.Blocks)
	ev.Removed = slices.Clone(ev.Removed)
	r.events = append(r.events, ev)
	return nil
}

func (r *recorder) Close(context.Context) error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	return nil
}

func (r *recorder) take() []kvevents.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}

func (r *recorder) all() []kvevents.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// recorders hands out one recorder per (rank, epoch) and remembers them.
type recorders struct {
	mu  sync.Mutex
	all []*recorder
}

func (rs *recorders) factory(rank uint32, epoch uint64) (EventEmitter, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r := &recorder{rank: rank, epoch: epoch}
	rs.all = append(rs.all, r)
	return r, nil
}

// latest returns the newest recorder of rank.
func (rs *recorders) latest(rank uint32) *recorder {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for i := len(rs.all) - 1; i >= 0; i-- {
		if rs.all[i].rank == rank {
			return rs.all[i]
		}
	}
	return nil
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newTestEngine builds an engine on a fresh virtual clock with recording
// emitters; cfg's zero fields get small-test defaults.
func newTestEngine(t testing.TB, cfg Config) (*Engine, *recorders, *VirtualClock) {
	t.Helper()
	if cfg.Worker == "" {
		cfg.Worker = "w1"
	}
	if cfg.Model == "" {
		cfg.Model = "m"
	}
	clk := NewVirtualClock(t0)
	if cfg.Clock == nil {
		cfg.Clock = clk
	}
	rs := &recorders{}
	if cfg.NewEmitter == nil {
		cfg.NewEmitter = rs.factory
	}
	n := uint64(0)
	if cfg.NewEpoch == nil {
		cfg.NewEpoch = func() uint64 { n++; return n }
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e, rs, clk
}

// seq returns n tokens start, start+1, ...
func seq(start, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}

func cat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func submit(t testing.TB, e *Engine, req Request) *Stream {
	t.Helper()
	st, err := e.Submit(context.Background(), req)
	if err != nil {
		t.Fatalf("Submit %q: %v", req.ID, err)
	}
	return st
}

func runIdle(t testing.TB, e *Engine) {
	t.Helper()
	if err := e.RunUntilIdle(context.Background()); err != nil {
		t.Fatalf("RunUntilIdle: %v", err)
	}
}

func result(t testing.TB, st *Stream) Result {
	t.Helper()
	res, ok := st.Result()
	if !ok {
		t.Fatalf("request %s has not finished", st.ID())
	}
	return res
}

func prefillDur(tokens int) time.Duration { return msToDuration(DefaultTiming().PrefillMs(tokens)) }

// mirror is a minimal router-side view built only from events: per
// (worker, rank) engine hash -> sequence hash. apply rejects events that a
// consistent engine never sends.
type mirror struct {
	t      testing.TB
	blocks map[workerref.Target]map[kvevents.EngineHash]kvevents.SeqHash
}

func newMirror(t testing.TB) *mirror {
	return &mirror{t: t, blocks: map[workerref.Target]map[kvevents.EngineHash]kvevents.SeqHash{}}
}

// apply fails the test on an inconsistent event (test goroutine only).
func (m *mirror) apply(k workerref.Target, evs []kvevents.Event) {
	m.t.Helper()
	if err := m.applyErr(k, evs); err != nil {
		m.t.Fatal(err)
	}
}

func (m *mirror) applyErr(k workerref.Target, evs []kvevents.Event) error {
	bs := m.blocks[k]
	if bs == nil {
		bs = map[kvevents.EngineHash]kvevents.SeqHash{}
		m.blocks[k] = bs
	}
	for _, ev := range evs {
		if ev.Tier != kvevents.TierDevice {
			return fmt.Errorf("%v: event tier %v", k, ev.Tier)
		}
		switch ev.Kind {
		case kvevents.KindStored:
			if ev.HasParent {
				if _, ok := bs[ev.Parent]; !ok {
					return fmt.Errorf("%v: stored with unknown parent %x", k, ev.Parent)
				}
			}
			for _, b := range ev.Blocks {
				if _, dup := bs[b.Engine]; dup {
					return fmt.Errorf("%v: block %x stored twice", k, b.Engine)
				}
				bs[b.Engine] = b.Seq
			}
		case kvevents.KindRemoved:
			for _, h := range ev.Removed {
				if _, ok := bs[h]; !ok {
					return fmt.Errorf("%v: removed unknown block %x", k, h)
				}
				delete(bs, h)
			}
		case kvevents.KindCleared:
			clear(bs)
		default:
			return fmt.Errorf("%v: event kind %v", k, ev.Kind)
		}
	}
	return nil
}

func (m *mirror) seqs(k workerref.Target) []kvevents.SeqHash {
	out := []kvevents.SeqHash{}
	for _, s := range m.blocks[k] {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}
