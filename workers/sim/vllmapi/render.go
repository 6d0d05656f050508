package vllmapi

import "net/http"

// The render endpoints of newer vLLM (vllm-project/vllm#36166):
// POST /v1/chat/completions/render and /v1/completions/render take the
// generate endpoints' bodies and answer with the engine-ready request
// instead of generating, so that a router can hash exactly the tokens the
// engine will compute. Config.DisableRender leaves them out (404), as a vLLM
// from before them.

// renderedRequest is vLLM's GenerateRequest: the chat endpoint answers one,
// the completions endpoint a list of one per prompt (the simulator serves
// one prompt per request).
type renderedRequest struct {
	RequestID      string          `json:"request_id"`
	TokenIDs       []uint32        `json:"token_ids"`
	Features       *Features       `json:"features"` // multimodal hashes and placeholder ranges (media.go); null without media
	SamplingParams renderedSampler `json:"sampling_params"`
	Model          *string         `json:"model"`
	Stream         bool            `json:"stream"`
	StreamOptions  *streamOptions  `json:"stream_options"`
	CacheSalt      *string         `json:"cache_salt"`
	Priority       int             `json:"priority"`
	KVTransfer     *struct{}       `json:"kv_transfer_params"`
}

// renderedSampler is the part of vLLM's SamplingParams the simulator has.
type renderedSampler struct {
	N           int     `json:"n"`
	Temperature float64 `json:"temperature"`
	MaxTokens   int     `json:"max_tokens"`
}

// renderChat is POST /v1/chat/completions/render: the chat's prompt
// rendered exactly as POST /v1/chat/completions renders it, with the same
// validation (a prompt too long for the context is refused here too).
func (s *Server) renderChat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if !s.decode(w, r, &req) {
		return
	}
	tokens, items, e := s.chatPrompt(&req)
	if e == nil {
		var out renderedRequest
		if out, e = s.rendered(true, req.sampling, tokens, req.maxTokens()); e == nil {
			out.Features = featuresOf(items)
			writeJSON(w, http.StatusOK, out)
			return
		}
	}
	writeError(w, e)
}

// renderCompletion is POST /v1/completions/render: a list of one rendered
// request.
func (s *Server) renderCompletion(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if !s.decode(w, r, &req) {
		return
	}
	tokens, e := s.completionTokens(&req)
	if e == nil {
		var out renderedRequest
		if out, e = s.rendered(false, req.sampling, tokens, req.MaxTokens); e == nil {
			writeJSON(w, http.StatusOK, []renderedRequest{out})
			return
		}
	}
	writeError(w, e)
}

// rendered validates a rendered prompt as the generate endpoints do and
// builds the reply.
func (s *Server) rendered(chat bool, sp sampling, tokens []uint32, maxTokens *int) (renderedRequest, *Error) {
	n, e := s.outputLen(sp, tokens, maxTokens)
	if e != nil {
		return renderedRequest{}, e
	}
	out := renderedRequest{RequestID: s.newID(chat), TokenIDs: tokens, Stream: sp.Stream,
		SamplingParams: renderedSampler{N: 1, Temperature: 1, MaxTokens: n}}
	if sp.Temperature != nil {
		out.SamplingParams.Temperature = *sp.Temperature
	}
	if sp.Model != "" {
		out.Model = &sp.Model
	}
	if sp.Stream {
		out.StreamOptions = sp.StreamOptions
	}
	return out, nil
}
