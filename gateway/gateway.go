package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/trace"
)

// Defaults of Config.
const (
	DefaultSessionHeader = "X-Session-Id"
	ModeHeader           = "X-Session-Mode"
	DefaultWorkersTTL    = time.Second
	DefaultCallTimeout   = 5 * time.Second
	DefaultWriteTimeout  = 30 * time.Second
)

// Settings of the gateway's HTTP server (`kvrouter gateway`, serve
// --openai-addr). ReadTimeout bounds reading a request, body included; it
// is lifted once the body is read, so it never cuts a reply. Writes are
// bounded per write by Config.WriteTimeout.
const (
	ServerReadHeaderTimeout = 10 * time.Second
	ServerReadTimeout       = 60 * time.Second
	ServerIdleTimeout       = 2 * time.Minute
	ServerMaxHeaderBytes    = 64 << 10
)

// Response headers telling the client what routing did.
const (
	HeaderWorker         = "X-Kvr-Worker"          // w#r
	HeaderOverlapBlocks  = "X-Kvr-Overlap-Blocks"  // leading prompt blocks the worker held
	HeaderSessionOutcome = "X-Kvr-Session-Outcome" // the binding outcome; "none" without a session
	// HeaderPrefillWorker (w#r) names the prefill leg's worker of a split
	// request (Config.PD); HeaderWorker is then the decode worker. Absent
	// when one worker served.
	HeaderPrefillWorker = "X-Kvr-Prefill-Worker"
	// HeaderServerTiming (the W3C Server-Timing header) gives the
	// request's routing time in milliseconds: "route;dur=0.412,
	// queue;dur=0.000" (ServerTiming, ParseServerTiming).
	HeaderServerTiming = "Server-Timing"
)

// RankHeader sends a request to one data-parallel rank, as vLLM reads it
// (the endpoint picker sets it too).
const RankHeader = "X-Data-Parallel-Rank"

// ErrConfig is returned by New for an unusable Config.
var ErrConfig = errors.New("gateway: bad config")

// Config configures a Gateway. Router and Models are required.
type Config struct {
	// Router routes and books (ClientRouter over NATS, ReplicaRouter in
	// process).
	Router Router
	// Models are the models the gateway serves; another model is 404.
	Models []string
	// SessionHeader carries the session id (default X-Session-Id). The
	// mode comes from X-Session-Mode: hard|soft ("" = the router's
	// default).
	SessionHeader string
	// ID prefixes the request ids the gateway gives the router
	// ("<ID>-<24 random hex digits>"); default "gw-" and ten characters of
	// a NUID.
	ID string
	// WorkersTTL is how long a model's worker list (for /v1/models and the
	// tokenize target) is reused before it is read again (default 1 s).
	WorkersTTL time.Duration
	// MaxBodyBytes bounds a client's request body (larger: 413); default
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// CallTimeout bounds each tokenize and lifecycle call (default 5 s).
	CallTimeout time.Duration
	// Tokenizer is how the prompt becomes what the router hashes:
	// TokenizerEngine (the default, "" too) asks the engine (render.go);
	// TokenizerApprox cuts the text into pseudo-blocks for a replica in
	// approximate mode, with no /tokenize call (approx.go).
	Tokenizer string
	// APIKey, when set, is the key every client must send, OpenAI style
	// ("Authorization: Bearer <key>", what the OpenAI SDKs send; compared
	// in constant time); a missing or wrong key is 401 invalid_api_key.
	// The client's Authorization header is then not passed to the engines
	// (it holds the gateway's key).
	APIKey string
	// WriteTimeout bounds each write to the client (default 30 s): a whole
	// reply, or one streamed event, the deadline moving on with each, so a
	// client that stops reading is dropped and a long stream is not.
	WriteTimeout time.Duration
	// HTTPClient talks to the engines; default a client whose transport
	// keeps up to 1,024 idle connections per engine.
	HTTPClient *http.Client
	// PD asks the router for a prefill/decode pair for every request and
	// runs a split request's two legs (pd.go, docs/pd.md): PDVLLM
	// (NixlConnector's kv_transfer_params) or PDSGLang (bootstrap rooms);
	// "" = off, every request goes to one worker.
	PD        string
	Logger    *slog.Logger
	Telemetry Telemetry
}

// Gateway is the OpenAI-compatible HTTP front of the router. It is an
// http.Handler; it holds no state beyond caches and may run anywhere, as
// many times as wanted.
type Gateway struct {
	cfg    Config
	router Router
	http   *http.Client
	log    *slog.Logger
	tracer trace.Tracer
	tel    Telemetry
	m      *metrics
	mux    *http.ServeMux
	models map[string]*workerCache
	apiKey [sha256.Size]byte // SHA-256 of "Bearer <APIKey>", when set

	renders renderProbes // which engines have the render endpoints (render.go)
}

// New builds a gateway from cfg.
func New(cfg Config) (*Gateway, error) {
	if cfg.Router == nil {
		return nil, fmt.Errorf("%w: Router is required", ErrConfig)
	}
	if len(cfg.Models) == 0 {
		return nil, fmt.Errorf("%w: at least one model is required", ErrConfig)
	}
	if cfg.SessionHeader == "" {
		cfg.SessionHeader = DefaultSessionHeader
	}
	if err := CheckPD(cfg.PD); err != nil {
		return nil, err
	}
	if cfg.ID == "" {
		cfg.ID = "gw-" + strings.ToLower(nuid.Next()[12:])
	}
	if cfg.WorkersTTL <= 0 {
		cfg.WorkersTTL = DefaultWorkersTTL
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.Tokenizer == "" {
		cfg.Tokenizer = TokenizerEngine
	}
	if err := CheckTokenizer(cfg.Tokenizer); err != nil {
		return nil, err
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Transport: newTransport()}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Telemetry = cfg.Telemetry.WithDefaults()
	g := &Gateway{
		cfg: cfg, router: cfg.Router, http: cfg.HTTPClient, log: cfg.Logger, tel: cfg.Telemetry,
		tracer: cfg.Telemetry.TracerProvider.Tracer(instrumentationName),
		mux:    http.NewServeMux(), models: map[string]*workerCache{},
	}
	for _, m := range cfg.Models {
		if m == "" {
			return nil, fmt.Errorf("%w: empty model name", ErrConfig)
		}
		g.models[m] = &workerCache{}
	}
	var err error
	if g.m, err = newMetrics(cfg.Telemetry.MeterProvider.Meter(instrumentationName)); err != nil {
		return nil, fmt.Errorf("gateway: metrics: %w", err)
	}
	g.mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { g.generate(w, r, kindChat) })
	g.mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { g.generate(w, r, kindCompletion) })
	g.mux.HandleFunc("GET /v1/models", g.listModels)
	g.mux.HandleFunc("/", g.notFound)
	if cfg.APIKey != "" {
		g.apiKey = sha256.Sum256([]byte("Bearer " + cfg.APIKey))
	}
	return g, nil
}

func newTransport() *http.Transport {
	return &http.Transport{
		Proxy:               nil, // engines are reached directly
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   false, // engines speak HTTP/1.1
		// The gateway relays the engine's bytes: asking for gzip would
		// have the transport inflate them on the way.
		DisableCompression: true,
	}
}

// ServeHTTP serves the gateway's API, to clients with the API key when
// one is set.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !g.Authorized(r) {
		g.unauthorized(w, r)
		return
	}
	g.mux.ServeHTTP(w, r)
}

// Authorized reports whether r carries the API key (always, when none is
// set). The SHA-256 sums are compared in constant time, so neither the key
// nor its length leaks through timing. The command uses it for /metrics.
func (g *Gateway) Authorized(r *http.Request) bool {
	if g.cfg.APIKey == "" {
		return true
	}
	got := sha256.Sum256([]byte(r.Header.Get("Authorization")))
	return subtle.ConstantTimeCompare(got[:], g.apiKey[:]) == 1
}

// Guard is h behind the API key (h itself when none is set), answering
// 401 invalid_api_key in OpenAI's shape: the command puts /metrics behind
// it.
func (g *Gateway) Guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.Authorized(r) {
			g.unauthorized(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (g *Gateway) unauthorized(w http.ResponseWriter, r *http.Request) {
	g.setWriteDeadline(w)
	w.Header().Set("WWW-Authenticate", `Bearer realm="kvrouter-gateway"`)
	g.writeError(r.Context(), w, serverError(http.StatusUnauthorized, "invalid_api_key",
		"Incorrect or missing API key: send \"Authorization: Bearer <key>\" with the gateway's key (gateway --api-key)"))
}

// setWriteDeadline gives the next write to the client WriteTimeout.
func (g *Gateway) setWriteDeadline(w http.ResponseWriter) {
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(g.cfg.WriteTimeout))
}

// notFound answers every other path in OpenAI's error shape: the gateway
// forwards only the generate endpoints (documented in docs/gateway.md).
func (g *Gateway) notFound(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/chat/completions" || r.URL.Path == "/v1/completions" || r.URL.Path == "/v1/models" {
		e := serverError(http.StatusMethodNotAllowed, "method_not_allowed", "%s %s is not served (method not allowed)", r.Method, r.URL.Path)
		g.writeError(r.Context(), w, e)
		return
	}
	g.writeError(r.Context(), w, notFound("unknown_url", "%s %s is not served by the kvrouter gateway (it serves POST /v1/chat/completions, POST /v1/completions and GET /v1/models)", r.Method, r.URL.Path))
}

// modelCard is one entry of GET /v1/models.
type modelCard struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	Parent  string `json:"parent,omitempty"` // a LoRA adapter's base model (adapters.go)
}

// listModels is GET /v1/models: the configured models that have at least
// one ready worker, then the LoRA adapters such workers serve.
func (g *Gateway) listModels(w http.ResponseWriter, r *http.Request) {
	out := struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{Object: "list", Data: []modelCard{}}
	for _, m := range g.cfg.Models {
		if ws := g.liveWorkers(r.Context(), m); len(ws) > 0 {
			out.Data = append(out.Data, modelCard{ID: m, Object: "model", OwnedBy: "kvrouter"})
		}
	}
	out.Data = append(out.Data, g.adapterCards(r.Context())...)
	writeJSON(w, http.StatusOK, out)
	g.m.answered(r.Context(), http.StatusOK)
}

// engine is one live worker of a model as the gateway uses it.
type engine struct {
	worker   string
	root     string   // the engine's server root (engineRoot of its endpoint)
	adapters []string // the LoRA adapters it serves (adapters.go)
}

// workerCache is one model's live workers, read from the router at most
// once per WorkersTTL.
type workerCache struct {
	mu        sync.Mutex
	at        time.Time
	engines   []engine
	blockSize int           // of the first ready worker that reports one (0: none yet)
	next      atomic.Uint64 // round robin of the tokenize target
	adapters  []string      // served by the model's workers in any state (adapters.go)
}

// liveWorkers returns the model's ready workers (one entry per worker,
// whatever its ranks), from the cache when it is fresh.
func (g *Gateway) liveWorkers(ctx context.Context, model string) []engine {
	c := g.models[model]
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) < g.cfg.WorkersTTL {
		return c.engines
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	defer cancel()
	resp, err := g.router.Workers(ctx, model)
	if err != nil {
		// Keep the last list and ask again after WorkersTTL: requests
		// must not queue up behind one failing call each.
		g.log.Debug("workers", "model", model, "err", err)
		c.at = time.Now()
		return c.engines
	}
	var es []engine
	bs := 0
	c.adapters = c.adapters[:0]
	for _, ws := range resp.Workers {
		c.adapters = append(c.adapters, ws.Adapters...)
		if bs == 0 && ws.State == "ready" {
			bs = ws.BlockSize
		}
		if ws.State != "ready" || ws.Endpoint == "" || slices.ContainsFunc(es, func(e engine) bool { return e.worker == ws.Worker }) {
			continue
		}
		es = append(es, engine{worker: ws.Worker, root: engineRoot(ws.Endpoint), adapters: ws.Adapters})
	}
	c.engines, c.blockSize, c.at = es, bs, time.Now()
	return es
}

// blockSize is the model's KV block size as its ready workers report it
// (the replica drops workers whose block size differs from the model's),
// 0 when no ready worker is known.
func (g *Gateway) blockSize(ctx context.Context, model string) int {
	_, c := g.modelEngines(ctx, model) // refreshes the cache when it is stale
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.blockSize
}

// tokenizeTarget picks the engine that tokenizes a request: round robin
// over the live workers (of an adapter: those serving it).
func (g *Gateway) tokenizeTarget(ctx context.Context, model string) (engine, bool) {
	es, c := g.modelEngines(ctx, model)
	if len(es) == 0 {
		return engine{}, false
	}
	n := c.next.Add(1)
	return es[int(n%uint64(len(es)))], true
}

// others lists the live workers other than the failed one (the allowed set
// of a retry).
func (g *Gateway) others(ctx context.Context, model, failed string) []string {
	var out []string
	for _, e := range g.liveWorkers(ctx, model) {
		if e.worker != failed {
			out = append(out, e.worker)
		}
	}
	return out
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		status, data = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding the reply failed","type":"server_error","param":null,"code":"internal"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}

// readAll is io.ReadAll into a buffer of size bytes (the body's
// Content-Length; -1 when unknown), so that a body of known length is
// read without the copies of a growing buffer. Only the first MiB is
// allocated before it arrives: a length is only announced.
func readAll(r io.Reader, size int64) ([]byte, error) {
	if size <= 0 {
		return io.ReadAll(r)
	}
	b := make([]byte, 0, min(size, 1<<20)+1) // +1: the read that finds EOF needs room
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return b, err
		}
		if len(b) == cap(b) { // longer than announced: let append grow it
			b = append(b, 0)[:len(b)]
		}
	}
}

// readBody reads a client body of at most limit bytes. Once it is read
// the connection's read deadline (the server's ReadTimeout, which bounds
// reading a request) is lifted: it would otherwise cancel a long reply.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *RequestError) {
	if r.ContentLength > limit {
		e := badRequest("", "the request body is %d bytes, larger than %d", r.ContentLength, limit)
		e.Status, e.Code = http.StatusRequestEntityTooLarge, "request_too_large"
		return nil, e
	}
	body, err := readAll(http.MaxBytesReader(w, r.Body, limit), r.ContentLength)
	if err == nil {
		_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			e := badRequest("", "the request body is larger than %d bytes", limit)
			e.Status, e.Code = http.StatusRequestEntityTooLarge, "request_too_large"
			return nil, e
		}
		return nil, badRequest("", "reading the request body: %v", err)
	}
	return body, nil
}
