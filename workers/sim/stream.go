package sim

import (
	"context"
	"github.com/kvrouter/kvrouter/kvevents"
	"io"
	"sync"
	"time"
)

// Finish reasons of a Result.
const (
	FinishLength    = "length"    // max_tokens generated
	FinishCancelled = "cancelled" // the submitter's context ended
	FinishError     = "error"     // restart, close or another error (see Result.Err)
)

// Request is one generation request for the Go API.
type Request struct {
	ID        string   // unique among the engine's in-flight requests; "" = assigned
	Tokens    []uint32 // prompt tokens (copied)
	MaxTokens int      // tokens to generate, >= 1
	LoRA      string   // adapter name; changes the KV hash seed
	// Media are the prompt's multimodal items (sorted, disjoint, each
	// with an identifier): they enter the hashes of the blocks they
	// overlap (media.go). Not copied: do not modify them.
	Media []kvevents.MediaItem
	Rank  uint32 // data-parallel rank to run on

	// CacheSalt is vLLM's cache_salt: it enters the KV hash seed
	// (kvevents.SeedFor with LoRA), so the same prompt under another salt
	// shares no block, and vLLM emitters publish it in the first block's
	// extra_keys. "" = none.
	CacheSalt string
	// LoRAID is the adapter's integer id (vLLM's lora_int_id), published as
	// a vLLM event's lora_id; it is not hashed (vLLM hashes the name).
	LoRAID int

	// Vocab, when set, is the vocabulary generated tokens are drawn from:
	// output token i is Vocab[mixToken(outputSeed(ID), i) % len(Vocab)]
	// instead of a 31-bit id. A face with its own tokenizer (the HTTP face's
	// byte-level one) sets it so that the text it returns tokenizes back to
	// exactly the tokens the engine cached. It is not copied: do not modify it.
	Vocab []uint32

	// Arrival backdates the request's arrival (zero = the rank's clock now),
	// for discrete-event replays with AdvanceTo: an engine that was busy
	// past the trace time still charges the queueing from the trace time.
	// It must not be after the rank's clock (ErrFutureArrival).
	Arrival time.Time

	// Transferred is how many leading full prompt blocks arrived from a
	// prefill engine (a KV transfer, transfer.go): at its first admission
	// the request starts after them, as if they were cached, and they
	// become cached here. 0 = none.
	Transferred int
}

// Chunk is a run of generated tokens, in order.
type Chunk struct {
	Index  int      // position of Tokens[0] in the output
	Tokens []uint32 // owned by the receiver
}

// Result is how a request ended. Times are model time: clock time multiplied
// by the speed-up, so they do not depend on how fast the simulation runs.
type Result struct {
	RequestID    string
	Worker       string
	Rank         uint32
	PromptTokens int
	CachedTokens int // prompt tokens found in the prefix cache at admission (whole blocks)
	OutputTokens int
	Preemptions  int
	TTFT         time.Duration // arrival to first token
	ITL          time.Duration // mean gap between tokens after the first
	E2E          time.Duration // arrival to end
	FinishReason string        // FinishLength, FinishCancelled or FinishError
	Err          error         // nil when FinishReason is FinishLength
}

// Stream carries one request's tokens from the step loop to its consumer.
// The engine never blocks on it: tokens produced while nobody reads pile up
// and the next Recv returns them together.
type Stream struct {
	id     string
	notify chan struct{} // cap 1

	mu      sync.Mutex
	pending []uint32
	next    int // output index of pending[0]
	done    bool
	res     Result
}

func newStream(id string) *Stream {
	return &Stream{id: id, notify: make(chan struct{}, 1)}
}

// ID is the request id (assigned when the request had none).
func (s *Stream) ID() string { return s.id }

func (s *Stream) push(tok uint32, index int) {
	s.mu.Lock()
	if len(s.pending) == 0 {
		s.next = index
	}
	s.pending = append(s.pending, tok)
	s.mu.Unlock()
	s.poke()
}

func (s *Stream) finish(res Result) {
	s.mu.Lock()
	s.done = true
	s.res = res
	s.mu.Unlock()
	s.poke()
}

func (s *Stream) poke() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Recv returns the next tokens, waiting for them. After the last token it
// returns io.EOF; the outcome is then in Result. It returns ctx.Err() when
// ctx ends first (the request goes on; cancel it with the Submit context).
func (s *Stream) Recv(ctx context.Context) (Chunk, error) { return s.RecvInto(ctx, nil) }

// RecvInto is Recv with the tokens appended to dst[:0], so a consumer that
// reuses its buffer receives without allocating.
func (s *Stream) RecvInto(ctx context.Context, dst []uint32) (Chunk, error) {
	for {
		s.mu.Lock()
		if len(s.pending) > 0 {
			ch := Chunk{Index: s.next, Tokens: append(dst[:0], s.pending...)}
			s.pending = s.pending[:0]
			s.mu.Unlock()
			return ch, nil
		}
		done := s.done
		s.mu.Unlock()
		if done {
			return Chunk{}, io.EOF
		}
		select {
		case <-s.notify:
		case <-ctx.Done():
			return Chunk{}, ctx.Err()
		}
	}
}

// Result returns the outcome once the request has ended.
func (s *Stream) Result() (Result, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.res, s.done
}

// Wait drops the remaining tokens, waits for the end and returns the result;
// the error is the result's Err, or ctx.Err().
func (s *Stream) Wait(ctx context.Context) (Result, error) {
	for {
		if _, err := s.Recv(ctx); err != nil {
			if err != io.EOF {
				return Result{}, err
			}
			res, _ := s.Result()
			return res, res.Err
		}
	}
}
