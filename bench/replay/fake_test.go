package replay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
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
	// a split fleet's (StackConfig.Fleet): the prefill leg's round-robin
	// counter, the legs by the role of the worker they reached, and
	// decode legs that came before their prefill leg (under mu)
	rrPrefill                          int
	prefillLegs, decodeLegs, wrongRole int
	prefilled                          map[string]bool
	unordered                          int
	// accounting checked by tests
	routes, prefills, frees atomic.Int64
	prefillFrees            atomic.Int64 // frees of a split route's prefill booking
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
	if req.Pin != "" || req.Prefer != "" {
		s.pins.Add(1)
		w := req.Pin + req.Prefer
		return &Routed{Worker: w, Endpoint: "ep." + w, Handle: req.BlockHashes}, nil
	}
	if !req.PD {
		w := s.pick(req, s.workers, &s.rr)
		return &Routed{Worker: w, Endpoint: "ep." + w, Handle: req.BlockHashes}, nil
	}
	// a split fleet: the prefill workers first (Fleet.Roles), each leg
	// chosen among its own role with its own round-robin counter
	pre, dec := s.workers[:s.cfg.Fleet.Prefill], s.workers[s.cfg.Fleet.Prefill:]
	d, p := s.pick(req, dec, &s.rr), s.pick(req, pre, &s.rrPrefill)
	return &Routed{Worker: d, Endpoint: "ep." + d, Handle: "decode",
		Prefill: &Routed{Worker: p, Endpoint: "ep." + p, Handle: "prefill"}}, nil
}

// pick is the crude policy over cands (under mu).
func (s *fakeStack) pick(req *RouteRequest, cands []string, rr *int) string {
	switch {
	case s.cfg.Policy.RouterPolicy == "round-robin":
		*rr++
		return cands[(*rr-1)%len(cands)]
	case s.cfg.Policy.RouterPolicy == "default" && s.cfg.Policy.Events:
		best, w := -1, ""
		for _, c := range cands {
			k := 0
			for k < len(req.BlockHashes) && s.caches[c][req.BlockHashes[k]] {
				k++
			}
			if k > best {
				best, w = k, c
			}
		}
		if best > 0 {
			return w
		}
	}
	return cands[s.rnd.IntN(len(cands))]
}

func (r *fakeRouter) PrefillDone(ctx context.Context, x *Routed) error {
	(*fakeStack)(r).prefills.Add(1)
	return nil
}

func (r *fakeRouter) Free(ctx context.Context, x *Routed) error {
	s := (*fakeStack)(r)
	s.frees.Add(1)
	if x.Handle == "prefill" {
		s.prefillFrees.Add(1)
	}
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
	k := 0
	for k < len(hs) && s.caches[w][uint64(hs[k])] {
		k++
	}
	for _, h := range hs {
		s.caches[w][uint64(h)] = true
	}
	out := &sim.GenerateReply{RequestID: req.RequestID, Done: true, Worker: w, PromptTokens: len(toks), CachedTokens: k * s.cfg.BlockSize,
		OutputTokens: req.MaxTokens}
	uncached := len(toks) - k*s.cfg.BlockSize
	switch {
	case req.RemoteDecode:
		s.leg(w, req.RequestID, true)
		if req.MaxTokens != 1 {
			s.wrongRole++ // a prefill leg generates one token
		}
		out.RemoteBlocks = len(hs)
	case req.RemoteBlocks > 0:
		s.leg(w, req.RequestID, false)
		out.PulledBlocks = max(0, req.RemoteBlocks-k)
		out.TransferMs = 0.1 * float64(out.PulledBlocks)
		uncached = len(toks) - req.RemoteBlocks*s.cfg.BlockSize
		s.generated[req.RequestID] = req.MaxTokens
	default:
		s.generated[req.RequestID] = req.MaxTokens
	}
	s.mu.Unlock()
	first()
	out.TTFTMs = sim.DefaultTiming().PrefillMs(uncached)
	out.ITLMs, out.E2EMs = 10, out.TTFTMs+10*float64(req.MaxTokens-1)
	return out, nil
}

// leg counts a split request's leg on worker w (under mu).
func (s *fakeStack) leg(w, id string, prefill bool) {
	isPrefill := slices.Index(s.workers, w) < s.cfg.Fleet.Prefill
	if isPrefill != prefill {
		s.wrongRole++
	}
	if s.prefilled == nil {
		s.prefilled = map[string]bool{}
	}
	if prefill {
		s.prefillLegs++
		s.prefilled[id] = true
		return
	}
	s.decodeLegs++
	if !s.prefilled[id] {
		s.unordered++
	}
}
