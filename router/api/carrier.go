package api

import (
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
)

// HeaderCarrier adapts nats.Header to OpenTelemetry's TextMapCarrier while
// keeping keys exactly as written. propagation.HeaderCarrier would
// canonicalise "traceparent" to "Traceparent", but nats.Header is
// case-sensitive and W3C clients write the lowercase form, so a canonicalising
// carrier neither finds their context nor writes one they can read.
//
// Get also falls back to the canonical form, so a context injected by a
// client that used propagation.HeaderCarrier is still found.
type HeaderCarrier nats.Header

var _ propagation.TextMapCarrier = HeaderCarrier(nil)

// Get returns the first value of key as written, or of its canonical form.
func (c HeaderCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	if v := nats.Header(c).Get(canonicalKey(key)); v != "" {
		return v
	}
	return ""
}

// Set stores value under key exactly as given.
func (c HeaderCarrier) Set(key, value string) { c[key] = []string{value} }

// Keys lists the keys present.
func (c HeaderCarrier) Keys() []string {
	ks := make([]string, 0, len(c))
	for k := range c {
		ks = append(ks, k)
	}
	return ks
}

// canonicalKey is the MIME canonical form ("traceparent" -> "Traceparent"),
// without net/textproto's allocation when key is already canonical.
func canonicalKey(key string) string {
	upper := true
	for i := 0; i < len(key); i++ {
		c := key[i]
		if upper && c >= 'a' && c <= 'z' || !upper && c >= 'A' && c <= 'Z' {
			b := []byte(key)
			upper = true
			for j, c := range b {
				if upper && c >= 'a' && c <= 'z' {
					b[j] = c - 'a' + 'A'
				} else if !upper && c >= 'A' && c <= 'Z' {
					b[j] = c - 'A' + 'a'
				}
				upper = c == '-'
			}
			return string(b)
		}
		upper = c == '-'
	}
	return key
}
