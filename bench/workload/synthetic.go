package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"time"
)

// Vocab is the size of the synthetic token vocabulary.
const Vocab = 32000

// tokens fills dst with n deterministic tokens for segment seg.
func tokens(dst []uint32, seed uint64, seg uint64, n int) []uint32 {
	x := mix64(seed ^ mix64(seg+0x632be59bd9b4e019))
	for i := 0; i < n; i++ {
		x += 0x9e3779b97f4a7c15
		dst = append(dst, uint32(mix64(x)%Vocab))
	}
	return dst
}

// jitter draws n around mean: uniform in [mean/2, 3*mean/2], at least 1.
func jitter(r *rand.Rand, mean int) int {
	if mean <= 1 {
		return max(mean, 1)
	}
	return max(1, mean/2+r.IntN(mean+1))
}

func expDur(r *rand.Rand, mean time.Duration) time.Duration {
	if mean <= 0 {
		return 0
	}
	return time.Duration(r.ExpFloat64() * float64(mean))
}

func perSecond(rate float64) time.Duration {
	if rate <= 0 {
		return 0
	}
	return time.Duration(float64(time.Second) / rate)
}

// ChatConfig shapes multi-turn chat sessions: each turn's prompt is the
// system prompt, the whole conversation so far and a new user message.
type ChatConfig struct {
	Seed          uint64
	Sessions      int           // default 64
	Turns         int           // mean turns per session, default 6 (uniform in [Turns/2, 3*Turns/2])
	SystemPrompts int           // distinct system prompts shared across sessions, default 4
	SystemTokens  int           // default 1,024
	UserTokens    int           // mean new user tokens per turn, default 256
	OutputTokens  int           // mean output tokens per turn, default 256
	SessionRate   float64       // new sessions per second (Poisson), default 2
	ThinkTime     time.Duration // mean gap between turns of a session, default 8 s
}

func (c *ChatConfig) defaults() {
	c.Sessions = cmpOr(c.Sessions, 64)
	c.Turns = cmpOr(c.Turns, 6)
	c.SystemPrompts = cmpOr(c.SystemPrompts, 4)
	c.SystemTokens = cmpOr(c.SystemTokens, 1024)
	c.UserTokens = cmpOr(c.UserTokens, 256)
	c.OutputTokens = cmpOr(c.OutputTokens, 256)
	if c.SessionRate <= 0 {
		c.SessionRate = 2
	}
	if c.ThinkTime <= 0 {
		c.ThinkTime = 8 * time.Second
	}
}

// Chat generates multi-turn chat sessions with session ids "chat-<n>"; a
// request's Group is its system prompt ("sys-<k>").
func Chat(c ChatConfig) *Workload {
	c.defaults()
	r := rand.New(rand.NewPCG(c.Seed, 0xc4a7))
	gen := conversations{
		seed: c.Seed, session: "chat", group: "sys", sessions: c.Sessions, msgTag: 2,
		startGap: func() time.Duration { return expDur(r, perSecond(c.SessionRate)) },
		pick:     func() int { return r.IntN(c.SystemPrompts) },
		prefix: func(dst []uint32, k int) []uint32 {
			return tokens(dst, c.Seed, uint64(k)<<40|1<<56, c.SystemTokens)
		},
		turns:   func() int { return jitter(r, c.Turns) },
		message: func() int { return jitter(r, c.UserTokens) },
		reply:   func() int { return jitter(r, c.OutputTokens) },
		think:   func() time.Duration { return expDur(r, c.ThinkTime) },
	}
	return finish("synthetic:chat", gen.generate())
}

// SharedPrefixConfig shapes groups of prompts sharing a long system prompt,
// after SGLang's generated-shared-prefix benchmark.
type SharedPrefixConfig struct {
	Seed            uint64
	Groups          int     // default 64
	PromptsPerGroup int     // default 16
	SystemTokens    int     // shared prefix per group, default 2,048
	QuestionTokens  int     // distinct suffix per prompt, default 128
	OutputTokens    int     // default 256
	Rate            float64 // requests per second (Poisson), default 16
}

func (c *SharedPrefixConfig) defaults() {
	c.Groups = cmpOr(c.Groups, 64)
	c.PromptsPerGroup = cmpOr(c.PromptsPerGroup, 16)
	c.SystemTokens = cmpOr(c.SystemTokens, 2048)
	c.QuestionTokens = cmpOr(c.QuestionTokens, 128)
	c.OutputTokens = cmpOr(c.OutputTokens, 256)
	if c.Rate <= 0 {
		c.Rate = 16
	}
}

// SharedPrefix generates Groups x PromptsPerGroup requests in shuffled order;
// requests carry no session, their Group is "group-<g>".
func SharedPrefix(c SharedPrefixConfig) *Workload {
	c.defaults()
	r := rand.New(rand.NewPCG(c.Seed, 0x5ba7))
	type item struct{ g, p int }
	items := make([]item, 0, c.Groups*c.PromptsPerGroup)
	for g := 0; g < c.Groups; g++ {
		for p := 0; p < c.PromptsPerGroup; p++ {
			items = append(items, item{g, p})
		}
	}
	r.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
	prefixes := make([][]uint32, c.Groups)
	var reqs []Request
	var at time.Duration
	for _, it := range items {
		if prefixes[it.g] == nil {
			prefixes[it.g] = tokens(nil, c.Seed, uint64(it.g)<<40|4<<56, c.SystemTokens)
		}
		prompt := make([]uint32, 0, c.SystemTokens+c.QuestionTokens)
		prompt = append(prompt, prefixes[it.g]...)
		prompt = tokens(prompt, c.Seed, uint64(it.g)<<40|uint64(it.p)<<8|5<<56, c.QuestionTokens)
		reqs = append(reqs, Request{
			ID: "sp-g" + strconv.Itoa(it.g) + "-p" + strconv.Itoa(it.p), Arrival: at, Group: "group-" + strconv.Itoa(it.g),
			Tokens: prompt, InputLength: len(prompt), OutputLength: c.OutputTokens,
		})
		at += expDur(r, perSecond(c.Rate))
	}
	return finish("synthetic:shared-prefix", reqs)
}

// FanOutConfig shapes agents that fan out bursts of sibling requests: each
// round, Siblings requests share the agent's context and differ in a short
// task suffix; the round's results then extend the context.
type FanOutConfig struct {
	Seed          uint64
	Agents        int           // default 32
	Rounds        int           // default 4
	Siblings      int           // requests per burst, default 8
	SystemTokens  int           // system prompt shared by all agents, default 1,024
	ContextTokens int           // agent's own initial context, default 3,072
	TaskTokens    int           // per-sibling suffix, default 128
	ResultTokens  int           // context growth per round, default 512
	OutputTokens  int           // default 128
	AgentRate     float64       // agent starts per second (Poisson), default 1
	RoundGap      time.Duration // mean time between rounds of one agent, default 6 s
	Spread        time.Duration // siblings arrive within this of each other, default 20 ms
}

func (c *FanOutConfig) defaults() {
	c.Agents = cmpOr(c.Agents, 32)
	c.Rounds = cmpOr(c.Rounds, 4)
	c.Siblings = cmpOr(c.Siblings, 8)
	c.SystemTokens = cmpOr(c.SystemTokens, 1024)
	c.ContextTokens = cmpOr(c.ContextTokens, 3072)
	c.TaskTokens = cmpOr(c.TaskTokens, 128)
	c.ResultTokens = cmpOr(c.ResultTokens, 512)
	c.OutputTokens = cmpOr(c.OutputTokens, 128)
	if c.AgentRate <= 0 {
		c.AgentRate = 1
	}
	if c.RoundGap <= 0 {
		c.RoundGap = 6 * time.Second
	}
	if c.Spread <= 0 {
		c.Spread = 20 * time.Millisecond
	}
}

// FanOut generates agent bursts. An agent is a session ("agent-<n>"); the
// Group of a request is its burst ("agent-<n>-r<k>").
func FanOut(c FanOutConfig) *Workload {
	c.defaults()
	r := rand.New(rand.NewPCG(c.Seed, 0xfa40))
	var reqs []Request
	var start time.Duration
	for a := 0; a < c.Agents; a++ {
		start += expDur(r, perSecond(c.AgentRate))
		sess := "agent-" + strconv.Itoa(a)
		ctx := tokens(nil, c.Seed, 6<<56, c.SystemTokens)
		ctx = tokens(ctx, c.Seed, uint64(a)<<40|7<<56, c.ContextTokens)
		at := start
		for k := 0; k < c.Rounds; k++ {
			burst := sess + "-r" + strconv.Itoa(k)
			for s := 0; s < c.Siblings; s++ {
				prompt := make([]uint32, 0, len(ctx)+c.TaskTokens)
				prompt = append(prompt, ctx...)
				prompt = tokens(prompt, c.Seed, uint64(a)<<40|uint64(k)<<20|uint64(s)<<4|8<<56, jitter(r, c.TaskTokens))
				reqs = append(reqs, Request{
					ID: burst + "-c" + strconv.Itoa(s), Arrival: at + time.Duration(r.Int64N(int64(c.Spread))),
					Session: sess, Group: burst, Tokens: prompt, InputLength: len(prompt), OutputLength: jitter(r, c.OutputTokens),
				})
			}
			ctx = tokens(ctx, c.Seed, uint64(a)<<40|uint64(k)<<20|9<<56, c.ResultTokens)
			at += expDur(r, c.RoundGap)
		}
	}
	return finish("synthetic:fanout", reqs)
}

// Kinds lists the synthetic workload names Generate accepts.
var Kinds = []string{"chat", "shared-prefix", "fanout", "mixed", "agent-loop", "rag", "tenant-chat", "burst"}

// Generate builds a synthetic workload by name with default shapes, from seed.
// "mixed" merges chat sessions and agent fan-out bursts on one timeline.
func Generate(kind string, seed uint64) (*Workload, error) {
	switch kind {
	case "chat":
		return Chat(ChatConfig{Seed: seed}), nil
	case "shared-prefix", "sharedprefix", "shared_prefix":
		return SharedPrefix(SharedPrefixConfig{Seed: seed}), nil
	case "fanout", "fan-out", "agent":
		return FanOut(FanOutConfig{Seed: seed}), nil
	case "mixed":
		return Merge("synthetic:mixed",
			Chat(ChatConfig{Seed: seed, Sessions: 48}),
			FanOut(FanOutConfig{Seed: seed + 1, Agents: 16})), nil
	case "agent-loop", "agent_loop", "agentloop":
		return AgentLoop(AgentLoopConfig{Seed: seed}), nil
	case "rag":
		return RAG(RAGConfig{Seed: seed}), nil
	case "tenant-chat", "tenant_chat", "tenantchat":
		return TenantChat(TenantChatConfig{Seed: seed}), nil
	case "burst", "bursty":
		return Burst(BurstConfig{Seed: seed}), nil
	}
	return nil, fmt.Errorf("%w: unknown synthetic workload %q (want one of %v)", ErrInvalid, kind, Kinds)
}

// Merge interleaves token workloads on one timeline (stable by arrival).
// Request ids must already be distinct across the inputs. The merged
// clients' max_tokens is the largest of the inputs'.
func Merge(name string, ws ...*Workload) *Workload {
	var reqs []Request
	maxTokens := 0
	for _, w := range ws {
		reqs = append(reqs, w.Requests...)
		maxTokens = max(maxTokens, w.MaxTokens)
	}
	out := finish(name, reqs)
	out.MaxTokens = maxTokens
	return out
}

func finish(name string, reqs []Request) *Workload {
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].Arrival < reqs[j].Arrival })
	return &Workload{Name: name, Requests: reqs}
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// Select keeps at most limit requests (0 = all) arriving in [start,
// start+window) (window 0 = no end), re-based so the first kept arrives at 0.
// The prompts are shared with w, not copied.
func (w *Workload) Select(limit int, start, window time.Duration) *Workload {
	out := &Workload{Name: w.Name, BlockTokens: w.BlockTokens, MaxTokens: w.MaxTokens}
	var base time.Duration = -1
	for _, r := range w.Requests {
		if limit > 0 && len(out.Requests) >= limit {
			break
		}
		if r.Arrival < start {
			continue
		}
		if window > 0 && r.Arrival >= start+window {
			break
		}
		if base < 0 {
			base = r.Arrival
		}
		r.Arrival -= base
		out.Requests = append(out.Requests, r)
	}
	return out
}

// ScaleLoad multiplies the offered load by factor by compressing arrival
// times (factor 2 = twice the request rate). It does not change prompts.
func (w *Workload) ScaleLoad(factor float64) error {
	if !(factor > 0) || math.IsInf(factor, 0) {
		return fmt.Errorf("%w: load scale %v must be positive and finite", ErrInvalid, factor)
	}
	for i := range w.Requests {
		w.Requests[i].Arrival = time.Duration(float64(w.Requests[i].Arrival) / factor)
	}
	return nil
}
