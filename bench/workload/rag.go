package workload

import (
	"math/rand/v2"
	"strconv"
	"time"
)

// RAGConfig shapes retrieval-augmented generation: every request is one
// instruction prompt shared by all, DocsPerRequest documents drawn from a
// Zipf-popular corpus of long documents, and a question no other request
// asks. Reuse comes from popular documents only, and only when they come
// first after the instruction (a prefix cache reuses prefixes).
type RAGConfig struct {
	Seed           uint64
	Requests       int     // default 1,500
	Documents      int     // corpus size, default 1,000
	DocSkew        float64 // Zipf exponent of document popularity (rank k weighs (1+k)^-s); default 1.1, <= 1 = uniform
	DocTokens      int     // mean document length, default 4,096 (fixed per document, uniform in [D/2, 3D/2])
	DocsPerRequest int     // documents in a prompt, distinct, default 1
	SystemTokens   int     // instruction prompt shared by every request, default 256
	QuestionTokens int     // mean unique question, default 96
	OutputTokens   int     // mean output, default 192
	Rate           float64 // requests per second (Poisson), default 6
	MaxTokens      int     // the client's max_tokens, default 1,024
}

func (c *RAGConfig) defaults() {
	c.Requests = cmpOr(c.Requests, 1500)
	c.Documents = cmpOr(c.Documents, 1000)
	if c.DocSkew == 0 {
		c.DocSkew = 1.1
	}
	c.DocTokens = cmpOr(c.DocTokens, 4096)
	c.DocsPerRequest = min(cmpOr(c.DocsPerRequest, 1), c.Documents)
	c.SystemTokens = cmpOr(c.SystemTokens, 256)
	c.QuestionTokens = cmpOr(c.QuestionTokens, 96)
	c.OutputTokens = cmpOr(c.OutputTokens, 192)
	if c.Rate <= 0 {
		c.Rate = 6
	}
	c.MaxTokens = cmpOr(c.MaxTokens, DefaultMaxTokens)
}

// RAG generates retrieval requests "rag-<n>" without sessions; a request's
// Group is its first document ("doc-<k>", k = popularity rank).
func RAG(c RAGConfig) *Workload {
	c.defaults()
	r := rand.New(rand.NewPCG(c.Seed, 0x4a6d))
	lengths := jitters(r, c.Documents, c.DocTokens)
	pick := pickSkewed(r, c.DocSkew, c.Documents)
	system := tokens(nil, c.Seed, 17<<56, c.SystemTokens)
	reqs := make([]Request, 0, c.Requests)
	var at time.Duration
	docs := make([]int, 0, c.DocsPerRequest)
	for i := 0; i < c.Requests; i++ {
		docs = docs[:0]
		for len(docs) < c.DocsPerRequest {
			if k := pick(); !containsInt(docs, k) {
				docs = append(docs, k)
			}
		}
		prompt := append(make([]uint32, 0, len(system)+c.DocsPerRequest*c.DocTokens*3/2+c.QuestionTokens*3/2), system...)
		for _, k := range docs {
			prompt = tokens(prompt, c.Seed, uint64(k)<<40|18<<56, lengths[k])
		}
		prompt = tokens(prompt, c.Seed, uint64(i)<<20|19<<56, jitter(r, c.QuestionTokens))
		reqs = append(reqs, Request{
			ID: "rag-" + strconv.Itoa(i), Arrival: at, Group: "doc-" + strconv.Itoa(docs[0]),
			Tokens: prompt, InputLength: len(prompt), OutputLength: jitter(r, c.OutputTokens),
		})
		at += expDur(r, perSecond(c.Rate))
	}
	w := finish("synthetic:rag", reqs)
	w.MaxTokens = c.MaxTokens
	return w
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
