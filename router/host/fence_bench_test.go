package host

import (
	"testing"

	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/router/scheduler"
)

// What a route pays for its fence and a generated request id.
func BenchmarkFenceToken(b *testing.B) {
	fs := newFenceSigner()
	f := scheduler.Fence{RequestID: "rep-0-0123456789abcdef01234567", Attempt: 7}
	f.Worker.Worker = "gpu-node-17"
	b.ReportAllocs()
	for b.Loop() {
		_ = fs.token(f)
	}
}

func BenchmarkNewRequestID(b *testing.B) {
	r := &Replica{id: "rep-0"}
	s := &routeScratch{}
	b.ReportAllocs()
	for b.Loop() {
		_ = r.newRequestID(s)
	}
}

// What a cancel presenting a request key pays to check it (the route pays
// nothing for keys: they are made and kept by the client).
func BenchmarkRequestKeyCheck(b *testing.B) {
	id, key := api.NewRequestID("gw-a-")
	b.ReportAllocs()
	for b.Loop() {
		if !api.RequestKeyMatches(id, key) {
			b.Fatal("no match")
		}
	}
}
