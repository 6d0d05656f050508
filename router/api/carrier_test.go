package api

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

func TestHeaderCarrierKeepsLowercaseTraceparent(t *testing.T) {
	prop := propagation.TraceContext{}
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	cases := []struct {
		name string
		key  string
	}{
		{"lowercase as W3C clients write it", "traceparent"},
		{"canonical as propagation.HeaderCarrier writes it", "Traceparent"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := nats.Header{}
			h[c.key] = []string{tp}
			ctx := prop.Extract(context.Background(), HeaderCarrier(h))
			sc := trace.SpanContextFromContext(ctx)
			if !sc.IsValid() || sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
				t.Fatalf("extracted %v from %v", sc, h)
			}
			// Injecting writes the lowercase key, readable by any W3C client.
			out := nats.Header{}
			prop.Inject(ctx, HeaderCarrier(out))
			if got := out["traceparent"]; len(got) != 1 || got[0] != tp {
				t.Fatalf("injected %v", out)
			}
		})
	}
}

func TestCanonicalKey(t *testing.T) {
	for in, want := range map[string]string{"traceparent": "Traceparent", "x-trace-id": "X-Trace-Id", "Already-Ok": "Already-Ok", "ABC": "Abc"} {
		if got := canonicalKey(in); got != want {
			t.Errorf("canonicalKey(%q) = %q, want %q", in, got, want)
		}
	}
}
