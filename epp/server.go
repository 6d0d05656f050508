package epp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvrouter/kvrouter/gateway"
)

// Health service names, as llm-d-router's EPP answers them and Envoy,
// Kubernetes probes and the Gateway API implementations ask.
const (
	HealthLiveness  = "liveness"
	HealthReadiness = "readiness"
	// ServiceName is the processor's own service: readiness's rule.
	ServiceName = "envoy.service.ext_proc.v3.ExternalProcessor"
)

// DefaultFallbacks is how many endpoints follow the pick in the
// destination list by default.
const DefaultFallbacks = 2

// ErrConfig is returned by New for an unusable Config.
var ErrConfig = errors.New("epp: bad config")

// Config configures a Server.
type Config struct {
	// Gateway reads, tokenizes and routes each request (required): its
	// Config sets the models, the session header, the tokenizer, the body
	// limit (MaxBodyBytes: a larger body is 413) and the router.
	Gateway *gateway.Gateway
	// Fallbacks is how many other eligible endpoints follow the pick in the
	// destination list, for the proxy's retries (default
	// DefaultFallbacks; negative: none). A Hard session, or a pick on a
	// data-parallel rank other than 0, gets none: another worker would
	// break the binding, or not have the rank.
	Fallbacks int
	// Ready reports whether the router behind the picker serves requests
	// (its index caught up): the readiness and processor health services
	// say SERVING only then. nil: always.
	Ready     func() bool
	Logger    *slog.Logger
	Telemetry gateway.Telemetry
}

// Server is the endpoint picker: an Envoy external processor (Process)
// and the gRPC health service. It keeps no state between streams beyond
// a round-robin counter; run as many as wanted.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	cfg      Config
	g        *gateway.Gateway
	log      *slog.Logger
	m        *metrics
	next     atomic.Uint64 // round robin of fallbacks and of requests that do not route
	draining atomic.Bool
}

// New builds a Server from cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Gateway == nil {
		return nil, fmt.Errorf("%w: Gateway is required", ErrConfig)
	}
	if cfg.Fallbacks == 0 {
		cfg.Fallbacks = DefaultFallbacks
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Telemetry = cfg.Telemetry.WithDefaults()
	m, err := newMetrics(cfg.Telemetry.MeterProvider.Meter("github.com/kvrouter/kvrouter/epp"))
	if err != nil {
		return nil, fmt.Errorf("epp: metrics: %w", err)
	}
	return &Server{cfg: cfg, g: cfg.Gateway, log: cfg.Logger, m: m}, nil
}

// Register adds the external processor and the health service to gs.
func (s *Server) Register(gs *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(gs, s)
	healthpb.RegisterHealthServer(gs, health{s: s})
}

// Drain makes readiness (and the processor's service) NOT_SERVING, so the
// proxy and Kubernetes stop sending new streams; liveness stays SERVING.
func (s *Server) Drain() { s.draining.Store(true) }

// ready is readiness's rule.
func (s *Server) ready() bool {
	return !s.draining.Load() && (s.cfg.Ready == nil || s.cfg.Ready())
}

// health is grpc.health.v1 over the Server's state. Check only: Envoy's
// health checks and Kubernetes' gRPC probes use it; Watch and List answer
// Unimplemented.
type health struct {
	healthpb.UnimplementedHealthServer
	s *Server
}

// Check answers liveness always, and readiness, the processor's service
// and "" (what llm-d-router treats as readiness) by the Server's rule.
func (h health) Check(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	switch req.GetService() {
	case HealthLiveness:
		st = healthpb.HealthCheckResponse_SERVING
	case HealthReadiness, ServiceName, "":
		if h.s.ready() {
			st = healthpb.HealthCheckResponse_SERVING
		}
	default:
		return nil, status.Errorf(codes.NotFound, "unknown health service %q", req.GetService())
	}
	return &healthpb.HealthCheckResponse{Status: st}, nil
}

// PollReady turns check (one call to the router) into a Config.Ready that
// calls it at most once per every, with the last answer in between. For
// `kvrouter epp` over NATS: a replica answers only once it is ready (caught
// up with the event stream), so a successful call means one is.
func PollReady(check func(context.Context) error, every time.Duration) func() bool {
	var (
		mu   sync.Mutex
		at   time.Time
		last bool
	)
	return func() bool {
		mu.Lock()
		defer mu.Unlock()
		if !at.IsZero() && time.Since(at) < every {
			return last
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		defer cancel()
		last, at = check(ctx) == nil, time.Now()
		return last
	}
}

// metrics are the picker's own instruments, beside the gateway's.
type metrics struct {
	pick      metric.Float64Histogram // body complete -> destination sent
	refused   metric.Int64Counter     // immediate responses, by status
	elsewhere metric.Int64Counter     // served by another endpoint than the booked pick
}

func newMetrics(m metric.Meter) (*metrics, error) {
	var out metrics
	var err error
	out.pick, err = m.Float64Histogram("kvr_epp_pick_duration_seconds",
		metric.WithDescription("Time from a request body's end to the destination sent to the proxy (parse, tokenize, route)"),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(50e-6, 100e-6, 200e-6, 300e-6, 500e-6, 1e-3, 1.5e-3, 3e-3, 5e-3, 10e-3, 30e-3, 0.1, 1))
	if err != nil {
		return nil, err
	}
	if out.refused, err = m.Int64Counter("kvr_epp_immediate_responses_total",
		metric.WithDescription("Requests the picker answered itself (413, 400, 404, 429, 503...), by status")); err != nil {
		return nil, err
	}
	if out.elsewhere, err = m.Int64Counter("kvr_epp_served_elsewhere_total",
		metric.WithDescription("Requests the proxy reports served by another endpoint than the pick (a fallback): their booking is freed at once")); err != nil {
		return nil, err
	}
	return &out, nil
}
