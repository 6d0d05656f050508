package vllmzmq

import "testing"

// BenchmarkPublish hands 8 KiB batches to the PUB socket (no subscriber)
// and the replay ring: the per-batch cost an engine pays in its step.
func BenchmarkPublish(b *testing.B) {
	p := newPublisher(b, testConfig(DefaultBufferSteps, "kv@pod@m"), 0)
	payload := make([]byte, 8<<10)
	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	for b.Loop() {
		if _, err := p.Publish(payload); err != nil {
			b.Fatal(err)
		}
	}
}
