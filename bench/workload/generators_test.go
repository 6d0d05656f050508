package workload

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// extendsPrevious fails unless every request of a session extends the
// session's previous prompt (its reply included).
func extendsPrevious(t *testing.T, w *Workload) {
	t.Helper()
	last := map[string][]uint32{}
	for _, r := range w.Requests {
		if p, ok := last[r.Session]; ok && (len(r.Tokens) <= len(p) || !reflect.DeepEqual(r.Tokens[:len(p)], p)) {
			t.Fatalf("%s does not extend the previous turn", r.ID)
		}
		last[r.Session] = r.Tokens
	}
}

// bySession groups a workload's requests by session, in arrival order.
func bySession(w *Workload) map[string][]Request {
	out := map[string][]Request{}
	for _, r := range w.Requests {
		out[r.Session] = append(out[r.Session], r)
	}
	return out
}

func TestAgentLoopShape(t *testing.T) {
	c := AgentLoopConfig{Seed: 4, Sessions: 120}
	w := AgentLoop(c)
	c.defaults()
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	extendsPrevious(t, w)
	sessions := bySession(w)
	if len(sessions) != c.Sessions || w.MaxTokens != 512 {
		t.Fatalf("%d sessions, max_tokens %d", len(sessions), w.MaxTokens)
	}
	minTurns, maxTurns := math.MaxInt, 0
	prefixes := map[string][]uint32{}
	for id, reqs := range sessions {
		minTurns, maxTurns = min(minTurns, len(reqs)), max(maxTurns, len(reqs))
		for i := 1; i < len(reqs); i++ {
			if gap := reqs[i].Arrival - reqs[i-1].Arrival; gap < time.Second || gap > 5*time.Second {
				t.Fatalf("%s: think time %v outside [1 s, 5 s]", id, gap)
			}
		}
		// Every session of a tenant starts with its system prompt and tools.
		head := reqs[0].Tokens[:c.SystemTokens+c.ToolTokens]
		if p, ok := prefixes[reqs[0].Group]; ok && !slices.Equal(p, head) {
			t.Fatalf("%s: tenant %s's prefix differs", id, reqs[0].Group)
		}
		prefixes[reqs[0].Group] = head
		for _, r := range reqs {
			if r.OutputLength > 96 || r.OutputLength < 32 {
				t.Fatalf("%s: output %d outside [32, 96]", r.ID, r.OutputLength)
			}
		}
	}
	// 120 draws from 4..30: both ends within a few turns.
	if minTurns < 4 || maxTurns > 30 || minTurns > 6 || maxTurns < 28 {
		t.Fatalf("turns per session %d..%d, want 4..30", minTurns, maxTurns)
	}
	if len(prefixes) < 4 {
		t.Fatalf("only %d tenants used", len(prefixes))
	}
}

func TestTenantChatShape(t *testing.T) {
	c := TenantChatConfig{Seed: 2, Sessions: 400}
	w := TenantChat(c)
	c.defaults()
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	extendsPrevious(t, w)
	perTenant := map[string]int{}
	for _, reqs := range bySession(w) {
		perTenant[reqs[0].Group]++
		if n := len(reqs); n < 1 || n > 4 {
			t.Fatalf("%d turns, want 1..4 around 3", n)
		}
	}
	// Zipf popularity: the first tenant leads, the last trails.
	if perTenant["tenant-0"] <= perTenant["tenant-1"] || perTenant["tenant-1"] <= perTenant["tenant-11"] {
		t.Fatalf("sessions per tenant %v: not Zipf-ordered", perTenant)
	}
	// The system prompts are long: the first turn is mostly system prompt.
	for _, r := range w.Requests {
		if strings.HasSuffix(r.ID, "-t0") && (r.InputLength < c.SystemTokens/2 || r.InputLength > 3*c.SystemTokens/2+3*c.UserTokens/2) {
			t.Fatalf("%s: first turn of %d tokens", r.ID, r.InputLength)
		}
	}
}

func TestRAGShapeAndBound(t *testing.T) {
	c := RAGConfig{Seed: 9, Requests: 2000}
	w := RAG(c)
	c.defaults()
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	docEnd := map[string]int{} // where the instruction and document end: the common prefix of the document's requests
	firstOf := map[string][]uint32{}
	questions := map[string]bool{}
	for _, r := range w.Requests {
		count[r.Group]++
		if q := fmt.Sprint(r.Tokens[len(r.Tokens)-8:]); questions[q] {
			t.Fatalf("%s: question repeated", r.ID)
		} else {
			questions[q] = true
		}
		if p, ok := firstOf[r.Group]; ok {
			n := 0
			for n < min(len(p), len(r.Tokens)) && p[n] == r.Tokens[n] {
				n++
			}
			if e, ok := docEnd[r.Group]; !ok || n < e {
				docEnd[r.Group] = n
			}
		} else {
			firstOf[r.Group] = r.Tokens
		}
	}
	// Zipf popularity: rank 0 draws 1 / sum_k (1+k)^-s of the requests,
	// rank 1 2^-s of rank 0's.
	var h float64
	for k := range c.Documents {
		h += math.Pow(float64(1+k), -c.DocSkew)
	}
	p0 := float64(count["doc-0"]) / float64(len(w.Requests))
	if math.Abs(p0*h-1) > 0.2 || count["doc-0"] <= count["doc-1"] || count["doc-1"] <= count["doc-9"] {
		t.Fatalf("doc-0 drew %.3f of the requests, Zipf says %.3f; doc-0 %d, doc-1 %d, doc-9 %d", p0, 1/h, count["doc-0"], count["doc-1"], count["doc-9"])
	}
	// The bound by hand: after the first request the instruction's full
	// blocks are reused, and a document already seen is reused up to its
	// last full block before the question.
	const bs = 16
	var prompt, reusable int64
	seen := map[string]bool{}
	for i, r := range w.Requests {
		prompt += int64(r.InputLength / bs)
		switch {
		case seen[r.Group]:
			reusable += int64(docEnd[r.Group] / bs)
		case i > 0:
			reusable += int64(c.SystemTokens / bs)
		}
		seen[r.Group] = true
	}
	b := w.UpperBound(bs)
	if b.PromptBlocks != prompt || b.ReusableBlocks != reusable {
		t.Fatalf("bound %+v, by hand %d of %d", b, reusable, prompt)
	}
	t.Logf("rag: bound %.3f, %d documents used", b.Ratio, len(count))
}

func TestBurstShape(t *testing.T) {
	c := BurstConfig{Seed: 5, Background: -1}
	w := Burst(c)
	c.defaults()
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != c.Bursts*c.Siblings {
		t.Fatalf("%d requests, want %d", len(w.Requests), c.Bursts*c.Siblings)
	}
	first := map[string]time.Duration{}
	last := map[string]time.Duration{}
	prefix := map[string][]uint32{}
	for _, r := range w.Requests {
		if _, ok := first[r.Group]; !ok {
			first[r.Group] = r.Arrival
			// A burst's prefix is new: no earlier burst shares its first block.
			for g, p := range prefix {
				if slices.Equal(p[:16], r.Tokens[:16]) {
					t.Fatalf("%s starts like %s", r.Group, g)
				}
			}
			prefix[r.Group] = r.Tokens[:c.PrefixTokens]
		}
		last[r.Group] = r.Arrival
		if !slices.Equal(prefix[r.Group], r.Tokens[:c.PrefixTokens]) {
			t.Fatalf("%s does not share its burst's prefix", r.ID)
		}
	}
	for g := range first {
		if spread := last[g] - first[g]; spread >= c.Spread {
			t.Fatalf("%s spread over %v, want < %v", g, spread, c.Spread)
		}
	}
	// Each burst computes its prefix once: the bound is the siblings'
	// shared full blocks.
	b := w.UpperBound(16)
	if want := int64(c.Bursts * (c.Siblings - 1) * (c.PrefixTokens / 16)); b.ReusableBlocks != want {
		t.Fatalf("bound %+v, want %d reusable", b, want)
	}
	// With the chat background the bursts still arrive as bursts.
	if mixed := Burst(BurstConfig{Seed: 5}); len(mixed.Requests) <= len(w.Requests) || mixed.Sessions() != 48 {
		t.Fatalf("background: %d requests, %d sessions", len(mixed.Requests), mixed.Sessions())
	}
}

func TestParts(t *testing.T) {
	w := Chat(ChatConfig{Seed: 1, Sessions: 20})
	tune, ti, err := w.TimePart(PartTune)
	if err != nil {
		t.Fatal(err)
	}
	eval, ei, err := w.TimePart(PartEval)
	if err != nil {
		t.Fatal(err)
	}
	if len(tune.Requests)+len(eval.Requests) != len(w.Requests) || ti.End != ei.First || ei.End != len(w.Requests) || ti.First != 0 {
		t.Fatalf("split %d + %d of %d: %+v %+v", len(tune.Requests), len(eval.Requests), len(w.Requests), ti, ei)
	}
	half := w.Span() / 2
	if w.Requests[ti.End-1].Arrival >= half || w.Requests[ei.First].Arrival < half || eval.Requests[0].Arrival != 0 {
		t.Fatalf("cut at %d does not fall at half the span %v", ei.First, half)
	}
	if !ti.HoldsAnyOf(1) || ei.HoldsAnyOf(ei.First) || !ei.HoldsAnyOf(ei.First+1) {
		t.Fatal("HoldsAnyOf")
	}
	for _, c := range []struct {
		part Part
		in   uint64
		want uint64
	}{{PartTune, 1, 1}, {PartTune, 100, 100}, {PartEval, 1, 101}, {PartEval, 3, 103}} {
		if got, err := PartSeed(c.part, c.in); err != nil || got != c.want {
			t.Errorf("PartSeed(%s, %d) = %d, %v; want %d", c.part, c.in, got, err, c.want)
		}
	}
	for _, s := range []uint64{0, 101} {
		if _, err := PartSeed(PartEval, s); !errors.Is(err, ErrInvalid) {
			t.Errorf("seed %d: %v", s, err)
		}
	}
	if _, err := ParsePart("test"); !errors.Is(err, ErrInvalid) {
		t.Error(err)
	}
	a, ai, _ := GeneratePart("rag", PartTune, 2)
	b, bi, _ := GeneratePart("rag", PartEval, 2)
	if ai.Seed != 2 || bi.Seed != 102 || reflect.DeepEqual(a.Requests[0].Tokens, b.Requests[0].Tokens) {
		t.Fatalf("parts by seed: %+v %+v", ai, bi)
	}
}

// Every generator's infinite-cache bound on its first evaluation seed, at
// the synthetic block size: the figures docs/benchmarks/replay.md quotes.
func TestGeneratedBounds(t *testing.T) {
	for _, kind := range Kinds {
		w, info, err := GeneratePart(kind, PartEval, 1)
		if err != nil {
			t.Fatal(err)
		}
		st, b := w.Stats(), w.UpperBound(16)
		t.Logf("%-14s seed %d: %5d requests, %4d sessions, %4.0f s, %6.0f in / %4.0f out tokens, max_tokens %d, bound %.1f %%",
			kind, info.Seed, st.Requests, st.Sessions, st.SpanSeconds, st.MeanInput, st.MeanOutput, w.ClientMaxTokens(), 100*b.Ratio)
		if b.Ratio <= 0.3 || b.Ratio >= 1 {
			t.Errorf("%s: bound %.3f", kind, b.Ratio)
		}
		for _, r := range w.Requests {
			if r.OutputLength > w.ClientMaxTokens() {
				t.Fatalf("%s: %s generates %d tokens past max_tokens %d", kind, r.ID, r.OutputLength, w.ClientMaxTokens())
			}
		}
	}
}
