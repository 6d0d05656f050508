package realpath

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// An agent workload through the real path reaches the same engine hit
// ratio with tool definitions as without them. Each session shares one
// system prompt (and, in the tools variant, the tool definitions, which the
// engine renders before it); its first turn is a short task, every later
// turn the result of the tool the assistant called in its reply (a "tool"
// message with the call's tool_call_id, as OpenAI clients send). The
// variants send the same messages, each on its own stack (fresh caches);
// only `tools` differs. A gateway that dropped `tools` would hash prompts
// the engine never renders: every prediction would miss the engine's cache
// (runShape fails), and the sessions' first turns would route on load
// alone, away from the engine holding the shared prefix. The replicas run
// without the predicted index (eventsOnly), so that the hit ratio rests
// on the engines' events alone: the predicted index records the gateway's
// own hashes and would draw the sessions together even when they are
// wrong.

// agentSessions × agentTurns requests per variant.
const agentSessions, agentTurns = 4, 8

// agentTolerance is how far (in percentage points) the tools variant's hit
// ratio may fall below the variant without tools: the tool definitions add
// shared tokens, so it should if anything hit more.
const agentTolerance = 2.0

// agentTurn is the turn of an agent session: the system prompt and a
// task first, then the result of the previous reply's tool call. The reply
// is appended as an assistant message calling a tool (the simulated engine
// answers text; an agent's client sends the call back as tool_calls).
func agentTurn(tools bool, usage *openai.CompletionUsage) turnFunc {
	return func(ctx context.Context, cl openai.Client, c *conv, opts []option.RequestOption) (openai.CompletionUsage, error) {
		callID := fmt.Sprintf("call_%d_%d", c.id, c.n-1)
		switch c.n {
		case 0:
			c.msgs = []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(longText("agent system prompt: plan, call tools, answer briefly", 300)),
				openai.UserMessage(fmt.Sprintf("task %d: find the weather where the docs say the cache lives", c.id))}
		default:
			c.msgs = append(c.msgs, openai.ToolMessage(fmt.Sprintf(`{"result":"step %d of task %d done"}`, c.n, c.id), callID))
		}
		p := openai.ChatCompletionNewParams{Model: testModel, Messages: c.msgs, MaxCompletionTokens: openai.Int(8)}
		if tools {
			p.Tools = testTools
		}
		r, err := cl.Chat.Completions.New(ctx, p, opts...)
		if err != nil {
			return openai.CompletionUsage{}, err
		}
		name := []string{"get_weather", "search_docs"}[c.n%2]
		c.msgs = append(c.msgs, openai.ChatCompletionMessageParamUnion{OfAssistant: &openai.ChatCompletionAssistantMessageParam{
			Content: openai.ChatCompletionAssistantMessageParamContentUnion{OfString: openai.String(r.Choices[0].Message.Content)},
			ToolCalls: []openai.ChatCompletionMessageToolCallUnionParam{{OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
				ID: fmt.Sprintf("call_%d_%d", c.id, c.n), Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{
					Name: name, Arguments: `{"query":"step ` + strconv.Itoa(c.n) + `"}`}}}}}})
		usage.PromptTokens += r.Usage.PromptTokens
		usage.PromptTokensDetails.CachedTokens += r.Usage.PromptTokensDetails.CachedTokens
		return r.Usage, nil
	}
}

// The hit ratio is cached_tokens over prompt_tokens summed over every turn,
// the sessions' first turns included: later turns stay on their session's
// engine whatever the router knows, so the first turns are where routing
// on the shared prefix shows. runShape checks every request's predicted
// overlap against cached_tokens, as the shapes rows do.
func TestAgentWorkloadHitRatioWithTools(t *testing.T) {
	ratio := map[bool]float64{}
	for _, tools := range []bool{false, true} {
		name := map[bool]string{false: "without tools", true: "with tools"}[tools]
		t.Run(name, func(t *testing.T) {
			ss := startShapeStack(t, "render", stackOpts{replicas: 2, eventsOnly: true})
			var u openai.CompletionUsage
			row := shape{name: "agent " + name, sessions: agentSessions, turns: agentTurns, turn: agentTurn(tools, &u)}
			matched, total := runShape(t, ss, row)
			ratio[tools] = 100 * float64(u.PromptTokensDetails.CachedTokens) / float64(u.PromptTokens)
			t.Logf("agent %s: %d of %d requests predicted exactly; hit ratio %.1f%% (%d of %d prompt tokens cached)",
				name, matched, total, ratio[tools], u.PromptTokensDetails.CachedTokens, u.PromptTokens)
			ss.waitIdle()
		})
	}
	if t.Failed() {
		return
	}
	if ratio[true] < ratio[false]-agentTolerance {
		t.Fatalf("agent hit ratio with tools %.1f%%, without %.1f%%: more than %.0f points lower", ratio[true], ratio[false], agentTolerance)
	}
}
