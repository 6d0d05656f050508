package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/internal/natsconn"
	"github.com/kvrouter/kvrouter/internal/telemetry"
	"github.com/kvrouter/kvrouter/router/api"
)

const gatewayAbout = `Run the OpenAI-compatible gateway: point any OpenAI client at
http://<listen>/v1 and kvrouter does the rest. For each POST
/v1/chat/completions or /v1/completions (streamed or not) it asks a live engine
of the model for the prompt's token ids (its render endpoint, else /tokenize;
--tokenizer approx makes no
such call and routes on pseudo-blocks of the text instead, for --approximate
replicas), routes them through the
router replicas over NATS (the route API), forwards the body unchanged to the
chosen engine, streams the reply back and books prefill_done and free. GET
/v1/models lists the models with live workers; other paths are 404 in OpenAI's
error shape. GET /metrics is Prometheus. The session id comes from
--session-header, the mode from X-Session-Mode: hard|soft. The gateway is
stateless: run as many as you like. docs/gateway.md has the details.
SIGINT/SIGTERM stop it gracefully (requests in flight finish, at most
--shutdown-timeout).`

func runGateway(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newFlags("kvrouter gateway", gatewayAbout)
	c.SetOutput(stderr)
	c.helpOut = stdout
	nf := addNATSFlags(c, false)
	lf := addLogFlags(c)
	var (
		listen   = c.str("listen", "127.0.0.1:8000", "HTTP address of the OpenAI API (and /metrics)")
		prefix   = c.str("prefix", api.DefaultPrefix, "first token of the router's NATS subjects")
		models   = c.str("models", "default", "models the gateway serves, comma separated (another model is 404)")
		gf       = addGatewayFlags(c)
		shutdown = c.duration("shutdown-timeout", 30*time.Second, "longest wait for requests in flight when stopping")
		tf       = addTraceFlags(c, "requests")
	)
	kf := addGatewayKeyFlags(c)
	if err := c.parse(args); err != nil {
		if helpRequested(err) {
			return err
		}
		return usageError{err}
	}
	log, prom, err := gf.setup(lf, stderr)
	if err != nil {
		return err
	}
	defer prom.Shutdown(context.Background())
	tracing, err := tf.start(ctx, "kvrouter-gateway", log)
	if err != nil {
		return err
	}
	defer tracing.Shutdown(context.Background())
	tel := gateway.Telemetry{MeterProvider: prom.Provider, TracerProvider: tracing.TracerProvider()}
	nc, err := natsconn.Open(ctx, nf.config("kvrouter-gateway"), log)
	if err != nil {
		return err
	}
	defer nc.Close()
	client := api.NewClient(nc.Conn, *prefix, tel.Propagator)
	// The server's max_payload (from its INFO) bounds one route request:
	// say what that allows, once, where operators look.
	log.Info("route requests are at most the NATS server's max_payload less headers; longer prompts go as block hashes",
		"max_route_bytes", client.MaxRouteBody(), "max_prompt_tokens_at_block_16", api.MaxPromptTokens(client.MaxRouteBody(), 16))
	cfg := gf.config(gateway.ClientRouter{C: client}, splitList(*models), tel, log)
	if cfg.APIKey, err = secret("api-key", *kf.key, "api-key-file", *kf.keyFile); err != nil {
		return usageError{err}
	}
	cfg.WriteTimeout = *kf.writeTimeout
	g, err := gateway.New(cfg)
	if err != nil {
		return usageError{err}
	}
	metrics := prom.Handler
	if !*kf.metricsOpen {
		metrics = g.Guard(metrics)
	}
	srv, err := startGatewayServer(g, *listen, metrics, log)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "kvrouter gateway ready: OpenAI API on http://%s/v1, models %v, NATS %s\n", srv.addr, cfg.Models, nc.Where())
	<-ctx.Done()
	log.Info("signal received: stopping the gateway")
	return srv.stop(*shutdown)
}

// gatewayFlags are the gateway's own settings (`serve --openai-addr` runs
// the gateway with their defaults).
type gatewayFlags struct {
	sessionHeader           *string
	workersTTL, callTimeout *time.Duration
	maxBody                 *int
	tokenizer               *string
	pd                      *string
}

func addGatewayFlags(c *cmdFlags) *gatewayFlags {
	return &gatewayFlags{
		sessionHeader: c.str("session-header", gateway.DefaultSessionHeader, "request header carrying the session id (the mode is X-Session-Mode: hard|soft)"),
		workersTTL:    c.duration("workers-ttl", gateway.DefaultWorkersTTL, "how long a model's worker list (for /v1/models and the tokenize target) is reused"),
		callTimeout:   c.duration("call-timeout", gateway.DefaultCallTimeout, "longest tokenize or lifecycle call"),
		maxBody:       c.integer("max-body-bytes", gateway.DefaultMaxBodyBytes, "largest client request body (larger: 413)"),
		tokenizer:     addTokenizerFlag(c, "tokenizer"),
		pd:            c.str("pd", "", "prefill/decode disaggregation: vllm (NixlConnector's kv_transfer_params, two legs in turn) or sglang (bootstrap rooms, both legs at once); every request then asks the router for a pair (\"\" = off; docs/pd.md)"),
	}
}

// setup checks the flags and sets up the logger and the Prometheus
// exporter behind /metrics (`kvrouter gateway`, `kvrouter epp`); the caller
// shuts prom down.
func (f *gatewayFlags) setup(lf *logFlags, stderr io.Writer) (*slog.Logger, *telemetry.Prometheus, error) {
	if err := gateway.CheckTokenizer(*f.tokenizer); err != nil {
		return nil, nil, usageError{fmt.Errorf("--tokenizer: %w", err)}
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return nil, nil, usageError{err}
	}
	prom, err := telemetry.NewPrometheus(true)
	return log, prom, err
}

func (f *gatewayFlags) config(r gateway.Router, models []string, tel gateway.Telemetry, log *slog.Logger) gateway.Config {
	return gateway.Config{Router: r, Models: models, SessionHeader: *f.sessionHeader, WorkersTTL: *f.workersTTL,
		CallTimeout: *f.callTimeout, MaxBodyBytes: int64(*f.maxBody), Tokenizer: *f.tokenizer, PD: *f.pd, Telemetry: tel, Logger: log}
}

// gatewayKeyFlags are `kvrouter gateway`'s API key and write bound.
type gatewayKeyFlags struct {
	key, keyFile *string
	metricsOpen  *bool
	writeTimeout *time.Duration
}

func addGatewayKeyFlags(c *cmdFlags) *gatewayKeyFlags {
	return &gatewayKeyFlags{
		key:          c.str("api-key", "", "API key clients must send, OpenAI style (\"Authorization: Bearer <key>\", what the OpenAI SDKs send); \"\" = none"),
		keyFile:      c.str("api-key-file", "", "file holding --api-key (kept out of the process list)"),
		metricsOpen:  c.boolean("metrics-open", false, "serve /metrics without the API key"),
		writeTimeout: c.duration("write-timeout", gateway.DefaultWriteTimeout, "longest write of a reply, or of one streamed event, to a client (a client that stops reading is dropped)"),
	}
}

// addTokenizerFlag is the gateway's tokenizer choice (gateway's
// --tokenizer, serve's --openai-tokenizer).
func addTokenizerFlag(c *cmdFlags, name string) *string {
	return c.str(name, gateway.TokenizerEngine, "how the gateway reads prompts: engine (exact token ids from the engine's render endpoint, else /tokenize) or approx (no /tokenize call: text cut into pseudo-blocks, for replicas in --approximate mode; docs/gateway.md)")
}

// gatewayServer is a gateway listening on HTTP.
type gatewayServer struct {
	http *http.Server
	addr string
	done chan error
}

// startGatewayServer serves g on addr, with /metrics beside it when
// metrics is not nil.
func startGatewayServer(g *gateway.Gateway, addr string, metrics http.Handler, log *slog.Logger) (*gatewayServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("gateway listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	if metrics != nil {
		mux.Handle("GET /metrics", metrics)
	}
	mux.Handle("/", g)
	// No WriteTimeout: it would cut long streams; the gateway moves a
	// write deadline along each reply instead (gateway.Config.WriteTimeout).
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: gateway.ServerReadHeaderTimeout, ReadTimeout: gateway.ServerReadTimeout,
		IdleTimeout: gateway.ServerIdleTimeout, MaxHeaderBytes: gateway.ServerMaxHeaderBytes}
	s := &gatewayServer{http: hs, addr: ln.Addr().String(), done: make(chan error, 1)}
	go func() { s.done <- s.http.Serve(ln) }()
	log.Info("gateway listening", "addr", s.addr)
	return s, nil
}

// where is the listen address ("" when there is no server).
func (s *gatewayServer) where() string {
	if s == nil {
		return ""
	}
	return s.addr
}

// stop finishes the requests in flight (at most timeout), then closes.
func (s *gatewayServer) stop(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := s.http.Shutdown(ctx)
	if err != nil {
		s.http.Close()
	}
	if serr := <-s.done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
