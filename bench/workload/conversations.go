package workload

import (
	"math/rand/v2"
	"strconv"
	"time"
)

// conversations is the session loop of Chat, AgentLoop and TenantChat: a
// session picks a shared prefix (a system prompt, with tools for agents),
// then each turn appends a new message, asks for a reply and appends the
// reply to the next turn's prompt. The draws from the generator's source
// come in a fixed order (start gap, prefix, turns; per turn message length,
// reply length, think time), so every generator stays deterministic by seed.
type conversations struct {
	seed     uint64
	session  string // session id prefix: "chat" gives "chat-<n>"
	group    string // group prefix: "sys" gives "sys-<k>"
	sessions int
	// msgTag and msgTag+1 are the token segment tags of messages and
	// replies (prefixes have their own, in prefix).
	msgTag uint64

	startGap func() time.Duration
	pick     func() int                         // which shared prefix
	prefix   func(dst []uint32, k int) []uint32 // appends shared prefix k
	turns    func() int                         // turns of the session
	message  func() int                         // new message tokens
	reply    func() int                         // output tokens
	think    func() time.Duration               // gap to the next turn
}

func (c *conversations) generate() []Request {
	var reqs []Request
	var start time.Duration
	for s := 0; s < c.sessions; s++ {
		start += c.startGap()
		k := c.pick()
		turns := c.turns()
		sess := c.session + "-" + strconv.Itoa(s)
		group := c.group + "-" + strconv.Itoa(k)
		// One backing array per session: turn t's prompt is a prefix of it.
		conv := c.prefix(nil, k)
		at := start
		for t := 0; t < turns; t++ {
			conv = tokens(conv, c.seed, uint64(s)<<40|uint64(t)<<8|c.msgTag<<56, c.message())
			out := c.reply()
			reqs = append(reqs, Request{
				ID: sess + "-t" + strconv.Itoa(t), Arrival: at, Session: sess, Group: group,
				Tokens: conv[:len(conv):len(conv)], InputLength: len(conv), OutputLength: out,
			})
			// The answer becomes part of the next turn's prompt.
			conv = tokens(conv, c.seed, uint64(s)<<40|uint64(t)<<8|(c.msgTag+1)<<56, out)
			at += c.think()
		}
	}
	return reqs
}

// pickSkewed draws 0..n-1 with Zipf weights (rank k weighs (1+k)^-skew)
// when skew > 1, uniformly otherwise.
func pickSkewed(r *rand.Rand, skew float64, n int) func() int {
	if n <= 1 {
		return func() int { return 0 }
	}
	if skew > 1 {
		z := rand.NewZipf(r, skew, 1, uint64(n-1))
		return func() int { return int(z.Uint64()) }
	}
	return func() int { return r.IntN(n) }
}

// jitters draws n lengths around mean (see jitter): one per shared prefix,
// fixed for the workload.
func jitters(r *rand.Rand, n, mean int) []int {
	out := make([]int, n)
	for k := range out {
		out[k] = jitter(r, mean)
	}
	return out
}

// uniformDur draws uniformly in [lo, hi].
func uniformDur(r *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

// AgentLoopConfig shapes tool-using agents. Each tenant has a system prompt
// and tool definitions that all its sessions share; a session is one agent
// run of MinTurns..MaxTurns short turns (a tool result or the user's task
// in, a tool call out), a few seconds apart (the tool's run time).
type AgentLoopConfig struct {
	Seed              uint64
	Tenants           int           // default 8
	TenantSkew        float64       // Zipf exponent of tenant popularity; default 1.2, <= 1 = uniform
	Sessions          int           // default 64
	MinTurns          int           // default 4
	MaxTurns          int           // default 30 (turns uniform in [MinTurns, MaxTurns])
	SystemTokens      int           // per tenant, default 1,024
	ToolTokens        int           // tool definitions per tenant, default 2,048
	ObservationTokens int           // mean tool result (or task) per turn, default 192
	OutputTokens      int           // mean tool call per turn, default 64
	SessionRate       float64       // agent runs started per second (Poisson), default 0.5
	ThinkMin          time.Duration // gap between turns, uniform in [ThinkMin, ThinkMax]; default 1 s
	ThinkMax          time.Duration // default 5 s
	MaxTokens         int           // the client's max_tokens, default 512
}

func (c *AgentLoopConfig) defaults() {
	c.Tenants = cmpOr(c.Tenants, 8)
	if c.TenantSkew == 0 {
		c.TenantSkew = 1.2
	}
	c.Sessions = cmpOr(c.Sessions, 64)
	c.MinTurns = cmpOr(c.MinTurns, 4)
	c.MaxTurns = max(cmpOr(c.MaxTurns, 30), c.MinTurns)
	c.SystemTokens = cmpOr(c.SystemTokens, 1024)
	c.ToolTokens = cmpOr(c.ToolTokens, 2048)
	c.ObservationTokens = cmpOr(c.ObservationTokens, 192)
	c.OutputTokens = cmpOr(c.OutputTokens, 64)
	if c.SessionRate <= 0 {
		c.SessionRate = 0.5
	}
	if c.ThinkMin <= 0 {
		c.ThinkMin = time.Second
	}
	if c.ThinkMax <= 0 {
		c.ThinkMax = 5 * time.Second
	}
	c.ThinkMax = max(c.ThinkMax, c.ThinkMin)
	c.MaxTokens = cmpOr(c.MaxTokens, 512)
}

// AgentLoop generates agent runs with session ids "agent-<n>"; a request's
// Group is its tenant ("tenant-<k>").
func AgentLoop(c AgentLoopConfig) *Workload {
	c.defaults()
	r := rand.New(rand.NewPCG(c.Seed, 0xa6e7))
	gen := conversations{
		seed: c.Seed, session: "agent", group: "tenant", sessions: c.Sessions, msgTag: 12,
		startGap: func() time.Duration { return expDur(r, perSecond(c.SessionRate)) },
		pick:     pickSkewed(r, c.TenantSkew, c.Tenants),
		prefix: func(dst []uint32, k int) []uint32 {
			dst = tokens(dst, c.Seed, uint64(k)<<40|10<<56, c.SystemTokens)
			return tokens(dst, c.Seed, uint64(k)<<40|11<<56, c.ToolTokens)
		},
		turns:   func() int { return c.MinTurns + r.IntN(c.MaxTurns-c.MinTurns+1) },
		message: func() int { return jitter(r, c.ObservationTokens) },
		reply:   func() int { return jitter(r, c.OutputTokens) },
		think:   func() time.Duration { return uniformDur(r, c.ThinkMin, c.ThinkMax) },
	}
	w := finish("synthetic:agent-loop", gen.generate())
	w.MaxTokens = c.MaxTokens
	return w
}

// TenantChatConfig shapes multi-tenant chat: each tenant has one long
// system prompt (its length fixed per tenant, around SystemTokens), tenants
// are Zipf-popular, and each session is a short conversation under its
// tenant's prompt.
type TenantChatConfig struct {
	Seed         uint64
	Tenants      int           // default 12
	TenantSkew   float64       // Zipf exponent of tenant popularity; default 1.2, <= 1 = uniform
	SystemTokens int           // mean system prompt per tenant, default 6,144 (uniform in [S/2, 3S/2])
	Sessions     int           // default 160
	Turns        int           // mean turns per session, default 3 (uniform in [Turns/2, 3*Turns/2])
	UserTokens   int           // mean new user tokens per turn, default 128
	OutputTokens int           // mean output tokens per turn, default 256
	SessionRate  float64       // new sessions per second (Poisson), default 2
	ThinkTime    time.Duration // mean gap between turns (exponential), default 15 s
	MaxTokens    int           // the client's max_tokens, default 1,024
}

func (c *TenantChatConfig) defaults() {
	c.Tenants = cmpOr(c.Tenants, 12)
	if c.TenantSkew == 0 {
		c.TenantSkew = 1.2
	}
	c.SystemTokens = cmpOr(c.SystemTokens, 6144)
	c.Sessions = cmpOr(c.Sessions, 160)
	c.Turns = cmpOr(c.Turns, 3)
	c.UserTokens = cmpOr(c.UserTokens, 128)
	c.OutputTokens = cmpOr(c.OutputTokens, 256)
	if c.SessionRate <= 0 {
		c.SessionRate = 2
	}
	if c.ThinkTime <= 0 {
		c.ThinkTime = 15 * time.Second
	}
	c.MaxTokens = cmpOr(c.MaxTokens, DefaultMaxTokens)
}

// TenantChat generates tenant conversations with session ids
// "tchat-<n>"; a request's Group is its tenant ("tenant-<k>").
func TenantChat(c TenantChatConfig) *Workload {
	c.defaults()
	r := rand.New(rand.NewPCG(c.Seed, 0x7e4a))
	lengths := jitters(r, c.Tenants, c.SystemTokens)
	gen := conversations{
		seed: c.Seed, session: "tchat", group: "tenant", sessions: c.Sessions, msgTag: 15,
		startGap: func() time.Duration { return expDur(r, perSecond(c.SessionRate)) },
		pick:     pickSkewed(r, c.TenantSkew, c.Tenants),
		prefix: func(dst []uint32, k int) []uint32 {
			return tokens(dst, c.Seed, uint64(k)<<40|14<<56, lengths[k])
		},
		turns:   func() int { return jitter(r, c.Turns) },
		message: func() int { return jitter(r, c.UserTokens) },
		reply:   func() int { return jitter(r, c.OutputTokens) },
		think:   func() time.Duration { return expDur(r, c.ThinkTime) },
	}
	w := finish("synthetic:tenant-chat", gen.generate())
	w.MaxTokens = c.MaxTokens
	return w
}
