package gateway

// Prefill/decode disaggregation (docs/pd.md). With Config.PD set, every
// route asks the router for a prefill/decode pair. When the router splits
// the request (RouteResponse.Prefill), the gateway runs the prefill leg
// first, as vLLM's disaggregation proxy does: the client's body with
// kv_transfer_params {"do_remote_decode": true}, max_tokens 1 and no
// streaming, to the prefill worker; then the decode leg, the client's body
// with the kv_transfer_params the prefill engine answered, to the decode
// worker, whose reply (streamed or whole) goes to the client as any reply.
// A prefill leg that fails (no answer, a refusal, no kv_transfer_params)
// falls back to the decode worker alone with the client's body: a vLLM
// decode engine then computes the prompt itself (counted in
// kvr_gateway_pd_fallbacks_total). In SGLang mode both legs go at once with
// the same bootstrap room (pdSGLang). The prefill leg's booking is freed as
// soon as its leg ends; run's free releases it too when the client goes
// away during the leg.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"

	"github.com/kvrouter/kvrouter/router/api"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// PD modes (Config.PD).
const (
	PDVLLM   = "vllm"   // NixlConnector's two-step protocol
	PDSGLang = "sglang" // SGLang's bootstrap room, both legs at once
)

// CheckPD checks a PD mode (Config.PD): PDVLLM, PDSGLang or "" (off).
func CheckPD(mode string) error {
	if mode != "" && mode != PDVLLM && mode != PDSGLang {
		return fmt.Errorf("%w: PD mode %q: want %q, %q or empty", ErrConfig, mode, PDVLLM, PDSGLang)
	}
	return nil
}

// remoteDecode is the kv_transfer_params of a vLLM prefill leg, as vLLM's
// reference proxy sends them.
var remoteDecode = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// errNoTransferParams: the prefill engine answered without
// kv_transfer_params (it has no KV connector).
var errNoTransferParams = errors.New("the prefill engine answered without kv_transfer_params")

// decodeBody returns the body for the decode leg: the client's body,
// after the prefill leg when the route is split (vLLM), or with the
// bootstrap fields (SGLang, whose prefill leg runs beside it). A client
// that left during the prefill leg is an error; a failed prefill leg falls
// back to the client's body (counted).
func (x *exchange) decodeBody(ctx context.Context) ([]byte, error) {
	if x.pre == nil {
		return x.body, nil
	}
	if x.g.cfg.PD == PDSGLang {
		return x.sglangLegs(ctx)
	}
	params, err := x.prefillLeg(ctx)
	x.freePrefill(ctx)
	if err == nil {
		return withFields(x.body, map[string]json.RawMessage{"kv_transfer_params": params}, nil)
	}
	if ctx.Err() != nil {
		return nil, err
	}
	x.fallback(ctx, err)
	return x.body, nil
}

// prefillLeg sends the prefill leg and returns the kv_transfer_params the
// prefill engine answered with.
func (x *exchange) prefillLeg(ctx context.Context) (json.RawMessage, error) {
	body, err := prefillBody(x.body)
	if err != nil {
		return nil, err
	}
	resp, err := x.post(ctx, "prefill", x.pre, x.rq.RequestID, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, x.g.cfg.MaxBodyBytes))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("prefill worker %s: status %d: %s", x.pre.Worker, resp.StatusCode, bytes.TrimSpace(data))
	}
	var reply struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(data, &reply); err != nil {
		return nil, fmt.Errorf("prefill worker %s: %w", x.pre.Worker, err)
	}
	if len(reply.KV) == 0 || string(reply.KV) == "null" {
		return nil, fmt.Errorf("prefill worker %s: %w", x.pre.Worker, errNoTransferParams)
	}
	return reply.KV, nil
}

// prefillBody is vLLM's prefill leg: the client's body with
// kv_transfer_params do_remote_decode, no streaming, one token, and no
// stream_options or minimum lengths.
func prefillBody(body []byte) ([]byte, error) {
	one := json.RawMessage("1")
	set := map[string]json.RawMessage{"kv_transfer_params": remoteDecode, "stream": json.RawMessage("false"), "max_tokens": one}
	return withFields(body, set, func(m map[string]json.RawMessage) {
		if _, ok := m["max_completion_tokens"]; ok {
			m["max_completion_tokens"] = one
		}
		delete(m, "stream_options")
		delete(m, "min_tokens")
		delete(m, "min_completion_tokens")
	})
}

// withFields returns body (a JSON object) with set's fields replaced and
// then edit applied.
func withFields(body []byte, set map[string]json.RawMessage, edit func(map[string]json.RawMessage)) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("the request body is not a JSON object: %w", err)
	}
	for k, v := range set {
		m[k] = v
	}
	if edit != nil {
		edit(m)
	}
	return json.Marshal(m)
}

// post sends one leg's body to rs's worker (the client's path and headers,
// X-Request-Id id, shared by both legs, the rank) in a client span.
func (x *exchange) post(ctx context.Context, leg string, rs *api.RouteResponse, id string, body []byte) (*http.Response, error) {
	ctx, span := x.g.tracer.Start(ctx, "upstream "+leg, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("kvr.worker", rs.Worker), attribute.String("server.address", rs.Endpoint)))
	defer span.End()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, engineRoot(rs.Endpoint)+x.r.URL.Path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	copyRequestHeaders(req.Header, x.r.Header)
	if x.g.cfg.APIKey != "" {
		req.Header.Del("Authorization")
	}
	req.Header.Set(RankHeader, strconv.FormatUint(uint64(rs.Rank), 10))
	req.Header.Set("X-Request-Id", id)
	x.g.tel.Propagator.Inject(ctx, propagation.HeaderCarrier(req.Header))
	return x.g.http.Do(req)
}

// fallback records a prefill leg that failed before the decode leg
// started: the decode worker serves the whole request.
func (x *exchange) fallback(ctx context.Context, err error) {
	x.g.log.Warn("prefill leg failed: the decode worker serves the whole request", "request", x.rq.RequestID,
		"prefill_worker", x.pre.Worker, "decode_worker", x.rs.Worker, "err", err)
	x.g.m.pdFallbacks.Add(ctx, 1, metric.WithAttributes(attribute.String("mode", x.g.cfg.PD)))
	x.span.AddEvent("pd_fallback", trace.WithAttributes(attribute.String("kvr.prefill_worker", x.pre.Worker)))
	x.rs.Prefill = nil // no prefill worker served it (HeaderPrefillWorker)
	// The decode worker computes the prompt now: its booking charges it
	// as that worker's prefill (a split's decode booking does not).
	cctx, cancel := x.g.callContext(ctx)
	defer cancel()
	if err := x.g.router.ServeWhole(cctx, x.rq.Model, &x.rs); err != nil {
		x.g.log.Warn("serve_whole", "request", x.rs.RequestID, "worker", x.rs.Worker, "err", err)
	}
}

// freePrefill releases the prefill leg's booking, once.
func (x *exchange) freePrefill(ctx context.Context) {
	if x.pre == nil || !x.preBooked {
		return
	}
	x.preBooked = false
	cctx, cancel := x.g.callContext(ctx)
	defer cancel()
	if err := x.g.router.Free(cctx, x.rq.Model, x.pre); err != nil {
		x.g.log.Warn("free", "request", x.pre.RequestID, "worker", x.pre.Worker, "err", err)
	}
}

// sglangLegs starts SGLang's prefill leg (the client's body with the
// bootstrap fields, read and dropped) and returns the decode leg's body,
// the same. The prefill booking is freed when its leg ends; a prefill
// leg that fails ends the decode leg too (it waits for the room in vain),
// and the decode worker's error reaches the client.
func (x *exchange) sglangLegs(ctx context.Context) ([]byte, error) {
	host := hostOf(x.pre.Endpoint)
	port := x.rs.Prefill.BootstrapPort
	if port == 0 {
		port = 8998
	}
	set := map[string]json.RawMessage{"bootstrap_host": jsonString(host), "bootstrap_port": json.RawMessage(strconv.Itoa(port)),
		"bootstrap_room": json.RawMessage(strconv.FormatUint(rand.Uint64()>>1, 10))}
	body, err := withFields(x.body, set, nil)
	if err != nil {
		return nil, err
	}
	pre, id, done := x.pre, x.rq.RequestID, make(chan struct{})
	x.preDone = done
	go func() {
		defer close(done)
		resp, err := x.post(ctx, "prefill", pre, id, body)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		if err != nil && ctx.Err() == nil {
			x.g.log.Warn("SGLang prefill leg failed", "request", id, "worker", pre.Worker, "err", err)
		}
	}()
	return body, nil
}

// hostOf is the host of an engine endpoint URL.
func hostOf(endpoint string) string {
	if u, err := url.Parse(engineRoot(endpoint)); err == nil && u.Host != "" {
		if h, _, err := net.SplitHostPort(u.Host); err == nil {
			return h
		}
		return u.Host
	}
	return endpoint
}

func jsonString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}
