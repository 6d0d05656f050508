package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// kvrouter gateway --help documents every flag (with its variable and
// default, as TestHelpListsEveryFlag checks for the other commands).
func TestGatewayHelpDocumentsEveryFlag(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"gateway", "--help"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, name := range []string{"listen", "nats-url", "nats-creds", "nats-tls-ca", "embedded-nats", "prefix", "models", "session-header",
		"workers-ttl", "call-timeout", "max-body-bytes", "tokenizer", "shutdown-timeout", "trace-file", "trace-sample", "otlp-endpoint", "otlp-protocol", "log-level"} {
		line := ""
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(l, "  --"+name+" ") {
				line = l
			}
		}
		if line == "" || !strings.HasSuffix(line, envName(name)) {
			t.Errorf("--%s: not documented with its variable (%q)", name, line)
		}
	}
	var o2, e2 bytes.Buffer
	if code := run(context.Background(), []string{"serve", "--help"}, &o2, &e2); code != 0 || !strings.Contains(o2.String(), "--openai-addr") {
		t.Fatalf("serve --help lacks --openai-addr (exit %d)", code)
	}
}

// serve --openai-addr runs the gateway in process (here in vLLM's P/D mode,
// --openai-pd); kvrouter gateway runs it over NATS against the same replica. Both answer the OpenAI API: the model
// list, and 503 in OpenAI's shape while no worker is registered.
func TestServeOpenAIAddrAndGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server, a replica and a gateway")
	}
	srv := startServe(t, 4, func(p []int) []string {
		return []string{"serve", "--embedded-nats", "--embedded-listen", fmt.Sprintf("127.0.0.1:%d", p[0]),
			"--http-addr", fmt.Sprintf("127.0.0.1:%d", p[1]), "--openai-addr", fmt.Sprintf("127.0.0.1:%d", p[2]),
			"--openai-pd", "vllm", "--models", "llama", "--log-level", "warn"}
	})
	natsPort, oaPort := srv.ports[0], srv.ports[2]
	gw := runOnPort(t, srv.ports[3], func(port int) []string {
		return []string{"gateway", "--nats-url", fmt.Sprintf("nats://127.0.0.1:%d", natsPort),
			"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--models", "llama", "--log-level", "warn"}
	}, func(c *command) bool { return answers(fmt.Sprintf("http://127.0.0.1:%d/v1/models", c.port()), 200) })
	gwPort := gw.port()
	for _, port := range []int{oaPort, gwPort} {
		base := fmt.Sprintf("http://127.0.0.1:%d", port)
		waitHTTP(t, base+"/v1/models", 200, 20*time.Second)
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var eb struct {
			Error struct{ Message, Code string }
		}
		if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(body, &eb) != nil || eb.Error.Message == "" {
			t.Fatalf("port %d: %d %s, want 503 in OpenAI's error shape", port, resp.StatusCode, body)
		}
	}
	waitHTTP(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", gwPort), 200, 5*time.Second)
	gw.stop()
	if code := <-gw.done; code != 0 {
		t.Fatalf("gateway exit %d: %s", code, gw.errb)
	}
	srv.shutdown(t)
	if !strings.Contains(gw.out.String(), "gateway ready") || !strings.Contains(srv.out.String(), fmt.Sprintf("OpenAI 127.0.0.1:%d", oaPort)) {
		t.Fatalf("banners: %q %q", gw.out.String(), srv.out.String())
	}
}

// runOnPort gives a command whose port was taken in the meantime another
// one: the gateway exits with "address already in use" on the taken port
// and answers on the next.
func TestRunOnPortTakesAnotherPort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a gateway with an embedded NATS server")
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	gw := runOnPort(t, port, func(p int) []string {
		return []string{"gateway", "--embedded-nats", "--listen", fmt.Sprintf("127.0.0.1:%d", p), "--models", "llama", "--log-level", "warn"}
	}, func(c *command) bool { return answers(fmt.Sprintf("http://127.0.0.1:%d/v1/models", c.port()), 200) })
	if gw.port() == port {
		t.Fatalf("the gateway answered on the taken port %d", port)
	}
	gw.stop()
	if code := <-gw.done; code != 0 {
		t.Fatalf("gateway exit %d: %s", code, gw.errb)
	}
}
