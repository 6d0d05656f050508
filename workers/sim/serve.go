package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/internal/escape"
	"github.com/nats-io/nats.go"
)

// The generate protocol (docs/protocol.md): a client publishes one
// GenerateRequest (JSON) to the worker's endpoint
// <prefix>.worker.<model>.<worker>.generate with a reply subject (an inbox).
// The worker publishes to that reply subject zero or more chunk messages,
// then exactly one final message ("done": true) with the timings the engine
// produced, or an error. All messages are GenerateReply JSON objects.

// Limits on what one request may ask for, checked before any allocation.
const (
	MaxRequestTokens = 1 << 22 // prompt tokens after block expansion
	MaxBlockTokens   = 1 << 16 // block_tokens
)

// GenerateRequest is the JSON body of a generate request. Give either
// token_ids or block_ids (Mooncake-style block ids, expanded with
// ExpandBlockIDs(block_tokens, input_length)).
type GenerateRequest struct {
	RequestID   string   `json:"request_id"`
	TokenIDs    []uint32 `json:"token_ids,omitempty"`
	BlockIDs    []uint64 `json:"block_ids,omitempty"`
	BlockTokens int      `json:"block_tokens,omitempty"` // tokens per block id; 0 = 512
	InputLength int      `json:"input_length,omitempty"` // prompt length for block_ids; 0 = all blocks full
	MaxTokens   int      `json:"max_tokens"`
	LoRAName    string   `json:"lora_name,omitempty"`
	Rank        uint32   `json:"rank,omitempty"` // data-parallel rank
	// Prefill/decode disaggregation (docs/pd.md), the NATS face of vLLM's
	// kv_transfer_params: RemoteDecode marks a prefill leg, whose final
	// message names the prompt blocks it holds (RemoteBlocks); a decode
	// leg's RemoteBlocks are the leading prompt blocks its prefill engine
	// holds, pulled (Engine.Pull) before the request runs.
	RemoteDecode bool `json:"remote_decode,omitempty"`
	RemoteBlocks int  `json:"remote_blocks,omitempty"`
}

// Tokens returns the request's prompt tokens, expanding block ids.
func (r *GenerateRequest) Tokens() ([]uint32, error) {
	switch {
	case len(r.TokenIDs) > 0 && len(r.BlockIDs) > 0:
		return nil, fmt.Errorf("%w: both token_ids and block_ids", ErrBadRequest)
	case len(r.TokenIDs) > 0:
		if len(r.TokenIDs) > MaxRequestTokens {
			return nil, fmt.Errorf("%w: %d token_ids (max %d)", ErrTooLong, len(r.TokenIDs), MaxRequestTokens)
		}
		return r.TokenIDs, nil
	case len(r.BlockIDs) > 0:
		bt := r.BlockTokens
		if bt == 0 {
			bt = DefaultMooncakeBlock
		}
		if bt < 0 || bt > MaxBlockTokens {
			return nil, fmt.Errorf("%w: block_tokens %d (want 1..%d)", ErrBadRequest, r.BlockTokens, MaxBlockTokens)
		}
		if len(r.BlockIDs) > MaxRequestTokens/bt {
			return nil, fmt.Errorf("%w: %d block_ids of %d tokens (max %d tokens)", ErrTooLong, len(r.BlockIDs), bt, MaxRequestTokens)
		}
		full := len(r.BlockIDs) * bt
		if r.InputLength < 0 || r.InputLength > full || (r.InputLength > 0 && r.InputLength <= full-bt) {
			return nil, fmt.Errorf("%w: input_length %d with %d block_ids of %d tokens (want %d..%d)",
				ErrBadRequest, r.InputLength, len(r.BlockIDs), bt, full-bt+1, full)
		}
		return ExpandBlockIDs(nil, r.BlockIDs, bt, r.InputLength), nil
	}
	return nil, ErrEmptyPrompt
}

// GenerateReply is every message a worker sends back. Chunk messages carry
// request_id, index and token_ids; the final message has done=true and either
// the outcome or error and code.
type GenerateReply struct {
	RequestID string   `json:"request_id"`
	Index     int      `json:"index,omitempty"`
	TokenIDs  []uint32 `json:"token_ids,omitempty"`

	Done         bool    `json:"done,omitempty"`
	Worker       string  `json:"worker,omitempty"`
	Rank         uint32  `json:"rank,omitempty"`
	FinishReason string  `json:"finish_reason,omitempty"`
	PromptTokens int     `json:"prompt_tokens,omitempty"`
	CachedTokens int     `json:"cached_tokens,omitempty"`
	OutputTokens int     `json:"output_tokens,omitempty"`
	Preemptions  int     `json:"preemptions,omitempty"`
	TTFTMs       float64 `json:"ttft_ms,omitempty"`
	ITLMs        float64 `json:"itl_ms,omitempty"`
	E2EMs        float64 `json:"e2e_ms,omitempty"`
	Error        string  `json:"error,omitempty"`
	Code         string  `json:"code,omitempty"`
	// RemoteBlocks answers a prefill leg (GenerateRequest.RemoteDecode):
	// the leading full prompt blocks the engine holds for the decode
	// engine. PulledBlocks and TransferMs answer a decode leg: the blocks
	// it transferred (those it did not hold) and the transfer's model
	// time, which is not part of TTFTMs (the engine's clock starts when the
	// request is submitted, after the transfer).
	RemoteBlocks int     `json:"remote_blocks,omitempty"`
	PulledBlocks int     `json:"pulled_blocks,omitempty"`
	TransferMs   float64 `json:"transfer_ms,omitempty"`
}

// Error codes of a final message.
const (
	CodeBadRequest = "bad_request"
	CodeTooLong    = "too_long"
	CodeDuplicate  = "duplicate"
	CodeCancelled  = "cancelled"
	CodeRestarted  = "restarted"
	CodeClosed     = "closed"
	CodeInternal   = "internal"
)

// ErrBadRequest is a malformed generate request.
var ErrBadRequest = errors.New("sim: bad generate request")

// RemoteError is a worker's error reply.
type RemoteError struct {
	Code    string
	Message string
}

func (e *RemoteError) Error() string { return "sim: worker error " + e.Code + ": " + e.Message }

func codeOf(err error) string {
	switch {
	case errors.Is(err, ErrTooLong):
		return CodeTooLong
	case errors.Is(err, ErrDuplicateRequest):
		return CodeDuplicate
	case errors.Is(err, ErrCancelled), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return CodeCancelled
	case errors.Is(err, ErrRestarted):
		return CodeRestarted
	case errors.Is(err, ErrClosed):
		return CodeClosed
	case errors.Is(err, ErrBadRequest), errors.Is(err, ErrEmptyPrompt), errors.Is(err, ErrBadMaxTokens), errors.Is(err, ErrBadRank):
		return CodeBadRequest
	}
	return CodeInternal
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// finalReply turns a result into the final message.
func finalReply(res Result) GenerateReply {
	out := GenerateReply{
		RequestID:    res.RequestID,
		Done:         true,
		Worker:       res.Worker,
		Rank:         res.Rank,
		FinishReason: res.FinishReason,
		PromptTokens: res.PromptTokens,
		CachedTokens: res.CachedTokens,
		OutputTokens: res.OutputTokens,
		Preemptions:  res.Preemptions,
		TTFTMs:       ms(res.TTFT),
		ITLMs:        ms(res.ITL),
		E2EMs:        ms(res.E2E),
	}
	if res.Err != nil {
		out.Error = res.Err.Error()
		out.Code = codeOf(res.Err)
	}
	return out
}

// ServerStats counts what a Server saw.
type ServerStats struct {
	Requests      uint64 // generate requests received
	BadRequests   uint64 // undecodable or invalid, or without a reply subject
	PublishErrors uint64
}

// Server serves one engine's endpoint on a NATS connection.
type Server struct {
	e      *Engine
	nc     *nats.Conn
	sub    *nats.Subscription
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex // guards stopped and wg.Add
	stopped bool
	wg      sync.WaitGroup

	requests, bad, pubErrs atomic.Uint64
}

// Serve subscribes to e.Endpoint() on nc and answers generate requests until
// Stop (or until ctx ends, which cancels the requests in flight).
func Serve(ctx context.Context, nc *nats.Conn, e *Engine) (*Server, error) {
	s := &Server{e: e, nc: nc}
	s.ctx, s.cancel = context.WithCancel(ctx)
	sub, err := nc.Subscribe(e.Endpoint(), s.onMsg)
	if err != nil {
		s.cancel()
		return nil, fmt.Errorf("sim: subscribe %s: %w", e.Endpoint(), err)
	}
	if err := nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		s.cancel()
		return nil, fmt.Errorf("sim: flush subscription %s: %w", e.Endpoint(), err)
	}
	s.sub = sub
	return s, nil
}

// Stop unsubscribes, cancels the requests in flight (their clients get a
// final "cancelled" message) and waits for the handlers to return.
func (s *Server) Stop() error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	s.mu.Unlock()
	err := s.sub.Unsubscribe()
	if errors.Is(err, nats.ErrConnectionClosed) {
		err = nil
	}
	s.cancel()
	s.wg.Wait()
	return err
}

// Stats returns the server's counters.
func (s *Server) Stats() ServerStats {
	return ServerStats{Requests: s.requests.Load(), BadRequests: s.bad.Load(), PublishErrors: s.pubErrs.Load()}
}

func (s *Server) onMsg(m *nats.Msg) {
	s.requests.Add(1)
	if m.Reply == "" {
		s.bad.Add(1) // nowhere to answer
		return
	}
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		s.handle(m)
	}()
}

func (s *Server) publish(subject string, r *GenerateReply) {
	data, err := json.Marshal(r)
	if err == nil {
		err = s.nc.Publish(subject, data)
	}
	if err != nil {
		s.pubErrs.Add(1)
	}
}

func (s *Server) fail(subject, id string, err error) {
	s.publish(subject, &GenerateReply{RequestID: id, Done: true, FinishReason: FinishError, Error: err.Error(), Code: codeOf(err)})
}

func (s *Server) handle(m *nats.Msg) {
	var req GenerateRequest
	if err := json.Unmarshal(m.Data, &req); err != nil {
		s.bad.Add(1)
		s.fail(m.Reply, "", fmt.Errorf("%w: %v", ErrBadRequest, err))
		return
	}
	tokens, err := req.Tokens()
	if err != nil {
		s.bad.Add(1)
		s.fail(m.Reply, req.RequestID, err)
		return
	}
	sreq := Request{ID: req.RequestID, Tokens: tokens, MaxTokens: req.MaxTokens, LoRA: req.LoRAName, Rank: req.Rank}
	var pulled Pulled
	if req.RemoteBlocks > 0 && !req.RemoteDecode {
		if pulled, err = s.e.Pull(s.ctx, &sreq, min(req.RemoteBlocks, len(tokens)/s.e.cfg.BlockSize)); err != nil {
			s.fail(m.Reply, req.RequestID, err)
			return
		}
	}
	st, err := s.e.Submit(s.ctx, sreq)
	if err != nil {
		if !errors.Is(err, ErrClosed) && !errors.Is(err, ErrDuplicateRequest) {
			s.bad.Add(1)
		}
		s.fail(m.Reply, req.RequestID, err)
		return
	}
	var buf []uint32
	for {
		ch, err := st.RecvInto(s.ctx, buf)
		if err == io.EOF {
			break
		}
		if err != nil {
			s.fail(m.Reply, st.ID(), ErrCancelled)
			return
		}
		s.publish(m.Reply, &GenerateReply{RequestID: st.ID(), Index: ch.Index, TokenIDs: ch.Tokens})
		buf = ch.Tokens
	}
	res, _ := st.Result()
	fin := finalReply(res)
	fin.PulledBlocks, fin.TransferMs = pulled.Blocks, ms(pulled.Time)
	if req.RemoteDecode && res.Err == nil {
		held, _ := s.e.HeldPrefix(sreq) // the rank was checked by Submit
		fin.RemoteBlocks = len(held)
	}
	s.publish(m.Reply, &fin)
}

// Generate sends req to a worker's endpoint subject and collects the streamed
// reply: onChunk (may be nil) sees each chunk as it arrives, and the final
// message is returned. A worker error comes back as a *RemoteError (with the
// final message); no worker on the subject as nats.ErrNoResponders.
func Generate(ctx context.Context, nc *nats.Conn, subject string, req *GenerateRequest, onChunk func(*GenerateReply)) (*GenerateReply, error) {
	data, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("sim: encode request %q: %w", req.RequestID, err)
	}
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("sim: subscribe inbox: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, data); err != nil {
		return nil, fmt.Errorf("sim: publish to %s: %w", subject, err)
	}
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("sim: waiting for %q on %s: %w", req.RequestID, subject, err)
		}
		if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
			return nil, fmt.Errorf("sim: %s: %w", subject, nats.ErrNoResponders)
		}
		var r GenerateReply
		if err := json.Unmarshal(m.Data, &r); err != nil {
			return nil, fmt.Errorf("sim: decode reply from %s: %w", subject, err)
		}
		if !r.Done {
			if onChunk != nil {
				onChunk(&r)
			}
			continue
		}
		if r.Error != "" {
			return &r, &RemoteError{Code: r.Code, Message: r.Error}
		}
		return &r, nil
	}
}

// GenerateSubject is a worker's endpoint: <prefix>.worker.<model>.<worker>.generate,
// with model and worker escaped as kvevents escapes subject tokens.
func GenerateSubject(prefix, model, worker string) string {
	return prefix + ".worker." + escape.SubjectToken.Escape(model) + "." + escape.SubjectToken.Escape(worker) + ".generate"
}
