package replay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workers/sim"
)

// fakeStack is an in-memory fleet: each worker has an unbounded prefix cache
// keyed by block hash; "generate" answers at once with the cached tokens and
// a TTFT from the timing model. Its router implements the policies crudely
// (events/true-cache: longest cached prefix; round-robin; anything else:
// random) so that the driver's plumbing and orderings can be tested without
// NATS.
type fakeStack struct {
	cfg     StackConfig
	mu      sync.Mutex
	caches  map[string]map[uint64]bool
	workers []string
	rr      int
	rnd     *rand.Rand
	// accounting checked by tests
	routes, prefills, frees atomic.Int64
	sessions, pins          atomic.Int64
	routingKeys             atomic.Int64 // routes whose routing key is their session id
	rejectEvery             int
	// what the router was told of each reply's length (ExpectedOutput) and
	// what the engine was asked to generate, by request id (under mu)
	expected, generated map[string]int
}

func newFakeFactory(track *[]*fakeStack, rejectEvery int) StackFactory {
	var mu sync.Mutex
	return func(ctx context.Context, cfg StackConfig) (Stack, error) {
		s := &fakeStack{cfg: cfg, caches: map[string]map[uint64]bool{}, rnd: rand.New(rand.NewPCG(1, 2)), rejectEvery: rejectEvery,
			expected: map[string]int{}, generated: map[string]int{}}
		for i := 0; i < cfg.Workers; i++ {
			w := fmt.Sprintf("w%d", i)
			s.workers = append(s.workers, w)
			s.caches[w] = map[uint64]bool{}
		}
		mu.Lock()
		*track = append(*track, s)
		mu.Unlock()
		return s, nil
	}
}

func (s *fakeStack) Router() Router       { return (*fakeRouter)(s) }
func (s *fakeStack) Generator() Generator { return (*fakeGen)(s) }
func (s *fakeStack) Workers() []string    { return s.workers }
func (s *fakeStack) Probe() CacheProbe {
	if !s.cfg.Probe {
		return nil
	}
	return (*fakeProbe)(s)
}
func (s *fakeStack) Close(context.Context) error { return nil }
func (s *fakeStack) Loads() LoadProbe            { return nil }

type fakeProbe fakeStack

func (p *fakeProbe) CachedPrefix(hs []kvevents.SeqHash, out map[string]int) {
	s := (*fakeStack)(p)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.workers {
		n := 0
		for n < len(hs) && s.caches[w][uint64(hs[n])] {
			n++
		}
		out[w] = n
	}
}

type fakeRouter fakeStack

func (r *fakeRouter) Route(ctx context.Context, req *RouteRequest) (*Routed, error) {
	s := (*fakeStack)(r)
	n := s.routes.Add(1)
	if req.SessionID != "" {
		s.sessions.Add(1)
	}
	if req.RoutingKey != "" {
		s.routingKeys.Add(1)
	}
	if s.rejectEvery > 0 && n%int64(s.rejectEvery) == 0 {
		return nil, &RouteError{Code: "overloaded", Rejected: true, Err: errors.New("full")}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expected[req.ID] = req.ExpectedOutput
	var w string
	switch {
	case req.Pin != "" || req.Prefer != "":
		s.pins.Add(1)
		w = req.Pin + req.Prefer
	case s.cfg.Policy.RouterPolicy == "round-robin":
		w = s.workers[s.rr%len(s.workers)]
		s.rr++
	case s.cfg.Policy.RouterPolicy == "default" && s.cfg.Policy.Events:
		best := -1
		for _, c := range s.workers {
			k := 0
			for k < len(req.BlockHashes) && s.caches[c][req.BlockHashes[k]] {
				k++
			}
			if k > best {
				best, w = k, c
			}
		}
		if best == 0 {
			w = s.workers[s.rnd.IntN(len(s.workers))]
		}
	default:
		w = s.workers[s.rnd.IntN(len(s.workers))]
	}
	return &Routed{Worker: w, Endpoint: "ep." + w, Handle: req.BlockHashes}, nil
}

func (r *fakeRouter) PrefillDone(ctx context.Context, x *Routed) error {
	(*fakeStack)(r).prefills.Add(1)
	return nil
}

func (r *fakeRouter) Free(ctx context.Context, x *Routed) error {
	(*fakeStack)(r).frees.Add(1)
	return nil
}

type fakeGen fakeStack

func (g *fakeGen) Generate(ctx context.Context, endpoint string, req *sim.GenerateRequest, first func()) (*sim.GenerateReply, error) {
	s := (*fakeStack)(g)
	w := endpoint[len("ep."):]
	toks, err := req.Tokens()
	if err != nil {
		return nil, err
	}
	hs := kvevents.SeqHashes(nil, toks, s.cfg.BlockSize, kvevents.SeedFor("", ""))
	s.mu.Lock()
	s.generated[req.RequestID] = req.MaxTokens
	k := 0
	for k < len(hs) && s.caches[w][uint64(hs[k])] {
		k++
	}
	for _, h := range hs {
		s.caches[w][uint64(h)] = true
	}
	s.mu.Unlock()
	first()
	uncached := len(toks) - k*s.cfg.BlockSize
	ttft := sim.DefaultTiming().PrefillMs(uncached)
	return &sim.GenerateReply{RequestID: req.RequestID, Done: true, Worker: w, PromptTokens: len(toks), CachedTokens: k * s.cfg.BlockSize,
		OutputTokens: req.MaxTokens, TTFTMs: ttft, ITLMs: 10, E2EMs: ttft + 10*float64(req.MaxTokens-1)}, nil
}
