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

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/internal/natsconn"
	"github.com/kvrouter/kvrouter/router/api"
)

const eppAbout = `Run kvrouter as a Gateway API Inference Extension endpoint picker (EPP):
an Envoy external processor (ext_proc v3, bodies in FULL_DUPLEX_STREAMED mode)
that an Envoy-based gateway (Istio, Envoy Gateway, GKE, kgateway) asks which pod
of an InferencePool serves each request. Each POST /v1/chat/completions or
/v1/completions is read, tokenized and routed exactly as 'kvrouter gateway' does
(sessions from --session-header, LoRA adapters, cache_salt, bookings), through
the router replicas over NATS; the answer is x-gateway-destination-endpoint
(the pick, then --fallbacks other endpoints) in a header and in envoy.lb
metadata. The booking ends with the reply, or when the stream is reset.
gRPC health on the same address: liveness, readiness and the processor's
service (SERVING once a replica answers); plaintext HTTP/2, or TLS with
--tls-cert-file and --tls-key-file. A pod's ip:port is the endpoint its
worker registered: run each bridge with --advertise-addr. docs/epp.md has the
InferencePool deployment. SIGINT/SIGTERM drain (readiness NOT_SERVING), then
stop once streams end (at most --shutdown-timeout).`

func runEPP(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newFlags("kvrouter epp", eppAbout)
	c.SetOutput(stderr)
	c.helpOut = stdout
	nf := addNATSFlags(c, false)
	lf := addLogFlags(c)
	var (
		listen    = c.str("listen", ":9002", "gRPC address of the external processor and the health service")
		metrics   = c.str("metrics-addr", ":9090", "HTTP address of /metrics (\"\" = none)")
		prefix    = c.str("prefix", api.DefaultPrefix, "first token of the router's NATS subjects")
		models    = c.str("models", "default", "models the picker routes, comma separated (another model is 404)")
		gf        = addGatewayFlags(c)
		fallbacks = c.integer("fallbacks", epp.DefaultFallbacks, "other endpoints listed after the pick, for the proxy's retries (negative = none)")
		shutdown  = c.duration("shutdown-timeout", 30*time.Second, "longest wait for streams in flight when stopping")
		tlsCert   = c.str("tls-cert-file", "", "serve gRPC over TLS with this certificate (PEM; with --tls-key-file); \"\" = plaintext HTTP/2")
		tlsKey    = c.str("tls-key-file", "", "the private key of --tls-cert-file (PEM)")
	)
	if err := c.parse(args); err != nil {
		if helpRequested(err) {
			return err
		}
		return usageError{err}
	}
	var opts []grpc.ServerOption
	if *tlsCert != "" || *tlsKey != "" {
		creds, err := credentials.NewServerTLSFromFile(*tlsCert, *tlsKey)
		if err != nil {
			return usageError{fmt.Errorf("--tls-cert-file/--tls-key-file: %w", err)}
		}
		opts = append(opts, grpc.Creds(creds))
	}
	log, prom, err := gf.setup(lf, stderr)
	if err != nil {
		return err
	}
	defer prom.Shutdown(context.Background())
	tel := gateway.Telemetry{MeterProvider: prom.Provider}
	nc, err := natsconn.Open(ctx, nf.config("kvrouter-epp"), log)
	if err != nil {
		return err
	}
	defer nc.Close()
	client := api.NewClient(nc.Conn, *prefix, tel.Propagator)
	g, err := gateway.New(gf.config(gateway.ClientRouter{C: client}, splitList(*models), tel, log))
	if err != nil {
		return usageError{err}
	}
	first := g.Models()[0]
	ready := epp.PollReady(func(ctx context.Context) error { _, err := client.Workers(ctx, first); return err }, time.Second)
	srv, err := startEPP(epp.Config{Gateway: g, Fallbacks: *fallbacks, Ready: ready, Logger: log, Telemetry: tel}, *listen, log, opts...)
	if err != nil {
		return err
	}
	if *metrics != "" {
		ln, err := net.Listen("tcp", *metrics)
		if err != nil {
			srv.stop(0)
			return fmt.Errorf("--metrics-addr: %w", err)
		}
		hs := &http.Server{Handler: prom.Handler, ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(ln)
		defer hs.Close()
	}
	fmt.Fprintf(stdout, "kvrouter epp ready: ext_proc and health on %s, models %v, NATS %s\n", srv.addr, g.Models(), nc.Where())
	<-ctx.Done()
	log.Info("signal received: draining the endpoint picker")
	srv.stop(*shutdown)
	return nil
}

// eppServer is the endpoint picker on a gRPC server.
type eppServer struct {
	epp  *epp.Server
	gs   *grpc.Server
	addr string
	done chan error
}

// startEPP serves an endpoint picker of cfg on addr (`kvrouter epp`,
// `serve --epp-addr`), with opts (TLS).
func startEPP(cfg epp.Config, addr string, log *slog.Logger, opts ...grpc.ServerOption) (*eppServer, error) {
	s, err := epp.New(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("epp listen %s: %w", addr, err)
	}
	gs := grpc.NewServer(opts...)
	s.Register(gs)
	e := &eppServer{epp: s, gs: gs, addr: ln.Addr().String(), done: make(chan error, 1)}
	go func() { e.done <- gs.Serve(ln) }()
	log.Info("endpoint picker listening", "addr", e.addr)
	return e, nil
}

// where is the listen address ("" when there is no server).
func (e *eppServer) where() string {
	if e == nil {
		return ""
	}
	return e.addr
}

// stop drains (readiness NOT_SERVING), lets the streams in flight end (at
// most timeout: their bookings are freed as they end), then stops.
func (e *eppServer) stop(timeout time.Duration) {
	e.epp.Drain()
	stopped := make(chan struct{})
	go func() { e.gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(timeout):
		e.gs.Stop()
		<-stopped
	}
	if err := <-e.done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		slog.Debug("epp serve", "err", err)
	}
}
