package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvrouter/kvrouter/internal/testutil"
)

// serve --epp-addr runs the endpoint picker in process; kvrouter epp runs
// it over NATS against the same replica. Both are ready (gRPC health) once
// the replica is, and answer a chat with no worker registered with an
// immediate 503.
func TestServeEPPAddrAndEPP(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server, a replica and a picker")
	}
	srv := startServe(t, 4, func(p []int) []string {
		return []string{"serve", "--embedded-nats", "--embedded-listen", fmt.Sprintf("127.0.0.1:%d", p[0]),
			"--http-addr", fmt.Sprintf("127.0.0.1:%d", p[1]), "--epp-addr", fmt.Sprintf("127.0.0.1:%d", p[2]),
			"--models", "llama", "--log-level", "warn"}
	})
	natsPort, eppPort := srv.ports[0], srv.ports[2]
	ep := runOnPort(t, srv.ports[3], func(port int) []string {
		return []string{"epp", "--nats-url", fmt.Sprintf("nats://127.0.0.1:%d", natsPort),
			"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--metrics-addr", "", "--models", "llama", "--log-level", "warn"}
	}, func(c *command) bool { // listening: readiness itself is checked below
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", c.port()), time.Second)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
	for _, port := range []int{eppPort, ep.port()} {
		conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", port), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		hc := healthpb.NewHealthClient(conn)
		testutil.Eventually(t, 20*time.Second, func() bool {
			r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
			return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
		}, func() string { return fmt.Sprintf("port %d: readiness not SERVING", port) })
		st, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		body := []byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`)
		_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")}}}}}})
		_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}})
		m, err := st.Recv()
		if imm := m.GetImmediateResponse(); err != nil || imm.GetStatus().GetCode() != 503 || !bytes.Contains(imm.GetBody(), []byte(`"error"`)) {
			t.Fatalf("port %d: %v %v, want an immediate 503 in OpenAI's error shape", port, m, err)
		}
		cancel()
		conn.Close()
	}
	ep.stop()
	if code := <-ep.done; code != 0 {
		t.Fatalf("epp exit %d: %s", code, ep.errb)
	}
	srv.shutdown(t)
	if !strings.Contains(ep.out.String(), "kvrouter epp ready") || !strings.Contains(srv.out.String(), fmt.Sprintf("EPP 127.0.0.1:%d", eppPort)) {
		t.Fatalf("banners: %q %q", ep.out.String(), srv.out.String())
	}
}
