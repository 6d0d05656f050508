package vllmapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workers/sim"
)

// job is one generation request, validated, in the terms both endpoints
// share.
type job struct {
	id           string
	chat         bool
	tokens       []uint32
	media        []kvevents.MediaItem // the prompt's images (chat)
	maxTokens    int
	finish       string // finish_reason: "length", or "stop" when sim_output_tokens ended it first
	stream       bool
	includeUsage bool
	rank         uint32
	created      int64
	model        string // the served model's or the adapter's name, as the reply says it
	lora         string // the adapter ("" = the base model), its id and the cache salt (lora.go)
	loraID       int
	salt         string
	// disaggregation (pd.go, bootstrap.go): the request's fields, whether
	// it is a vLLM prefill leg, the blocks its KV transfer brought, an
	// SGLang prefill leg's room
	disagg       disaggFields
	remoteDecode bool
	transferred  int
	room         *room
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if !s.decode(w, r, &req) {
		return
	}
	tokens, e := s.completionTokens(&req)
	if e != nil {
		writeError(w, e)
		return
	}
	j, e := s.newJob(r, false, req.sampling, tokens, req.MaxTokens)
	if e != nil {
		writeError(w, e)
		return
	}
	s.run(w, r, j)
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if !s.decode(w, r, &req) {
		return
	}
	tokens, media, e := s.chatPrompt(&req)
	if e != nil {
		writeError(w, e)
		return
	}
	j, e := s.newJob(r, true, req.sampling, tokens, req.maxTokens())
	if e != nil {
		writeError(w, e)
		return
	}
	j.media = media
	s.run(w, r, j)
}

// chatPrompt renders a chat request with every field that shapes it into
// the tokens the engine computes, images expanded into their placeholders,
// and the images' items.
func (s *Server) chatPrompt(req *chatRequest) ([]uint32, []kvevents.MediaItem, *Error) {
	tokens, e := s.chatTokens(req)
	if e != nil {
		return nil, nil, e
	}
	return s.chatMedia(tokens, req.Messages)
}

// completionTokens is a completion's prompt as the engine computes it:
// add_special_tokens (default true) puts the BOS token in front of a text
// prompt.
func (s *Server) completionTokens(req *completionRequest) ([]uint32, *Error) {
	tokens, err := promptTokens(req.Prompt, s.cfg.BOS && (req.AddSpecialTokens == nil || *req.AddSpecialTokens))
	if err != nil {
		return nil, badRequest("%v", err)
	}
	return tokens, nil
}

// chatTokens is a chat's prompt rendered with every field that shapes it.
func (s *Server) chatTokens(req *chatRequest) ([]uint32, *Error) {
	tokens, err := req.render(&req.chatOnlyFields, s.cfg.BOS)
	if err != nil {
		return nil, badRequest("%v", err)
	}
	return tokens, nil
}

// maxTokens is the output limit asked for: the newer name wins, as in vLLM.
func (c *chatRequest) maxTokens() *int {
	if c.MaxCompletionTokens != nil {
		return c.MaxCompletionTokens
	}
	return c.MaxTokens
}

// newJob validates what both endpoints share.
func (s *Server) newJob(r *http.Request, chat bool, sp sampling, tokens []uint32, maxTokens *int) (job, *Error) {
	n, e := s.outputLen(sp, tokens, maxTokens)
	if e != nil {
		return job{}, e
	}
	finish := finishLength
	if sp.SimOutputTokens != nil {
		// The simulator's extension: the simulated model ends its reply
		// here, as a real one emits its end of sequence before max_tokens.
		if *sp.SimOutputTokens < 1 {
			return job{}, badRequest("sim_output_tokens must be at least 1, got %d.", *sp.SimOutputTokens)
		}
		if *sp.SimOutputTokens < n {
			n, finish = *sp.SimOutputTokens, finishStop
		}
	}
	rank, e := s.pickRank(r)
	if e != nil {
		return job{}, e
	}
	j := job{
		id:           s.newID(chat),
		chat:         chat,
		tokens:       tokens,
		maxTokens:    n,
		finish:       finish,
		stream:       sp.Stream,
		includeUsage: sp.Stream && sp.StreamOptions != nil && sp.StreamOptions.IncludeUsage,
		rank:         rank,
		created:      time.Now().Unix(),
		disagg:       sp.disaggFields,
	}
	if e := s.jobKeys(&sp, &j); e != nil {
		return job{}, e
	}
	return j, nil
}

// outputLen checks a prompt against the context length and returns the
// number of tokens to generate: without max_tokens, up to the context
// length, as in vLLM.
func (s *Server) outputLen(sp sampling, tokens []uint32, maxTokens *int) (int, *Error) {
	if sp.N != nil && *sp.N != 1 {
		return 0, badRequest("n = %d: the simulator generates exactly one choice (n = 1)", *sp.N)
	}
	if len(tokens) == 0 {
		return 0, badRequest("the prompt is empty: at least one token is needed")
	}
	limit := s.cfg.MaxModelLen
	if len(tokens) >= limit {
		return 0, badRequest("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", limit, len(tokens))
	}
	n := limit - len(tokens)
	if maxTokens != nil {
		n = *maxTokens
		if n < 1 {
			return 0, badRequest("max_tokens must be at least 1, got %d.", n)
		}
		if len(tokens)+n > limit {
			return 0, badRequest("'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).", n, limit, len(tokens), n, limit, len(tokens))
		}
	}
	return n, nil
}

// newID is a request id: cmpl- or chatcmpl- and a per-server counter.
func (s *Server) newID(chat bool) string {
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	return fmt.Sprintf("%s%016x", prefix, s.nextID.Add(1))
}

// run submits j to the engine and writes the reply, streamed or whole. The
// request's context is the submit context: a client that goes away cancels
// the request, and the engine frees its blocks.
func (s *Server) run(w http.ResponseWriter, r *http.Request, j job) {
	ctx := r.Context()
	if e := s.prepareDisagg(ctx, &j, &j.disagg); e != nil {
		writeError(w, e)
		return
	}
	st, err := s.eng.Submit(ctx, j.simRequest())
	if err != nil {
		s.finishBootstrap(j, err)
		writeError(w, submitError(err))
		return
	}
	s.inflight[j.rank].Add(1)
	defer s.inflight[j.rank].Add(-1)
	span := s.startSpan(r, &j)
	var res sim.Result
	var ok bool
	if j.stream {
		res, ok = s.stream(ctx, w, j, st)
	} else {
		res, ok = s.whole(ctx, w, j, st)
	}
	if !ok {
		s.finishBootstrap(j, errors.New("the prefill leg's client went away"))
		// The client left first: the result comes once the engine has
		// dropped the request; count it then.
		go func() {
			res, _ := st.Wait(context.Background())
			s.metrics.observe(j.rank, res)
			endSpan(span, res)
		}()
		return
	}
	s.finishBootstrap(j, res.Err)
	s.metrics.observe(j.rank, res)
	endSpan(span, res)
}

func submitError(err error) *Error {
	switch {
	case errors.Is(err, sim.ErrTooLong), errors.Is(err, sim.ErrBadMedia):
		return badRequest("the request does not fit in the simulated KV cache: %v", err)
	case errors.Is(err, sim.ErrClosed):
		return unavailable("the engine is shutting down")
	case errors.Is(err, context.Canceled):
		return badRequest("request cancelled: %v", err)
	}
	return internal("%v", err)
}

// resultError is the reply to a request the engine ended with an error.
func resultError(res sim.Result) *Error {
	switch {
	case errors.Is(res.Err, sim.ErrClosed), errors.Is(res.Err, sim.ErrRestarted):
		return unavailable("request %s: %v", res.RequestID, res.Err)
	}
	return internal("request %s: %v", res.RequestID, res.Err)
}

// collect reads every token of st. ok is false when ctx ended first.
func collect(ctx context.Context, st *sim.Stream) (out []uint32, res sim.Result, ok bool) {
	var buf []uint32
	for {
		ch, err := st.RecvInto(ctx, buf)
		if err == io.EOF {
			res, _ = st.Result()
			return out, res, true
		}
		if err != nil {
			return nil, sim.Result{}, false
		}
		out = append(out, ch.Tokens...)
		buf = ch.Tokens
	}
}

func usageOf(res sim.Result) *usage {
	return &usage{
		PromptTokens:        res.PromptTokens,
		CompletionTokens:    res.OutputTokens,
		TotalTokens:         res.PromptTokens + res.OutputTokens,
		PromptTokensDetails: promptTokenDet{CachedTokens: res.CachedTokens},
	}
}

// finishLength is the finish reason of a successful request: the filler has
// no end-of-sequence token, so max_tokens ends it, unless the client set the
// simulator's sim_output_tokens below it (finishStop).
var finishLength = sim.FinishLength

const finishStop = "stop"

func (s *Server) whole(ctx context.Context, w http.ResponseWriter, j job, st *sim.Stream) (sim.Result, bool) {
	out, res, ok := collect(ctx, st)
	if !ok {
		return res, false
	}
	if res.Err != nil {
		writeError(w, resultError(res))
		return res, true
	}
	text := string(appendText(nil, out))
	var kv *kvTransferParams
	if j.remoteDecode {
		kv = s.transferParams(j)
	}
	if j.chat {
		writeJSON(w, http.StatusOK, chatReply{
			ID: j.id, Object: "chat.completion", Created: j.created, Model: j.model,
			Choices: []chatChoice{{Message: &chatReplyMessage{Role: "assistant", Content: text, ToolCalls: []string{}}, FinishReason: &j.finish}},
			Usage:   usageOf(res), KVTransferParams: kv,
		})
		return res, true
	}
	writeJSON(w, http.StatusOK, completionReply{
		ID: j.id, Object: "text_completion", Created: j.created, Model: j.model,
		Choices: []completionChoice{{Text: text, FinishReason: &j.finish}},
		Usage:   usageOf(res), KVTransferParams: kv,
	})
	return res, true
}

// sse writes Server-Sent Events: "data: JSON\n\n", flushed per event.
type sse struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte
	err error
}

func (e *sse) send(v any) {
	if e.err != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		e.err = err
		return
	}
	e.raw(b)
}

func (e *sse) raw(payload []byte) {
	if e.err != nil {
		return
	}
	e.buf = append(append(append(e.buf[:0], "data: "...), payload...), "\n\n"...)
	if _, e.err = e.w.Write(e.buf); e.err == nil {
		e.err = e.rc.Flush()
	}
}

// stream writes j's reply as vLLM streams it: for chat a first chunk with
// the role, then one chunk per run of tokens the engine produced (the last
// with finish_reason), the usage chunk when asked for, then [DONE]. An
// error after the stream started is sent as a data event with the error
// object, then [DONE]. ok is false when the client left first.
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, j job, st *sim.Stream) (sim.Result, bool) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	ev := &sse{w: w, rc: http.NewResponseController(w)}
	chunk := s.chunker(j)
	if j.chat {
		ev.send(chunk(&chatDelta{Role: "assistant"}, "", nil))
	}
	var buf []uint32
	var text []byte
	for ev.err == nil {
		ch, err := st.RecvInto(ctx, buf)
		if err == io.EOF {
			break
		}
		if err != nil {
			return sim.Result{}, false
		}
		buf = ch.Tokens
		text = appendText(text[:0], ch.Tokens)
		var finish *string
		if ch.Index+len(ch.Tokens) == j.maxTokens {
			finish = &j.finish
		}
		ev.send(chunk(&chatDelta{Content: string(text)}, string(text), finish))
	}
	if ev.err != nil {
		return sim.Result{}, false
	}
	res, _ := st.Result()
	if res.Err != nil {
		ev.send(resultError(res).body())
	} else if j.includeUsage {
		ev.send(s.usageChunk(j, res))
	}
	ev.raw([]byte("[DONE]"))
	return res, true
}

// usageChunk is the last chunk of a stream with include_usage: no choices,
// the usage.
func (s *Server) usageChunk(j job, res sim.Result) any {
	if j.chat {
		return chatReply{ID: j.id, Object: "chat.completion.chunk", Created: j.created, Model: j.model, Choices: []chatChoice{}, Usage: usageOf(res)}
	}
	return completionReply{ID: j.id, Object: "text_completion", Created: j.created, Model: j.model, Choices: []completionChoice{}, Usage: usageOf(res)}
}

// chunker returns the function that builds j's chunks: a delta (chat) or
// text (completions) with its finish reason.
func (s *Server) chunker(j job) func(d *chatDelta, text string, finish *string) any {
	if j.chat {
		return func(d *chatDelta, _ string, finish *string) any {
			return chatReply{ID: j.id, Object: "chat.completion.chunk", Created: j.created, Model: j.model,
				Choices: []chatChoice{{Delta: d, FinishReason: finish}}}
		}
	}
	return func(_ *chatDelta, text string, finish *string) any {
		return completionReply{ID: j.id, Object: "text_completion", Created: j.created, Model: j.model,
			Choices: []completionChoice{{Text: text, FinishReason: finish}}}
	}
}
