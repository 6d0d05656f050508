package host

import (
	"sync"
	"testing"

	"github.com/kvrouter/kvrouter/router/api"
	"github.com/kvrouter/kvrouter/workers"
)

// TestRouteBodyLimitNeverZero calls routeBodyLimit from many goroutines at
// once on fresh replicas, as the first burst of requests after a start
// does. Each must get the limit its workers imply: a request that came
// while another computed the first limit once read 0 and was refused with
// "is 8235 bytes, the limit is 0" (seen in BenchmarkRouteNATS).
func TestRouteBodyLimitNeverZero(t *testing.T) {
	ws := map[string]workers.Info{"w1": {ID: "w1", KVBlocks: 1 << 10, BlockSize: 16}}
	want := min(max(int64(1<<10*16)*wireBytesPerToken+64<<10, MinBodyBytes), api.MaxRouteBodySize)
	const callers = 8
	for trial := range 2000 {
		ms := &modelState{}
		ms.workers.Store(&ws)
		r := &Replica{models: map[string]*modelState{"m": ms}}
		got := make([]int64, callers)
		var start, done sync.WaitGroup
		start.Add(1)
		for i := range callers {
			done.Add(1)
			go func() {
				defer done.Done()
				start.Wait()
				got[i] = r.routeBodyLimit()
			}()
		}
		start.Done()
		done.Wait()
		for i, n := range got {
			if n != want {
				t.Fatalf("trial %d, caller %d: limit %d, want %d", trial, i, n, want)
			}
		}
	}
}
