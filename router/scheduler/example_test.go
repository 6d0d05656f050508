package scheduler_test

import (
	"context"
	"fmt"

	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/session"
	"github.com/kvrouter/kvrouter/workerref"
)

// A host's view: build the policy from YAML, register workers, schedule a
// request carrying a Hard session binding, then drive the booking's life.
func Example() {
	policy, err := scheduler.NewRegistry().BuildYAML([]byte("name: default\nparams: {temperature: 0}"))
	if err != nil {
		panic(err)
	}
	s, err := scheduler.New(scheduler.Config{Replica: "router-a", Seed: 1, HasSeed: true}, policy)
	if err != nil {
		panic(err)
	}
	s.OnBookingChange(func(ev scheduler.BookingEvent) {
		fmt.Println("publish:", ev.Kind, ev.RequestID, ev.Worker) // the host sends these to its peers
	})
	for _, w := range []string{"gpu-1", "gpu-2"} {
		_ = s.UpsertWorker(scheduler.WorkerInfo{Key: workerref.Target{Worker: w}, KVBlocks: 4096, MaxBatchedTokens: 8192, Available: true})
	}
	if err := s.Start(context.Background()); err != nil {
		panic(err)
	}
	defer s.Close()

	req := &scheduler.Request{
		ID:     "req-1",
		Tokens: 512,
		// gpu-2 has the whole prompt cached, but the session is bound Hard to gpu-1.
		Overlaps: []scheduler.Overlap{{Key: workerref.Target{Worker: "gpu-2"}, Blocks: 32}},
		Affinity: &scheduler.Affinity{Target: workerref.Any("gpu-1"), Mode: session.Hard},
	}
	d, err := s.Schedule(context.Background(), req)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Println("route to", d.Worker, "fallback:", d.HardFallback)
	_ = s.PrefillDone(d.Fence) // first token
	_ = s.Free(d.Fence)        // end of stream
	// Output:
	// publish: add req-1 gpu-1
	// route to gpu-1#0 fallback: false
	// publish: prefill_done req-1 gpu-1
	// publish: free req-1 gpu-1
}
