package realpath

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
)

// The invariant of exact routing, over the real path (the official OpenAI
// client → the gateway → a router replica whose index is fed by bridges
// relaying the engines' ZMQ events through the JetStream stream → the
// simulated engines): for every request, the overlap the router predicted
// (X-Kvr-Overlap-Blocks) equals the prefix the engine found in its cache
// (usage.prompt_tokens_details.cached_tokens) in whole blocks. The engine
// never counts the prompt's last token as cached (it computes it to sample
// the first output token, as vLLM does), so a prompt cached to its last
// token is compared at (prompt_tokens - 1) / block.
//
// Each row of shapes is a kind of request real applications send, as
// conversations of several turns (every turn resends the conversation, with
// a session header), sent one at a time. After each reply the harness waits
// until the replica has indexed every block the engine holds, so the test
// compares the router's hashing with the engine's, not event latency. A row
// whose prompt the gateway cannot know (unknown) must claim no prefix.
//
// To add a row (LoRA adapters, cache salts, media, ...): give it a name, a
// face (the engines' options; the rows of a face share one stack of
// engines) and a turn function that sends a conversation's next request
// with the options the harness passes (they capture the reply's headers
// and set the session).

// shape is one row of the table.
type shape struct {
	name string
	face string // a key of faces
	// sessions × turns requests (at least 50 per row).
	sessions, turns int
	// unknown: the gateway cannot know the engine's tokens for these
	// requests (a field the engine's /tokenize lacks, no render endpoint):
	// the router must claim no prefix.
	unknown bool
	turn    turnFunc
	// setup, when set, runs before the row's first request; check after
	// its last.
	setup func(t *testing.T, ss *shapeStack, row shape)
	check func(t *testing.T, engines []*engine)
}

// turnFunc sends conversation c's next request with opts and returns the
// reply's usage; it extends c with the request and the reply.
type turnFunc func(ctx context.Context, cl openai.Client, c *conv, opts []option.RequestOption) (openai.CompletionUsage, error)

// conv is one conversation of a row.
type conv struct {
	row    string
	id     int // session number in the row
	n      int // turns sent
	msgs   []openai.ChatCompletionMessageParamUnion
	prompt string  // completions: the running text
	ids    []int64 // completions: the running token ids
}

// engineFace is what a row asks of the engines: their HTTP options and
// their data-parallel ranks.
type engineFace struct {
	api   func(*vllmapi.Config)
	ranks int
}

// faces are the engines a row can ask for. Every engine has a BOS token, so
// that add_special_tokens changes the prompt.
var faces = map[string]engineFace{
	"render":         {api: func(c *vllmapi.Config) { c.BOS = true }},
	"no-render":      {api: func(c *vllmapi.Config) { c.BOS, c.DisableRender = true, true }},
	"render-2-ranks": {api: func(c *vllmapi.Config) { c.BOS = true }, ranks: 2},
}

// system is the row's system prompt, shared by its conversations (so they
// share a prefix), different from the first bytes for every row.
func (c *conv) system() string { return longText(c.row+" system prompt: answer briefly", 300) }

// question is the conversation's next user message.
func (c *conv) question() string {
	return fmt.Sprintf("session %d turn %d: %s", c.id, c.n, longText("tell me more about prefix caches", 40+(c.id*7+c.n*13)%50))
}

var testTools = []openai.ChatCompletionToolUnionParam{
	openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "get_weather", Description: openai.String("Current weather of a city"),
		Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}}}),
	openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "search_docs", Description: openai.String("Search the documentation"),
		Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{"query": map[string]any{"type": "string"}}}}),
}

// chatTurn is the turn of a chat row: the system prompt first, then a
// user message (or, with tool results, a tool message on odd turns), the
// reply appended as an assistant message. configure sets the row's fields.
func chatTurn(toolResults bool, configure func(*openai.ChatCompletionNewParams) []option.RequestOption) turnFunc {
	return func(ctx context.Context, cl openai.Client, c *conv, opts []option.RequestOption) (openai.CompletionUsage, error) {
		if c.n == 0 {
			c.msgs = []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(c.system())}
		}
		if toolResults && c.n%2 == 1 {
			c.msgs = append(c.msgs, openai.ToolMessage(`{"result":"`+c.question()+`"}`, "call_"+strconv.Itoa(c.n)))
		} else {
			c.msgs = append(c.msgs, openai.UserMessage(c.question()))
		}
		p := openai.ChatCompletionNewParams{Model: testModel, Messages: c.msgs, MaxCompletionTokens: openai.Int(8)}
		if configure != nil {
			opts = append(opts, configure(&p)...)
		}
		r, err := cl.Chat.Completions.New(ctx, p, opts...)
		if err != nil {
			return openai.CompletionUsage{}, err
		}
		c.msgs = append(c.msgs, openai.AssistantMessage(r.Choices[0].Message.Content))
		return r.Usage, nil
	}
}

// withTools gives a chat the two tool definitions, and tool_choice when
// choice is set.
func withTools(choice string) func(*openai.ChatCompletionNewParams) []option.RequestOption {
	return func(p *openai.ChatCompletionNewParams) []option.RequestOption {
		p.Tools = testTools
		if choice != "" {
			p.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String(choice)}
		}
		return nil
	}
}

// continueTurn asks the model to continue an assistant message it starts
// ("Answer:"), and puts the continuation back into that message.
func continueTurn(ctx context.Context, cl openai.Client, c *conv, opts []option.RequestOption) (openai.CompletionUsage, error) {
	if c.n == 0 {
		c.msgs = []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(c.system())}
	}
	const start = "Answer:"
	c.msgs = append(c.msgs, openai.UserMessage(c.question()), openai.AssistantMessage(start))
	p := openai.ChatCompletionNewParams{Model: testModel, Messages: c.msgs, MaxCompletionTokens: openai.Int(8)}
	r, err := cl.Chat.Completions.New(ctx, p, append(opts, option.WithJSONSet("continue_final_message", true),
		option.WithJSONSet("add_generation_prompt", false))...)
	if err != nil {
		return openai.CompletionUsage{}, err
	}
	c.msgs[len(c.msgs)-1] = openai.AssistantMessage(start + r.Choices[0].Message.Content)
	return r.Usage, nil
}

// completionTextTurn extends a text prompt with the reply and a question;
// add_special_tokens is the engine's default (true: BOS first).
func completionTextTurn(ctx context.Context, cl openai.Client, c *conv, opts []option.RequestOption) (openai.CompletionUsage, error) {
	if c.n == 0 {
		c.prompt = c.system() + "\n"
	}
	c.prompt += "Q: " + c.question() + "\nA:"
	r, err := cl.Completions.New(ctx, openai.CompletionNewParams{Model: testModel, MaxTokens: openai.Int(8),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(c.prompt)}}, opts...)
	if err != nil {
		return openai.CompletionUsage{}, err
	}
	c.prompt += r.Choices[0].Text + "\n"
	return r.Usage, nil
}

// completionIDsTurn extends a token-id prompt with the reply's tokens (the
// simulator's tokens are the reply's bytes) and a question's.
func completionIDsTurn(ctx context.Context, cl openai.Client, c *conv, opts []option.RequestOption) (openai.CompletionUsage, error) {
	appendText := func(s string) {
		for i := 0; i < len(s); i++ {
			c.ids = append(c.ids, int64(s[i]))
		}
	}
	if c.n == 0 {
		c.ids = append(c.ids[:0], vllmapi.BOSToken)
		appendText(c.system())
	}
	appendText("Q: " + c.question() + "\nA:")
	r, err := cl.Completions.New(ctx, openai.CompletionNewParams{Model: testModel, MaxTokens: openai.Int(8),
		Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: c.ids}}, opts...)
	if err != nil {
		return openai.CompletionUsage{}, err
	}
	appendText(r.Choices[0].Text + "\n")
	return r.Usage, nil
}

// usedTokenize checks that the engines served the row's prompts from
// /tokenize after at most one render probe each.
func usedTokenize(t *testing.T, engines []*engine) {
	t.Helper()
	for _, e := range engines {
		if r, tk := e.renderCalls.Load(), e.tokenizeCalls.Load(); r > 1 || tk == 0 {
			t.Errorf("engine %s without render endpoints: %d render probes and %d /tokenize calls; want at most 1 probe and /tokenize", e.id, r, tk)
		}
	}
}

// shapes is the table. Rows on the "render" face are tokenized by the
// engines' render endpoints; those on "no-render" by /tokenize.
var shapes = []shape{
	{name: "plain chat", face: "render", sessions: 5, turns: 10, turn: chatTurn(false, nil)},
	{name: "chat with tools and tool_choice", face: "render", sessions: 5, turns: 10, turn: chatTurn(true, withTools("auto"))},
	// enable_thinking changes only the generation prompt (the prompt's
	// tail, which the next turn does not reuse); documents given as a
	// template variable render before the messages.
	{name: "chat_template_kwargs", face: "render", sessions: 5, turns: 10, turn: chatTurn(false, func(*openai.ChatCompletionNewParams) []option.RequestOption {
		return []option.RequestOption{option.WithJSONSet("chat_template_kwargs", map[string]any{"enable_thinking": false,
			"documents": []map[string]string{{"title": "caches", "text": "A prefix cache keeps the KV blocks of earlier prompts."}}})}
	})},
	{name: "continue_final_message", face: "render", sessions: 5, turns: 10, turn: continueTurn},
	{name: "completions with a string", face: "render", sessions: 5, turns: 10, turn: completionTextTurn},
	{name: "completions with token ids", face: "render", sessions: 5, turns: 10, turn: completionIDsTurn},
	{name: "no render endpoint: chat with tools", face: "no-render", sessions: 5, turns: 10, turn: chatTurn(true, withTools("")), check: usedTokenize},
	{name: "no render endpoint: tool_choice", face: "no-render", sessions: 5, turns: 10, unknown: true, turn: chatTurn(true, withTools("required")), check: usedTokenize},
	// Each rank has its own cache: a request the gateway sent to another
	// rank than the routed one (X-Data-Parallel-Rank) finds it cold.
	{name: "two data-parallel ranks: chat with tools", face: "render-2-ranks", sessions: 5, turns: 10, turn: chatTurn(true, withTools("auto")),
		setup: warmRank1, check: usedRanks},
}

// warmRank1 sends a first turn of the row straight to rank 1 of each engine
// (X-Data-Parallel-Rank: 1), so that the row's shared prefix (system
// prompt, tools) is cached there and the router sends the row's requests to
// rank 1: without the header an idle engine would serve them on rank 0.
func warmRank1(t *testing.T, ss *shapeStack, row shape) {
	t.Helper()
	for _, e := range ss.engines {
		cl := openai.NewClient(option.WithBaseURL(e.url+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0),
			option.WithHTTPClient(ss.http))
		c := &conv{row: row.name, id: -1}
		if _, err := row.turn(context.Background(), cl, c, []option.RequestOption{option.WithHeader(vllmapi.RankHeader, "1")}); err != nil {
			t.Fatalf("warming %s#1: %v", e.id, err)
		}
		ss.waitIndexed(t, e.id)
	}
}

// usedRanks checks that the row's requests were served by rank 1 (warmed
// by warmRank1), so that the exact overlaps show the gateway sent them
// there: an idle engine serves a request without X-Data-Parallel-Rank on
// rank 0.
func usedRanks(t *testing.T, engines []*engine) {
	t.Helper()
	served := 0
	for _, e := range engines {
		served += int(e.eng.Stats()[1].Completed) - 1 // less the warming request
	}
	if served < 25 {
		t.Errorf("%d of the row's requests were served by rank 1: the row does not test the rank header", served)
	}
}

// shapeStack is a stack for the rows of one face, with a gateway over NATS.
type shapeStack struct {
	*stack
	client openai.Client
}

// TestRouterPredictsEngineCacheForEveryShape runs the table: the rows of
// each face on one stack, which stops before the next face's starts.
func TestRouterPredictsEngineCacheForEveryShape(t *testing.T) {
	var order []string
	for _, row := range shapes {
		if !slices.Contains(order, row.face) {
			order = append(order, row.face)
		}
	}
	for _, face := range order {
		t.Run(face, func(t *testing.T) {
			ss := startShapeStack(t, face, stackOpts{replicas: 1})
			for _, row := range shapes {
				if row.face != face {
					continue
				}
				t.Run(row.name, func(t *testing.T) {
					if row.setup != nil {
						row.setup(t, ss, row)
					}
					matched, total := runShape(t, ss, row)
					t.Logf("%s: %d of %d requests predicted exactly", row.name, matched, total)
					if row.check != nil {
						row.check(t, ss.engines)
					}
				})
			}
		})
	}
}

// startShapeStack starts two engines with face's options, o's replicas
// (and eventsOnly) and a gateway. The gateway routes in process over replica 0 (as `kvrouter
// serve --openai-addr`): a route over NATS costs a hundred times more under
// the race detector, and the invariant is about hashing, not the route
// API's transport (TestOpenAIClientThroughBridgesAndGateway covers it).
func startShapeStack(t *testing.T, face string, o stackOpts) *shapeStack {
	t.Helper()
	f := faces[face]
	o.engines, o.kvBlocks, o.face, o.ranks, o.staleIntervals = 2, 4096, f.api, f.ranks, 100
	st := startStack(t, o)
	base := st.gatewayURL(gateway.ReplicaRouter{R: st.replicas[0]})
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	return &shapeStack{stack: st, client: openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("test"),
		option.WithMaxRetries(0), option.WithHTTPClient(hc))}
}

// runShape sends the row's conversations, turn by turn across its
// sessions, and checks every reply against the prediction.
func runShape(t *testing.T, ss *shapeStack, row shape) (matched, total int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	convs := make([]*conv, row.sessions)
	for i := range convs {
		convs[i] = &conv{row: row.name, id: i}
	}
	for turn := range row.turns {
		for _, c := range convs {
			var hr *http.Response
			opts := []option.RequestOption{option.WithResponseInto(&hr), option.WithHeader("X-Session-Id", row.name+"/"+strconv.Itoa(c.id))}
			u, err := row.turn(ctx, ss.client, c, opts)
			if err != nil {
				var ae *openai.Error
				if errors.As(err, &ae) {
					err = fmt.Errorf("%w: %s", err, ae.RawJSON())
				}
				t.Fatalf("session %d turn %d: %v", c.id, turn, err)
			}
			c.n++
			total++
			overlap, err := strconv.Atoi(hr.Header.Get(gateway.HeaderOverlapBlocks))
			if err != nil {
				t.Fatalf("session %d turn %d: %s %q", c.id, turn, gateway.HeaderOverlapBlocks, hr.Header.Get(gateway.HeaderOverlapBlocks))
			}
			cached, prompt := int(u.PromptTokensDetails.CachedTokens)/testBlock, int(u.PromptTokens)
			ok := cached == min(overlap, (prompt-1)/testBlock)
			if row.unknown {
				ok = overlap == 0 // claim nothing, whatever the engine held
			}
			if ok {
				matched++
			} else {
				t.Errorf("session %d turn %d on %s: the router predicted %d blocks, the engine had %d tokens cached of %d (at most %d blocks)",
					c.id, turn, hr.Header.Get(gateway.HeaderWorker), overlap, u.PromptTokensDetails.CachedTokens, prompt, (prompt-1)/testBlock)
			}
			worker, _, _ := strings.Cut(hr.Header.Get(gateway.HeaderWorker), "#")
			ss.waitIndexed(t, worker)
		}
	}
	return matched, total
}

// waitIndexed waits until the replicas index as many blocks on each rank
// of the engine named worker as the engine holds there (the caches are
// large enough that nothing is evicted, so equal counts are equal sets).
// Only the engine that served the last request has changed since the last
// wait.
func (st *stack) waitIndexed(t *testing.T, worker string) {
	t.Helper()
	i := slices.IndexFunc(st.engines, func(e *engine) bool { return e.id == worker })
	if i < 0 {
		t.Fatalf("no engine %q", worker)
	}
	e := st.engines[i]
	var last string
	testutil.Eventually(t, 10*time.Second, func() bool {
		for k, hs := range e.eng.Dump() {
			for _, r := range st.replicas {
				if got := st.indexed(r, e.id, k.Rank); got != len(hs) {
					last = fmt.Sprintf("%s indexes %d blocks on %s, the engine holds %d", r.ID(), got, k, len(hs))
					return false
				}
			}
		}
		return true
	}, func() string { return "the replicas to index the engine's blocks: " + last })
}

// A row's turns must be many enough for the table's promise.
func TestShapesHaveFiftyRequests(t *testing.T) {
	for _, row := range shapes {
		if n := row.sessions * row.turns; n < 50 || row.turns < 2 {
			t.Errorf("row %q: %d requests in conversations of %d turns; want at least 50, multi-turn", row.name, n, row.turns)
		}
		if faces[row.face].api == nil {
			t.Errorf("row %q: unknown face %q", row.name, row.face)
		}
	}
}
