package vllmapi

import (
	"errors"
	"fmt"
	"go.opentelemetry.io/otel/trace"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/workers/sim"
)

// DefaultMaxModelLen is the context length when Config.MaxModelLen is 0
// (vLLM reads it from the model's config; the simulator has none).
const DefaultMaxModelLen = 8192

// MaxBodyBytes bounds a request body.
const MaxBodyBytes = 64 << 20

// RankHeader chooses the data-parallel rank of a request, as in vLLM. Without
// it the server picks the rank with the fewest requests in flight.
const RankHeader = "X-Data-Parallel-Rank"

// Config configures a Server.
type Config struct {
	Engine      *sim.Engine  // required; the server does not close it
	Model       string       // served model name; "" = the engine's model
	MaxModelLen int          // longest prompt plus output in tokens; 0 = DefaultMaxModelLen
	ImageTokens int          // placeholder tokens per image (media.go); 0 = DefaultImageTokens
	Logger      *slog.Logger // nil = slog.Default()

	// EnableLoRA serves LoRA adapters (vLLM's --enable-lora): Adapters
	// under their names (--lora-modules), and with RuntimeLoRA the load and
	// unload endpoints (VLLM_ALLOW_RUNTIME_LORA_UPDATING). See lora.go.
	EnableLoRA  bool
	Adapters    []Adapter
	RuntimeLoRA bool
	// BOS gives the tokenizer a BOS token (BOSToken), added in front of
	// a prompt whose request has add_special_tokens (completions' and
	// /tokenize prompts' default): a model like Llama. Without it the
	// tokenizer has no special tokens (a model like Qwen).
	BOS bool
	// DisableRender leaves out POST /v1/chat/completions/render and
	// /v1/completions/render (404), as a vLLM from before them.
	DisableRender bool
	// KVTransfer is the engine's --kv-transfer-config and transfer model
	// (pd.go); nil = no KV connector. Disaggregation is SGLang's
	// --disaggregation-mode (prefill or decode; "" = off; bootstrap.go).
	KVTransfer     *KVTransferConfig
	Disaggregation string
	// TracerProvider receives one llm_request span per generate request,
	// continuing the caller's traceparent, as vLLM started with
	// --otlp-traces-endpoint does (trace.go). nil: no spans.
	TracerProvider trace.TracerProvider
}

// Server is the vLLM-compatible HTTP face of one simulated engine. It is an
// http.Handler; serve it with any http.Server.
type Server struct {
	cfg      Config
	eng      *sim.Engine
	log      *slog.Logger
	mux      *http.ServeMux
	metrics  *metrics
	nextID   atomic.Uint64
	inflight []atomic.Int64    // requests in flight per rank
	started  int64             // unix seconds, the models' "created"
	lora     *loras            // the adapters served (lora.go)
	transfer *KVTransferConfig // Config.KVTransfer with defaults (pd.go)
	rooms    rooms             // SGLang bootstrap rooms (bootstrap.go)
}

// New builds a server over cfg.Engine.
func New(cfg Config) (*Server, error) {
	if cfg.Engine == nil {
		return nil, errors.New("vllmapi: Config.Engine is required")
	}
	ec := cfg.Engine.Config()
	if cfg.Model == "" {
		cfg.Model = ec.Model
	}
	if cfg.MaxModelLen == 0 {
		cfg.MaxModelLen = DefaultMaxModelLen
	}
	if cfg.ImageTokens == 0 {
		cfg.ImageTokens = DefaultImageTokens
	}
	if cfg.ImageTokens < 1 {
		return nil, fmt.Errorf("vllmapi: image tokens %d (want >= 1)", cfg.ImageTokens)
	}
	if cfg.MaxModelLen < 1 {
		return nil, fmt.Errorf("vllmapi: max model len %d (want >= 1)", cfg.MaxModelLen)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := checkDisaggConfig(&cfg); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:      cfg,
		eng:      cfg.Engine,
		log:      cfg.Logger,
		mux:      http.NewServeMux(),
		inflight: make([]atomic.Int64, ec.Ranks),
		started:  time.Now().Unix(),
	}
	var err error
	if s.metrics, err = newMetrics(s); err != nil {
		return nil, err
	}
	if err := s.setUpLoRA(); err != nil {
		return nil, err
	}
	s.mux.HandleFunc("POST /v1/completions", s.completions)
	s.mux.HandleFunc("POST /v1/chat/completions", s.chatCompletions)
	if !cfg.DisableRender {
		s.mux.HandleFunc("POST /v1/chat/completions/render", s.renderChat)
		s.mux.HandleFunc("POST /v1/completions/render", s.renderCompletion)
	}
	if cfg.KVTransfer != nil || cfg.Disaggregation != "" {
		tc := KVTransferConfig{}
		if cfg.KVTransfer != nil {
			tc = *cfg.KVTransfer
		}
		tc = tc.withDefaults()
		s.transfer = &tc
	}
	if cfg.Disaggregation == DisaggPrefill {
		s.mux.HandleFunc("GET /kvr/bootstrap/{room}", s.bootstrap)
	}
	s.mux.HandleFunc("POST /tokenize", s.tokenize)
	s.mux.HandleFunc("POST /detokenize", s.detokenize)
	s.mux.HandleFunc("GET /v1/models", s.models)
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	s.mux.Handle("GET /metrics", s.metrics.handler())
	return s, nil
}

// ServeHTTP serves the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// request is a decoded request body that names a model.
type request interface{ modelName() string }

// decode reads r's JSON body into v and checks its model; on failure it
// writes the error reply and returns false.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v request) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, badRequest("request body over %d bytes", tooBig.Limit))
			return false
		}
		writeError(w, badRequest("reading the request body: %v", err))
		return false
	}
	if err := decodeBody(body, v); err != nil {
		writeError(w, badRequest("%v", err))
		return false
	}
	if e := s.checkModel(v.modelName()); e != nil {
		writeError(w, e)
		return false
	}
	return true
}

// checkModel accepts the served model name, an adapter's, or none (vLLM
// then uses the base model).
func (s *Server) checkModel(model string) *Error {
	if _, adapter := s.lora.lookup(model); model != "" && model != s.cfg.Model && !adapter {
		return notFound("The model `%s` does not exist.", model)
	}
	return nil
}

func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if !s.decode(w, r, &req) {
		return
	}
	var toks []uint32
	switch {
	case req.Prompt != nil && req.Messages != nil:
		writeError(w, badRequest("give either prompt or messages, not both"))
		return
	case req.Prompt != nil:
		toks = promptIDs(*req.Prompt, s.cfg.BOS, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
	case req.Messages != nil:
		var err error
		if toks, err = req.render(nil, s.cfg.BOS); err != nil {
			writeError(w, badRequest("%v", err))
			return
		}
	default:
		writeError(w, badRequest("prompt or messages is required"))
		return
	}
	if req.Messages != nil {
		var e *Error
		if toks, _, e = s.chatMedia(toks, req.Messages); e != nil {
			writeError(w, e)
			return
		}
	}
	writeJSON(w, http.StatusOK, tokenizeReply{Count: len(toks), MaxModelLen: s.cfg.MaxModelLen, Tokens: toks})
}

func (s *Server) detokenize(w http.ResponseWriter, r *http.Request) {
	var req detokenizeRequest
	if !s.decode(w, r, &req) {
		return
	}
	text, err := detokenize(req.Tokens, s.cfg.BOS)
	if err != nil {
		writeError(w, badRequest("%v", err))
		return
	}
	writeJSON(w, http.StatusOK, detokenizeReply{Prompt: text})
}

// pickRank returns the rank named by RankHeader, or the least busy one.
func (s *Server) pickRank(r *http.Request) (uint32, *Error) {
	if h := r.Header.Get(RankHeader); h != "" {
		n, err := strconv.ParseUint(h, 10, 32)
		if err != nil || int(n) >= len(s.inflight) {
			return 0, badRequest("%s %q: want a rank in 0..%d", RankHeader, h, len(s.inflight)-1)
		}
		return uint32(n), nil
	}
	best := 0
	for i := 1; i < len(s.inflight); i++ {
		if s.inflight[i].Load() < s.inflight[best].Load() {
			best = i
		}
	}
	return uint32(best), nil
}
