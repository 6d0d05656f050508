package scheduler

// The peers' routing algorithms as builtins (issue 17), so that a replay can
// compare kvrouter's default policy with what the other routers do, on the
// same fleet, the same index and the same load view. Each type names the
// source it follows. Where a peer reads an input the scheduler's view does
// not have, the doc comment says which input stands in for it. Beyond the
// selection, each peer's own admission and session affinity are recorded
// as its Operation (issue 24), for a comparison to run the peer as its
// authors run it. TwoTier, kvrouter's own variant of SGLang's decision,
// stands beside SGLang because it decides with it (SGLang.tier) and only
// picks differently.

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/workerref"
	"github.com/zeebo/xxh3"
	"go.yaml.in/yaml/v3"
)

// Operation is how a policy's authors run their router around its
// selection by default: the admission in front of the workers, the
// session affinity, and whether it remembers its own routing decisions as
// cached until the engines' events arrive. A comparison that runs a peer as its authors run it
// applies these instead of kvrouter's own (bench/replay does).
type Operation struct {
	// Thresholds are the router-side queue and overload thresholds; the
	// zero value is none: every request goes to a worker at once and
	// queues in the engine.
	Thresholds Thresholds
	// SessionMode is the binding mode ("hard" or "soft") of the router's
	// own session affinity for requests that carry a session id, or ""
	// when the algorithm has none: its requests are routed without one.
	// Soft hands the bound worker to the policy as the Soft target (llmd
	// scores it); Hard confines selection to it (the pin rule).
	SessionMode string
	// PredictOnRoute is how long the router counts a prompt it has just
	// routed as cached on the chosen worker, before that worker's Stored
	// events arrive (kvrouter's predicted index, Dynamo's
	// --router-predicted-ttl-secs, llm-d's speculative indexing); 0 = it
	// does not, and siblings routed before the first event find no holder.
	PredictOnRoute time.Duration
	// Source says where the defaults are documented.
	Source string
}

// Operation returns the admission and session affinity the named policy's
// authors run it with by default; false for a policy without such a record
// (kvrouter's own: they run with the scheduler's Config).
func (r *Registry) Operation(name string) (Operation, bool) {
	op, ok := r.ops[name]
	return op, ok
}

// registerPeers adds the peer policies (llmd, sglang, dynamo, chwbl), their
// Operations and llm-d's scorers (llmd-prefix, llmd-queue,
// llmd-kv-utilization, llmd-session-affinity) to r.
func registerPeers(r *Registry) {
	r.policies["llmd"] = func(_ *Registry, n *yaml.Node) (Policy, error) {
		var o struct {
			PrefixWeight  float64 `yaml:"prefix_weight"`
			QueueWeight   float64 `yaml:"queue_weight"`
			KVWeight      float64 `yaml:"kv_utilization_weight"`
			SessionWeight float64 `yaml:"session_affinity_weight"`
		}
		o.PrefixWeight, o.QueueWeight, o.KVWeight, o.SessionWeight = 3, 2, 2, 1
		if err := decodeParams(n, &o); err != nil {
			return nil, err
		}
		if !nonNegative(o.PrefixWeight, o.QueueWeight, o.KVWeight, o.SessionWeight) {
			return nil, fmt.Errorf("%w: llmd weights must be finite numbers >= 0: %+v", ErrInvalidConfig, o)
		}
		return newLLMD(o.PrefixWeight, o.QueueWeight, o.KVWeight, o.SessionWeight), nil
	}
	r.policies["sglang"] = func(_ *Registry, n *yaml.Node) (Policy, error) {
		p := NewSGLang()
		if err := decodeParams(n, p); err != nil {
			return nil, err
		}
		if !nonNegative(p.CacheThreshold, p.BalanceAbs, p.BalanceRel) {
			return nil, fmt.Errorf("%w: sglang thresholds must be finite numbers >= 0: %+v", ErrInvalidConfig, *p)
		}
		return p, nil
	}
	// Dynamo's current default cost: the default policy with Dynamo's
	// weights (DynamoCostParams), which are no longer kvrouter's defaults
	// (docs/benchmarks.md, "Default policy experiments"), and Dynamo's
	// accounting: output blocks are not booked unless track_output_blocks
	// (--router-track-output-blocks, default false). Temperature, seed and
	// that switch are its only parameters: other weights are not Dynamo's
	// cost, and `default` takes them.
	r.policies["dynamo"] = func(_ *Registry, n *yaml.Node) (Policy, error) {
		var o struct {
			Temperature       float64 `yaml:"temperature"`
			Seed              *uint64 `yaml:"seed"`
			TrackOutputBlocks bool    `yaml:"track_output_blocks"`
		}
		if err := decodeParams(n, &o); err != nil {
			return nil, err
		}
		if !nonNegative(o.Temperature) {
			return nil, fmt.Errorf("%w: dynamo temperature must be a finite number >= 0, got %v", ErrInvalidConfig, o.Temperature)
		}
		p := NewDynamoPolicy(o.Temperature)
		p.NoOutputBlocks = !o.TrackOutputBlocks
		if o.Seed != nil {
			p.SeedValue, p.HasSeed = *o.Seed, true
		}
		return p, nil
	}
	r.policies["chwbl"] = func(_ *Registry, n *yaml.Node) (Policy, error) {
		p := NewCHWBL()
		if err := decodeParams(n, p); err != nil {
			return nil, err
		}
		if !(p.LoadFactor >= 1) || p.Replication < 1 || p.Replication > 4096 || p.PrefixChars < 1 {
			return nil, fmt.Errorf("%w: chwbl wants load_factor >= 1, replication 1..4096, prefix_chars >= 1: %+v",
				ErrInvalidConfig, p.params())
		}
		return p, nil
	}
	for name, s := range map[string]Scorer{
		"llmd-prefix":           LLMDPrefixScorer{},
		"llmd-queue":            LLMDQueueScorer{},
		"llmd-kv-utilization":   LLMDKVUtilizationScorer{},
		"llmd-session-affinity": LLMDSessionAffinityScorer{},
	} {
		r.scorers[name] = func(n *yaml.Node) (Scorer, error) { return s, decodeParams(n, &struct{}{}) }
	}
	for name, op := range peerOperations {
		r.ops[name] = op
	}
}

// peerOperations are the peers' default admission, session affinity and
// predict-on-route, from the sources named (checked against their upstream defaults for
// issue 24). None of the four queues requests in the router by default.
var peerOperations = map[string]Operation{
	// llm-d's default profile's prefix-cache-scorer (GIE's) has no
	// events: it indexes each prompt for the chosen endpoint as it routes
	// it (PreRequest) and keeps it in a per-endpoint LRU. Here it reads the
	// event-fed index (llm-d's precise scorer), and the predicted index (5 s,
	// the host's default) stands in for that insert.
	"llmd": {SessionMode: "soft", PredictOnRoute: 5 * time.Second, Source: "llm-d Router / GIE EPP: flow control, the only router-side queue, is off by default " +
		"(feature gate flowControl), and without it the saturation detector only sheds requests of negative priority; " +
		"session affinity is the session-affinity-scorer (strategy session_id, header x-session-id): 1 for the endpoint " +
		"the session last went to, at the weight a profile gives a scorer listed without one (1); the default profile's " +
		"prefix-cache-scorer indexes each prompt for its endpoint as it routes it"},
	// SGLang's default cache_aware tree (HTTP workers) has no events
	// either: it inserts each prompt into the chosen worker's tree as it
	// routes it. The same stand-in as llm-d's. Both keep an insert longer
	// than 5 s (until their LRU or periodic eviction), which this does not
	// model; with events beside it, the difference is the window before a
	// prompt's events arrive.
	"sglang": {PredictOnRoute: 5 * time.Second, Source: "SGLang Model Gateway (sgl-router): the rate limiter is off by default (--max-concurrent-requests -1); " +
		"cache_aware has no session affinity (the sticky X-SMG-Routing-Key belongs to the manual policy, header hashing " +
		"to consistent_hashing); its tree takes each prompt in as it is routed"},
	"dynamo": {SessionMode: "hard", Source: "Dynamo frontend: --router-queue-threshold unset (no router queue), busy " +
		"thresholds unset (no overload filter); session affinity, on once --router-session-affinity-ttl-secs is set, " +
		"defaults to --router-session-affinity-mode hard; --router-predicted-ttl-secs unset (no predict-on-route index)"},
	"chwbl": {Source: "KubeAI: the proxy queues nothing in front of the endpoints; PrefixHash has no session affinity " +
		"(routing on a header is the separate RoutingKey strategy) and no cache index"},
}

// NewLLMD returns llm-d's default scheduling profile as a Pipeline:
//
//	score = 3·prefix + 2·queue + 2·kv_utilization + 1·session_affinity, max-score picker
//
// with each scorer normalised to [0, 1] as llm-d defines it (the scorers
// below), and ties broken uniformly at random, as llm-d's max-score-picker
// does. Source: the default EndpointPickerConfig of the llm-d inference
// scheduler / Gateway API Inference Extension chart (prefix-cache-scorer
// weight 3, queue-scorer 2, kv-cache-utilization-scorer 2,
// max-score-picker), kubernetes-sigs/gateway-api-inference-extension
// pkg/epp/scheduling/framework/plugins (scorer/queue.go,
// scorer/kvcache_utilization.go, multi/prefix), as of 2026-08-18; llm-d
// Router of 2026-08-22 keeps the same profile. The session-affinity-scorer
// is llm-d's own affinity, which a deployment with sessions adds to the
// profile at the default weight of a scorer listed without one (1); it
// scores 0 everywhere for a request without a Soft target, so the profile
// is unchanged for them. A pipeline minimises cost, so every scorer here
// writes −score.
func NewLLMD() *Pipeline { return newLLMD(3, 2, 2, 1) }

func newLLMD(prefix, queue, kv, session float64) *Pipeline {
	return &Pipeline{
		PolicyName: "llmd",
		Scorers: []WeightedScorer{
			{Scorer: LLMDPrefixScorer{}, Weight: prefix},
			{Scorer: LLMDQueueScorer{}, Weight: queue},
			{Scorer: LLMDKVUtilizationScorer{}, Weight: kv},
			{Scorer: LLMDSessionAffinityScorer{}, Weight: session},
		},
		Picker: MinPicker{}, // on −score: llm-d's max-score-picker, random tie-break
	}
}

// LLMDPrefixScorer is llm-d's prefix-cache-scorer with its default weight
// w = 0 on the token term: score = matched blocks / prompt blocks, in
// [0, 1] (0 for a prompt without a full block). llm-d reads the matched
// blocks from its own prefix index; here they are the index's overlap for
// the candidate. Cost = −score.
type LLMDPrefixScorer struct{}

// Score implements Scorer.
func (LLMDPrefixScorer) Score(x *Context, c *Candidates, cost []float64) {
	total := x.RequestBlocks
	for i := range c.slots {
		if total <= 0 {
			cost[i] = 0
			continue
		}
		cost[i] = -min(1, float64(c.OverlapBlocks(i))/float64(total))
	}
}

// LLMDQueueScorer is llm-d's queue-scorer: score = (maxQ − q)/(maxQ − minQ)
// over the candidates, 1 for every candidate when all queues are equal.
// q is the engine's waiting queue as the worker's last load report gave it
// (Candidates.WaitingRequests), as llm-d's q is the engine's scraped
// num_requests_waiting: running requests and the routers' own bookings do
// not count. The report is as old as the worker's report interval (the
// replay's workers report every second of model time; llm-d scrapes every
// 50 ms); a worker without a live report counts 0. Cost = −score.
type LLMDQueueScorer struct{}

// Score implements Scorer.
func (LLMDQueueScorer) Score(_ *Context, c *Candidates, cost []float64) {
	waiting := c.f.waiting
	lo, hi := int32(math.MaxInt32), int32(math.MinInt32)
	for _, s := range c.slots {
		q := waiting[s]
		lo, hi = min(lo, q), max(hi, q)
	}
	for i, s := range c.slots {
		if hi == lo {
			cost[i] = -1
			continue
		}
		cost[i] = -float64(hi-waiting[s]) / float64(hi-lo)
	}
}

// LLMDKVUtilizationScorer is llm-d's kv-cache-utilization-scorer: score =
// 1 − KV usage. llm-d's usage is the engine's scraped kv_cache_usage_perc
// (blocks held by running requests over all blocks); here it is the decode
// blocks the routers booked on the worker over its KV blocks, clamped to
// [0, 1], and 0 (score 1) when the capacity is unknown. Cost = −score.
type LLMDKVUtilizationScorer struct{}

// Score implements Scorer.
func (LLMDKVUtilizationScorer) Score(_ *Context, c *Candidates, cost []float64) {
	for i, s := range c.slots {
		usage := 0.0
		if kv := c.f.kvBlocks[s]; kv > 0 {
			usage = min(1, max(0, float64(c.decode[s])/float64(kv)))
		}
		cost[i] = -(1 - usage)
	}
}

// LLMDSessionAffinityScorer is llm-d's session-affinity-scorer: score 1
// for the endpoint the request's session is bound to, 0 for the others.
// llm-d keeps the binding (strategy session_id: the pod the session last
// went to, rebound wherever a request lands, 300 s idle TTL); here it is
// the host's Soft session binding, handed to the policy as the Soft target
// (Context.Affinity), which a Soft binding also rebinds wherever the
// request lands. Without a Soft target every row scores 0. Cost = −score.
type LLMDSessionAffinityScorer struct{}

// Score implements Scorer.
func (LLMDSessionAffinityScorer) Score(_ *Context, c *Candidates, cost []float64) {
	for i := range c.slots {
		cost[i] = 0
		if c.IsAffinityTarget(i) {
			cost[i] = -1
		}
	}
}

// SGLang is SGLang's cache-aware load balancing as sgl-router's
// cache_aware policy decides (sgl-project/sglang
// sgl-router/src/policies/cache_aware.rs, the SGLang v0.4 router's design,
// which the SGLang Model Gateway's docs still describe), with the router's
// command-line defaults cache_threshold 0.3, balance_abs_threshold 64,
// balance_rel_threshold 1.5:
//
//  1. load = in-flight requests per worker. If max − min > BalanceAbs and
//     max > BalanceRel × min, the system is imbalanced: take the worker
//     with the smallest load (shortest queue).
//  2. Otherwise, match rate = the longest cached prefix among the workers
//     over the prompt's length. If it is > CacheThreshold, take the worker
//     the tree names for that prefix, whatever its load.
//  3. Otherwise take the worker with the smallest tree (the tenant with
//     the least cached text: the most free cache).
//
// Ties go to the first worker in (worker, rank) order: min_by_key keeps
// the first minimum in step 1 (which is why a cold fleet at low load sends
// its misses to one worker, sglang #32983), and in steps 2 and 3 SGLang
// takes whichever tenant its map yields first (tree.rs iter().next()): a
// fixed order unrelated to load, which candidate order stands in for.
// Inputs here: in-flight = the requests booked on the worker; the prefix
// match is the event-fed index's overlap in blocks over the prompt's full
// blocks (SGLang counts characters or tokens of its approximate tree); the
// tree size is the routing history SGLang's tree is made of: the blocks
// routed to the worker less their cached overlap when routed
// (Candidates.RoutedBlocks). Not the blocks the index holds: a full cache
// holds as many as any other, so every miss would tie and go to the first
// worker, while SGLang's tree keeps growing. The Model Gateway's
// code (lightseekorg/smg, as of 2026-08) has since moved step 3 to the
// least-loaded worker and breaks step 1 and 3 ties at random, and its
// event-driven mode routes on the indexer's overlap; this policy keeps
// sgl-router's decision.
type SGLang struct {
	CacheThreshold float64 `yaml:"cache_threshold"`
	BalanceAbs     float64 `yaml:"balance_abs_threshold"`
	BalanceRel     float64 `yaml:"balance_rel_threshold"`
}

// NewSGLang returns the policy with SGLang's router defaults 0.3, 64, 1.5.
func NewSGLang() *SGLang { return &SGLang{CacheThreshold: 0.3, BalanceAbs: 64, BalanceRel: 1.5} }

// Name implements Policy.
func (*SGLang) Name() string { return "sglang" }

// Select implements Policy.
func (p *SGLang) Select(x *Context, c *Candidates) (int, error) {
	if c.Len() == 0 {
		return 0, ErrNoCandidate
	}
	switch tier, bestOv := p.tier(x, c); tier {
	case tierImbalanced:
		return firstMin(c, func(s int32) int64 { return int64(c.active[s]) }), nil
	case tierCache:
		// The first holder of the best prefix, whatever its load.
		for i, s := range c.slots {
			if c.ovAt(s) == bestOv {
				return i, nil
			}
		}
	}
	return firstMin(c, func(s int32) int64 { return c.f.routed[s] }), nil
}

// cacheAwareTier is the step of SGLang's decision a request falls in.
type cacheAwareTier uint8

const (
	tierImbalanced cacheAwareTier = iota // 1: the load spread is too wide: balance
	tierCache                            // 2: the best cached prefix is worth taking
	tierRest                             // 3: neither
)

// tier is SGLang's decision without its picks: which step applies (steps 1
// and 2 above, else 3) and the best overlap among the candidates, which
// must not be empty. TwoTier decides with it too and picks differently.
func (p SGLang) tier(x *Context, c *Candidates) (cacheAwareTier, int32) {
	lo, hi := int32(math.MaxInt32), int32(math.MinInt32)
	bestOv := int32(0)
	for _, s := range c.slots {
		a := c.active[s]
		lo, hi = min(lo, a), max(hi, a)
		bestOv = max(bestOv, c.ovAt(s))
	}
	if float64(hi-lo) > p.BalanceAbs && float64(hi) > p.BalanceRel*float64(lo) {
		return tierImbalanced, bestOv
	}
	if x.RequestBlocks > 0 && float64(bestOv)/float64(x.RequestBlocks) > p.CacheThreshold {
		return tierCache, bestOv
	}
	return tierRest, bestOv
}

// firstMin returns the candidate with the smallest key, the first one in
// candidate order on a tie (SGLang's ties).
func firstMin(c *Candidates, key func(s int32) int64) int {
	bi, best := 0, key(c.slots[0])
	for i, s := range c.slots[1:] {
		if k := key(s); k < best {
			bi, best = i+1, k
		}
	}
	return bi
}

// TwoTier is SGLang's decision (SGLang.tier) with SGLang's library
// defaults and least-loaded picks: (1) when the load spread is large —
// max − min active requests > BalanceAbs and max > BalanceRel × min — take
// the least-loaded worker; (2) otherwise, when the best overlap ratio
// (overlap blocks / prompt blocks) is > CacheThreshold, the least-loaded
// worker among those with that best overlap; (3) otherwise the least-loaded
// worker. Least loaded is fewest active requests, then least booked
// prefill, ties at random (leastLoaded); sgl-router itself takes the first
// worker on a tie, the tree's holder in step 2 and the smallest tree in
// step 3. With
// RespectSoftAffinity a Soft target that is a candidate is kept unless
// step 1 fires.
type TwoTier struct {
	CacheThreshold      float64 `yaml:"cache_threshold"`
	BalanceAbs          float64 `yaml:"balance_abs_threshold"`
	BalanceRel          float64 `yaml:"balance_rel_threshold"`
	RespectSoftAffinity bool    `yaml:"respect_soft_affinity"`
}

// NewTwoTier returns the policy with SGLang's library defaults 0.5, 32, 1.1.
func NewTwoTier() *TwoTier { return &TwoTier{CacheThreshold: 0.5, BalanceAbs: 32, BalanceRel: 1.1} }

// Name implements Policy.
func (*TwoTier) Name() string { return "two-tier" }

// Select implements Policy.
func (p *TwoTier) Select(x *Context, c *Candidates) (int, error) {
	if c.Len() == 0 {
		return 0, ErrNoCandidate
	}
	tier, bestOv := SGLang{p.CacheThreshold, p.BalanceAbs, p.BalanceRel}.tier(x, c)
	switch {
	case tier == tierImbalanced:
		return leastLoaded(x, c, nil), nil
	case p.RespectSoftAffinity && c.anyAffinityTarget():
		return leastLoaded(x, c, func(i int) bool { return c.aff.matches(c.f, c.slots[i]) }), nil
	case tier == tierCache:
		return leastLoaded(x, c, func(i int) bool { return c.ovAt(c.slots[i]) == bestOv }), nil
	}
	return leastLoaded(x, c, nil), nil
}

// CHWBL is KubeAI's PrefixHash load balancing: consistent hashing with
// bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018) on the prompt's
// prefix. Source: substratusai/kubeai internal/loadbalancer/balance_chwbl.go
// and the Model CRD's loadBalancing.prefixHash defaults (meanLoadPercentage
// 125, replication 256, prefixCharLength 100), as of 2025.
//
// Every worker has Replication points on a 64-bit ring (hash of its name
// and the point's number). A request's key hashes its prefix; the policy
// walks the ring clockwise from the key and takes the first worker whose
// load passes the bound
//
//	load + 1 <= LoadFactor × (total load + 1) / workers
//
// (any worker passes while the total is 0); when none passes, the first
// worker on the walk. Load is in-flight requests (here: the requests booked
// on the worker), over the candidates. The key: KubeAI hashes the first
// PrefixChars characters of the first user message of a chat request
// (apiutils ChatCompletionRequest.Prefix), which keys a conversation's
// turns together and different conversations apart however long a
// system prompt they share, and the first PrefixChars characters of the
// prompt of a completion. The scheduler sees no text: a chat request's key
// arrives as Request.RoutingKey (its first PrefixChars characters are
// hashed; the replay sends the conversation's id, which names its first
// user turn), and without one the prompt's opening stands in, as the
// sequence hash of the block that covers PrefixChars characters at 4
// characters per token (llm-d's estimate): at a 16-token block the second
// block, from 25 tokens on the first; at 512-token blocks the first, which
// a shared system prompt makes one key for every request. A prompt without
// a full block is keyed by its request id (spread, as distinct short
// prompts would be). Hashes are XXH3 (KubeAI: xxhash64); only their spread
// matters. It reads no cache state at all: the index-free baseline.
type CHWBL struct {
	LoadFactor  float64 `yaml:"load_factor"`
	Replication int     `yaml:"replication"`
	PrefixChars int     `yaml:"prefix_chars"`

	points sync.Map // workerref.Target → []uint64 ring points (a pure function of the key, cached)
}

// NewCHWBL returns the policy with KubeAI's defaults: load factor 1.25,
// 256 points per worker, a 100-character prefix.
func NewCHWBL() *CHWBL { return &CHWBL{LoadFactor: 1.25, Replication: 256, PrefixChars: 100} }

type chwblParams struct {
	LoadFactor  float64
	Replication int
	PrefixChars int
}

func (p *CHWBL) params() chwblParams { return chwblParams{p.LoadFactor, p.Replication, p.PrefixChars} }

// Name implements Policy.
func (*CHWBL) Name() string { return "chwbl" }

// chwblCharsPerToken converts KubeAI's character prefix to tokens.
const chwblCharsPerToken = 4

// key is the ring position of the request's prefix.
func (p *CHWBL) key(x *Context) uint64 {
	if k := x.Request.RoutingKey; k != "" {
		return xxh3.HashString(firstRunes(k, p.PrefixChars))
	}
	hs := x.Request.SeqHashes
	if len(hs) == 0 {
		return xxh3.HashString(x.Request.ID)
	}
	tokens := (p.PrefixChars + chwblCharsPerToken - 1) / chwblCharsPerToken
	blocks := (tokens + max(1, x.BlockSize) - 1) / max(1, x.BlockSize)
	// Hashed again, as KubeAI hashes its key: the ring needs keys spread
	// over 64 bits, whatever the caller's hashes look like.
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(hs[min(len(hs), max(1, blocks))-1]))
	return xxh3.Hash(b[:])
}

// firstRunes is the first n characters of s (KubeAI's firstNChars).
func firstRunes(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}

// ring returns the worker's points (hashes of "w#r" and the point's
// number), computing them once per (worker, rank).
func (p *CHWBL) ring(k workerref.Target) []uint64 {
	if v, ok := p.points.Load(k); ok {
		return v.([]uint64)
	}
	name := k.String()
	pts := make([]uint64, p.Replication)
	buf := make([]byte, 0, len(name)+8)
	for i := range pts {
		buf = strconv.AppendInt(append(buf[:0], name...), int64(i), 10)
		pts[i] = xxh3.Hash(buf)
	}
	v, _ := p.points.LoadOrStore(k, pts)
	return v.([]uint64)
}

// Select implements Policy.
func (p *CHWBL) Select(x *Context, c *Candidates) (int, error) {
	n := c.Len()
	if n == 0 {
		return 0, ErrNoCandidate
	}
	key := p.key(x)
	total := int64(0)
	for _, s := range c.slots {
		total += int64(c.active[s])
	}
	bound := p.LoadFactor * float64(total+1) / float64(n)
	// A worker's place on the walk is its point nearest clockwise from the
	// key; comparing those distances orders the workers as the walk meets
	// them, without sorting the ring.
	first, firstD := 0, uint64(math.MaxUint64)
	ok, okD := -1, uint64(math.MaxUint64)
	for i, s := range c.slots {
		d := uint64(math.MaxUint64)
		for _, h := range p.ring(c.f.key[s]) {
			d = min(d, h-key)
		}
		if d < firstD || (d == firstD && i < first) {
			first, firstD = i, d
		}
		if (total == 0 || float64(c.active[s])+1 <= bound) && d < okD {
			ok, okD = i, d
		}
	}
	if ok >= 0 {
		return ok, nil
	}
	return first, nil
}
