package scheduler

// The peers as their authors run them (issue 24): each case pins one
// decision the peer's upstream source makes and the earlier builtin did
// not.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
)

// conversation is turn t of conversation conv in the shape of the Mooncake
// conversation trace at 512-token blocks: block 0 is the system prompt
// every conversation shares, then the conversation's own blocks.
func conversation(conv, turn int) *Request {
	r := &Request{ID: fmt.Sprintf("c%d-t%d", conv, turn), Tokens: (2 + turn) * 512, SeqHashes: []kvevents.SeqHash{1}}
	for b := range 1 + turn {
		r.SeqHashes = append(r.SeqHashes, kvevents.SeqHash(1000*(conv+1)+b))
	}
	return r
}

// chwbl keys a chat request on its first user message (KubeAI's
// ChatCompletionRequest.Prefix), given as the routing key: conversations
// that share a system prompt spread over the ring, and every turn of one
// conversation lands where its first did. Without a key the opening block
// stands in, which the shared system prompt makes one key for all.
func TestCHWBLKeysTheFirstUserMessage(t *testing.T) {
	p := NewCHWBL()
	rows := []CandidateRow{{Key: wk("a", 0)}, {Key: wk("b", 0)}, {Key: wk("c", 0)}, {Key: wk("d", 0)}}
	pickAt := func(r *Request) string {
		x, c := NewCandidates(r, 512, len(r.SeqHashes), 1, nil, rows)
		i, err := p.Select(x, c)
		if err != nil {
			t.Fatal(err)
		}
		return c.Key(i).Worker
	}
	keyed, unkeyed := map[string]int{}, map[string]int{}
	for conv := range 32 {
		r := conversation(conv, 0)
		unkeyed[pickAt(r)]++
		r.RoutingKey = fmt.Sprintf("conversation %d", conv)
		owner := pickAt(r)
		keyed[owner]++
		for turn := 1; turn < 4; turn++ {
			next := conversation(conv, turn)
			next.RoutingKey = r.RoutingKey
			if got := pickAt(next); got != owner {
				t.Fatalf("conversation %d turn %d went to %s, its first turn to %s", conv, turn, got, owner)
			}
		}
	}
	if len(unkeyed) != 1 {
		t.Fatalf("without a routing key the shared first block should be one key, got owners %v", unkeyed)
	}
	if len(keyed) < 3 {
		t.Fatalf("32 conversations keyed by their first user message reached only %v", keyed)
	}
	// Only the first prefix_chars characters count, as KubeAI's firstNChars.
	long := strings.Repeat("x", 100)
	a, b := conversation(0, 0), conversation(1, 0)
	a.RoutingKey, b.RoutingKey = long+"tail one", long+"another tail"
	if pickAt(a) != pickAt(b) {
		t.Fatal("keys equal in their first 100 characters went to different workers")
	}
	if got := firstRunes("héllo", 2); got != "hé" {
		t.Fatalf("firstRunes counts bytes: %q", got)
	}
}

// llm-d's queue scorer reads the engines' waiting queues, not the
// requests booked (running plus waiting): a worker running many requests
// with nothing waiting has the best queue score.
func TestLLMDQueueScoresWaitingOnly(t *testing.T) {
	rows := []CandidateRow{
		{Key: wk("a", 0), ActiveRequests: 12, WaitingRequests: 0, KVBlocks: 100},
		{Key: wk("b", 0), ActiveRequests: 1, WaitingRequests: 4, KVBlocks: 100},
		{Key: wk("c", 0), ActiveRequests: 1, WaitingRequests: 2, KVBlocks: 100},
	}
	x, c := NewCandidates(peerReq("r", 0, 4), 16, 4, 1, nil, rows)
	cost := make([]float64, 3)
	LLMDQueueScorer{}.Score(x, c, cost)
	for i, want := range []float64{1, 0, 0.5} {
		if -cost[i] != want {
			t.Fatalf("row %d: queue score %v, want %v", i, -cost[i], want)
		}
	}
	if got := pick(t, NewLLMD(), peerReq("r", 0, 4), rows); got != "a" {
		t.Fatalf("picked %s, want a (nothing waiting there)", got)
	}
}

// The waiting count comes from the worker's own load report, expires with
// its correction, and bookings never change it.
func TestWaitingRequestsFromLoadReports(t *testing.T) {
	var seen []int
	p := &recordingPolicy{pick: func(_ *Context, c *Candidates) int {
		seen = append(seen, c.WaitingRequests(0))
		return 0
	}}
	h := newHarness(t, Config{LoadReportTTL: 10 * time.Second}, p, wi("a", 0))
	h.c.observeLoad(LoadReport{Key: wk("a", 0), ActiveRequests: 2, WaitingRequests: 5})
	h.admitted(h.submit(&Request{ID: "r1", Tokens: 10}))
	h.admitted(h.submit(&Request{ID: "r2", Tokens: 10}))
	h.clock.Advance(11 * time.Second)
	h.c.guard(h.clock.Now())
	h.admitted(h.submit(&Request{ID: "r3", Tokens: 10}))
	if fmt.Sprint(seen) != "[5 5 0]" {
		t.Fatalf("waiting seen by the policy %v, want [5 5 0] (bookings add nothing; the report expires)", seen)
	}
}

// llm-d's session-affinity scorer adds 1 for the endpoint the session is
// bound to (the Soft target): enough to keep a session on a worker whose
// queue is a little longer, and nothing without a binding.
func TestLLMDSessionAffinity(t *testing.T) {
	// queues 1, 0, 4: queue scores 0.75, 1, 0. a: 2·0.75 + 2 + 1 = 4.5
	// with its binding, 3.5 without; b: 2 + 2 = 4.
	rows := []CandidateRow{
		{Key: wk("a", 0), WaitingRequests: 1, KVBlocks: 100},
		{Key: wk("b", 0), WaitingRequests: 0, KVBlocks: 100},
		{Key: wk("c", 0), WaitingRequests: 4, KVBlocks: 100},
	}
	if got := pick(t, NewLLMD(), peerReq("r", 0, 4), rows); got != "b" {
		t.Fatalf("without a session: picked %s, want b", got)
	}
	bound := wk("a", 0)
	x, c := NewCandidates(peerReq("r", 0, 4), 16, 4, 1, &bound, rows)
	i, err := NewLLMD().Select(x, c)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Key(i).Worker; got != "a" {
		t.Fatalf("session bound to a: picked %s, want a", got)
	}
	// The weight is a parameter; 0 turns the scorer off.
	reg := NewRegistry()
	off, err := reg.BuildYAML([]byte("name: llmd\nparams: {session_affinity_weight: 0}"))
	if err != nil {
		t.Fatal(err)
	}
	x, c = NewCandidates(peerReq("r", 0, 4), 16, 4, 1, &bound, rows)
	if i, err := off.Select(x, c); err != nil || c.Key(i).Worker != "b" {
		t.Fatalf("weight 0: picked %v (%v), want b", c.Key(i), err)
	}
}

// sglang's smallest tree is its routing history, as SGLang's approximate
// tree is: each request routed to a worker grows its tree by the blocks it
// brings that the worker did not hold (prompt blocks less the overlap), and
// a finished request does not shrink it (the most free KV would).
func TestSGLangSmallestTreeIsRoutingHistory(t *testing.T) {
	h := newHarness(t, Config{}, NewSGLang(), wi("a", 0), wi("b", 0), wi("c", 0))
	route := func(id string, salt uint64, blocks int, ov []Overlap) Decision {
		t.Helper()
		r := &Request{ID: id, Tokens: 16 * blocks, SeqHashes: hashes(blocks, salt), Overlaps: ov}
		d := h.admitted(h.submit(r))
		if err := h.s.PrefillDone(d.Fence); err != nil {
			t.Fatal(err)
		}
		return d
	}
	var got []string
	// Misses on empty trees: a (first), then b and c as trees grow.
	first := route("r1", 1, 20, nil)
	got = append(got, first.Worker.Worker, route("r2", 2, 10, nil).Worker.Worker, route("r3", 3, 10, nil).Worker.Worker)
	// r1 ends: a's KV is free again, its tree (20) is not: the next miss
	// goes to b (10), not a.
	if err := h.s.Free(first.Fence); err != nil {
		t.Fatal(err)
	}
	got = append(got, route("r4", 4, 5, nil).Worker.Worker)
	// Trees 20, 15, 10. 10 blocks with 3 cached on c (match 0.3, not
	// above: a miss): c, whose tree grows by 7 → 17; then b (15).
	got = append(got, route("r5", 5, 10, []Overlap{{Key: wk("c", 0), Blocks: 3}}).Worker.Worker)
	got = append(got, route("r6", 6, 5, nil).Worker.Worker)
	if fmt.Sprint(got) != "[a b c b c b]" {
		t.Fatalf("misses went to %v, want [a b c b c b]", got)
	}
	_, c := NewCandidates(peerReq("r", 0, 1), 16, 1, 1, nil, []CandidateRow{{Key: wk("a", 0), RoutedBlocks: 3}})
	if c.RoutedBlocks(0) != 3 {
		t.Fatalf("RoutedBlocks %d, want 3", c.RoutedBlocks(0))
	}
}

// dynamo books a request's prompt blocks only (Dynamo's
// --router-track-output-blocks is off by default), so the potential decode
// blocks its cost weighs hold no output; track_output_blocks: true books
// them, as kvrouter does.
func TestDynamoBooksNoOutputBlocks(t *testing.T) {
	reg := NewRegistry()
	tracking, err := reg.BuildYAML([]byte("name: dynamo\nparams: {track_output_blocks: true}"))
	if err != nil {
		t.Fatal(err)
	}
	dynamo, err := reg.Build(PolicyConfig{Name: "dynamo"})
	if err != nil {
		t.Fatal(err)
	}
	defaultTracking, err := reg.BuildYAML([]byte("name: default\nparams: {track_output_blocks: true}"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		p    Policy
		want int
	}{
		{"dynamo", dynamo, 10},
		{"dynamo tracking output", tracking, 110},
		{"default", NewDefaultPolicy(0), 10},
		{"default tracking output", defaultTracking, 110},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{}, tc.p, WorkerInfo{Key: wk("a", 0), KVBlocks: 10000, Available: true})
			r := &Request{ID: "r", Tokens: 160, ExpectedOutput: 1600, SeqHashes: hashes(10, 1)}
			h.admitted(h.submit(r))
			if got := h.loads()[wk("a", 0)].DecodeBlocks; got != tc.want {
				t.Fatalf("decode blocks booked %d, want %d", got, tc.want)
			}
		})
	}
}

// Each peer's own admission, session affinity and predict-on-route: none
// of them queues in the router by default; llm-d's affinity is a scorer
// (Soft), Dynamo's binding Hard by default, SGLang's cache_aware and
// KubeAI's PrefixHash have none. llm-d's default prefix scorer and SGLang's
// tree take a prompt in as they route it; Dynamo's predict-on-route index
// is off unless --router-predicted-ttl-secs is set, and KubeAI has no cache
// index. kvrouter's own policies have no record: they run with the
// scheduler's Config.
func TestPeerOperations(t *testing.T) {
	reg := NewRegistry()
	for _, tc := range []struct {
		name, mode string
		predict    time.Duration
	}{
		{"llmd", "soft", 5 * time.Second},
		{"sglang", "", 5 * time.Second},
		{"dynamo", "hard", 0},
		{"chwbl", "", 0},
	} {
		name := tc.name
		op, ok := reg.Operation(name)
		if !ok {
			t.Fatalf("%s: no operation", name)
		}
		if op.Thresholds != (Thresholds{}) || op.SessionMode != tc.mode || op.PredictOnRoute != tc.predict || op.Source == "" {
			t.Errorf("%s: %+v, want no thresholds, session mode %q, predict on route %v and a source", name, op, tc.mode, tc.predict)
		}
		if _, err := reg.Build(PolicyConfig{Name: name}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, name := range []string{"default", "two-tier", "round-robin"} {
		if _, ok := reg.Operation(name); ok {
			t.Errorf("%s has a peer operation", name)
		}
	}
}
