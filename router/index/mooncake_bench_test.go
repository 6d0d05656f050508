package index

import (
	"bufio"
	"container/list"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// Mooncake conversation trace replay.
//
// The trace (FAST'25, 12,031 requests, one hash id = one 512-token block;
// an id always has the same predecessor, so it names a whole prefix) is
// turned into the operations a router replica would see: for every request
// a lookup of its blocks, then the KV events its worker publishes. 16
// simulated workers each run an LRU cache, of 2,048 blocks (2,048 × 512
// tokens = 1M tokens, the KV size of Dynamo's mocker default of 16,384
// blocks of 64 tokens) or of 8,192 blocks (4M tokens, where more of the
// trace's reuse shows). Routing picks the worker with the longest match,
// ties going to the worker that received the fewest requests. The operations are generated once (not timed) and then
// replayed against a fresh index per iteration.
const (
	mooncakeTrace   = "mooncake_fast25_conversation_trace.jsonl"
	mooncakeWorkers = 16
)

// findShared walks up from the working directory (the package directory
// under go test) to the first shared/data/mooncake holding the trace.
func findShared(name string) (string, bool) {
	dir, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for {
		p := filepath.Join(dir, "shared", "data", "mooncake", name)
		if _, err := os.Stat(p); err == nil {
			return p, true
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}

func mooncakeSeq(id uint64) kvevents.SeqHash { return kvevents.SeqHash(mix(id ^ 0x6d6f6f6e63616b65)) }
func mooncakeEngine(id uint64) kvevents.EngineHash {
	return kvevents.EngineHash(mix(id + 0x656e67696e65))
}

type mooncakeOps struct {
	prompts     [][]kvevents.SeqHash
	batches     []kvevents.Batch // batches[i] follows prompts[i]
	blocks      int              // prompt blocks looked up
	hitBlocks   int              // blocks matched on the chosen worker
	eventBlocks int              // blocks stored + removed
}

// lruCache is one simulated worker's cache of block ids.
type lruCache struct {
	cap   int
	order *list.List // front = most recent
	at    map[uint64]*list.Element
}

var (
	mooncakeMu   sync.Mutex
	mooncakeData = map[int]*mooncakeOps{}
)

func loadMooncake(b *testing.B, cacheBlocks int) *mooncakeOps {
	path, ok := findShared(mooncakeTrace)
	if !ok {
		b.Skipf("%s not found above %s", mooncakeTrace, must(os.Getwd()))
	}
	mooncakeMu.Lock()
	defer mooncakeMu.Unlock()
	if ops := mooncakeData[cacheBlocks]; ops != nil {
		return ops
	}
	ops, err := buildMooncakeOps(path, cacheBlocks)
	if err != nil {
		b.Fatal(err)
	}
	mooncakeData[cacheBlocks] = ops
	return ops
}

func must[T any](v T, _ error) T { return v }

func buildMooncakeOps(path string, cacheBlocks int) (*mooncakeOps, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ops := &mooncakeOps{}
	x := New(Config{})
	caches := make([]*lruCache, mooncakeWorkers)
	routed := make([]int, mooncakeWorkers)
	names := make([]string, mooncakeWorkers)
	for i := range caches {
		caches[i] = &lruCache{cap: cacheBlocks, order: list.New(), at: map[uint64]*list.Element{}}
		names[i] = fmt.Sprintf("mooncake-%02d", i)
	}
	var out Overlaps
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec struct {
			HashIDs []uint64 `json:"hash_ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(rec.HashIDs) == 0 {
			continue
		}
		prompt := make([]kvevents.SeqHash, len(rec.HashIDs))
		for i, id := range rec.HashIDs {
			prompt[i] = mooncakeSeq(id)
		}
		x.Lookup(prompt, LookupOptions{}, &out)
		best, bestOverlap := 0, -1
		for w := 0; w < mooncakeWorkers; w++ {
			o := out.Get(workerref.Target{Worker: names[w]})
			if o > bestOverlap || (o == bestOverlap && routed[w] < routed[best]) {
				best, bestOverlap = w, o
			}
		}
		routed[best]++
		ops.blocks += len(prompt)
		ops.hitBlocks += bestOverlap
		c := caches[best]
		// The engine stores the missing blocks, then touches the whole
		// prompt tail first so that a prefix is never older than its
		// continuation (vLLM frees a request's blocks in reverse order).
		st := kvevents.Event{Kind: kvevents.KindStored}
		for i, id := range rec.HashIDs {
			if _, ok := c.at[id]; ok {
				continue
			}
			if len(st.Blocks) == 0 && i > 0 {
				st.HasParent, st.Parent = true, mooncakeEngine(rec.HashIDs[i-1])
			}
			st.Blocks = append(st.Blocks, kvevents.StoredBlock{Engine: mooncakeEngine(id), Seq: mooncakeSeq(id)})
			c.at[id] = c.order.PushFront(id)
		}
		for i := len(rec.HashIDs) - 1; i >= 0; i-- {
			c.order.MoveToFront(c.at[rec.HashIDs[i]])
		}
		rm := kvevents.Event{Kind: kvevents.KindRemoved}
		for c.order.Len() > c.cap {
			e := c.order.Back()
			id := e.Value.(uint64)
			c.order.Remove(e)
			delete(c.at, id)
			rm.Removed = append(rm.Removed, mooncakeEngine(id))
		}
		bt := kvevents.Batch{Worker: names[best], Epoch: 1}
		if len(st.Blocks) > 0 {
			bt.Events = append(bt.Events, st)
		}
		if len(rm.Removed) > 0 {
			bt.Events = append(bt.Events, rm)
		}
		ops.eventBlocks += len(st.Blocks) + len(rm.Removed)
		x.ApplyBatch(uint64(len(ops.batches)+1), &bt)
		ops.prompts = append(ops.prompts, prompt)
		ops.batches = append(ops.batches, bt)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return ops, nil
}

// BenchmarkMooncakeReplay replays the trace (one op = the whole trace:
// 12,031 lookups and 12,031 batches). Sequential: lookup then apply per
// request on one goroutine, each lookup timed for the latency metrics.
// Concurrent: one goroutine applies every batch while another looks up
// every prompt, as a replica's subscriber and request handlers would.
func BenchmarkMooncakeReplay(b *testing.B) {
	for _, cacheBlocks := range []int{2048, 8192} {
		b.Run(fmt.Sprintf("cache=%d/sequential", cacheBlocks), func(b *testing.B) {
			ops := loadMooncake(b, cacheBlocks)
			n := len(ops.prompts)
			lat := make([]time.Duration, 0, n*b.N)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := threadCPU()
			for it := 0; it < b.N; it++ {
				x := New(Config{})
				var out Overlaps
				for i := 0; i < n; i++ {
					t0 := time.Now()
					x.Lookup(ops.prompts[i], LookupOptions{}, &out)
					lat = append(lat, time.Since(t0))
					x.ApplyBatch(uint64(i+1), &ops.batches[i])
				}
			}
			cpu := threadCPU() - cpu0
			b.StopTimer()
			slices.Sort(lat)
			el := b.Elapsed().Seconds()
			b.ReportMetric(float64(2*n*b.N)/el, "ops/s")
			b.ReportMetric(float64(2*n*b.N)/cpu.Seconds(), "ops/cpu-s")
			b.ReportMetric(float64(ops.eventBlocks*b.N)/el, "event-blocks/s")
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-lookup-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-lookup-ns")
			b.ReportMetric(100*float64(ops.hitBlocks)/float64(ops.blocks), "hit-%")
		})
	}
	b.Run("cache=8192/concurrent", func(b *testing.B) {
		ops := loadMooncake(b, 8192)
		n := len(ops.prompts)
		b.ReportAllocs()
		b.ResetTimer()
		for it := 0; it < b.N; it++ {
			x := New(Config{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range ops.batches {
					x.ApplyBatch(uint64(i+1), &ops.batches[i])
				}
			}()
			var out Overlaps
			for i := 0; i < n; i++ {
				x.Lookup(ops.prompts[i], LookupOptions{}, &out)
			}
			wg.Wait()
		}
		b.ReportMetric(float64(2*n*b.N)/b.Elapsed().Seconds(), "ops/s")
	})
}
