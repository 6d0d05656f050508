package workload

import (
	"math/rand/v2"
	"strconv"
	"time"
)

// BurstConfig shapes the siblings of a burst: now and then many requests
// that share a prefix no engine has seen yet (a document just shared with a
// team, a batch job, an agent's parallel calls) arrive within one engine
// step, on top of ordinary chat traffic. A router that spreads the siblings
// computes the new prefix once per worker it picks; one that sends them all
// to one worker computes it once but queues them there.
type BurstConfig struct {
	Seed         uint64
	Bursts       int           // default 40
	Siblings     int           // requests per burst, default 32
	PrefixTokens int           // the burst's new shared prefix, default 4,096
	SuffixTokens int           // mean distinct suffix per sibling, default 64
	OutputTokens int           // mean output per sibling, default 128
	BurstRate    float64       // bursts per second (Poisson), default 0.5
	Spread       time.Duration // siblings arrive within this of the burst's start, default 5 ms (under one engine step)
	// Background is the number of chat sessions underneath (Chat's other
	// defaults, from Seed+1): default 48, negative = none.
	Background int
	MaxTokens  int // the client's max_tokens, default 1,024
}

func (c *BurstConfig) defaults() {
	c.Bursts = cmpOr(c.Bursts, 40)
	c.Siblings = cmpOr(c.Siblings, 32)
	c.PrefixTokens = cmpOr(c.PrefixTokens, 4096)
	c.SuffixTokens = cmpOr(c.SuffixTokens, 64)
	c.OutputTokens = cmpOr(c.OutputTokens, 128)
	if c.BurstRate <= 0 {
		c.BurstRate = 0.5
	}
	if c.Spread <= 0 {
		c.Spread = 5 * time.Millisecond
	}
	if c.Background == 0 {
		c.Background = 48
	}
	c.MaxTokens = cmpOr(c.MaxTokens, DefaultMaxTokens)
}

// Burst generates bursts "burst-<b>-s<i>" (Group "burst-<b>", no session)
// merged with the chat background.
func Burst(c BurstConfig) *Workload {
	c.defaults()
	r := rand.New(rand.NewPCG(c.Seed, 0xb0e5))
	var reqs []Request
	var at time.Duration
	for b := 0; b < c.Bursts; b++ {
		at += expDur(r, perSecond(c.BurstRate))
		group := "burst-" + strconv.Itoa(b)
		prefix := tokens(nil, c.Seed, uint64(b)<<40|20<<56, c.PrefixTokens)
		for i := 0; i < c.Siblings; i++ {
			prompt := append(make([]uint32, 0, len(prefix)+c.SuffixTokens*3/2), prefix...)
			prompt = tokens(prompt, c.Seed, uint64(b)<<40|uint64(i)<<8|21<<56, jitter(r, c.SuffixTokens))
			reqs = append(reqs, Request{
				ID: group + "-s" + strconv.Itoa(i), Arrival: at + time.Duration(r.Int64N(int64(c.Spread))), Group: group,
				Tokens: prompt, InputLength: len(prompt), OutputLength: jitter(r, c.OutputTokens),
			})
		}
	}
	if c.Background > 0 {
		reqs = append(reqs, Chat(ChatConfig{Seed: c.Seed + 1, Sessions: c.Background}).Requests...)
	}
	w := finish("synthetic:burst", reqs)
	w.MaxTokens = c.MaxTokens
	return w
}
