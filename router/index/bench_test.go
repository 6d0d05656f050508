package index

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// Benchmark workloads. Sequence hashes are mixed counters (they behave like
// XXH3 output); engine hashes are distinct from them.

func seqOf(ns, i uint64) kvevents.SeqHash { return kvevents.SeqHash(mix(ns<<40 ^ i + 0x51)) }
func engOf(ns, i uint64) kvevents.EngineHash {
	return kvevents.EngineHash(mix(ns<<40 ^ i ^ 0xdeadbeef00000000))
}

// applyWorkload is a ring of batches for nw workers: each batch stores 16
// new blocks (a chain continuing the worker's conversation) and, once the
// worker holds `window` batches, removes the 16 blocks stored `window`
// batches earlier. In steady state the index holds nw*window*16 entries.
// Sequence-keyed batches (kvevents.Batch.SeqKeyed) name the same blocks by
// sequence hash alone.
type applyWorkload struct {
	batches []kvevents.Batch
	warm    int // batches to apply before timing (fills the window)
}

func newApplyWorkload(prefix string, nw, window, rounds int, shared, seqKeyed bool) *applyWorkload {
	const per = 16
	wl := &applyWorkload{warm: nw * window}
	for r := 0; r < rounds; r++ {
		for w := 0; w < nw; w++ {
			b := kvevents.Batch{Worker: fmt.Sprintf("%s-%04d", prefix, w), Epoch: 1, SeqKeyed: seqKeyed}
			st := kvevents.Event{Kind: kvevents.KindStored}
			for j := 0; j < per; j++ {
				n := uint64(r*per + j)
				ns := uint64(w)
				if shared {
					// Each block content is shared by 8 workers.
					ns = uint64(w / 8)
				}
				st.Blocks = append(st.Blocks, kvevents.StoredBlock{Engine: engOf(ns, n), Seq: seqOf(ns, n)})
				if seqKeyed {
					st.Blocks[j].Engine = 0
				}
			}
			if r > 0 && !seqKeyed {
				st.HasParent, st.Parent = true, engOf(uint64(w), uint64(r*per-1))
			}
			b.Events = append(b.Events, st)
			if old := r - window; old >= 0 || rounds > window {
				// Removal of the batch stored `window` rounds ago (mod rounds).
				or := (r - window + rounds) % rounds
				rm := kvevents.Event{Kind: kvevents.KindRemoved}
				for j := 0; j < per; j++ {
					n := uint64(or*per + j)
					ns := uint64(w)
					if shared {
						ns = uint64(w / 8)
					}
					if seqKeyed {
						rm.RemovedSeqs = append(rm.RemovedSeqs, seqOf(ns, n))
					} else {
						rm.Removed = append(rm.Removed, engOf(ns, n))
					}
				}
				b.Events = append(b.Events, rm)
			}
			wl.batches = append(wl.batches, b)
		}
	}
	return wl
}

// BenchmarkApply measures event application on one goroutine at 1,000
// workers in steady state (about 1M entries: each worker keeps 1,024
// blocks). One op = one batch storing 16 blocks and removing 16; the
// stored-blocks/s metric counts stored blocks only, with the removal
// time included. The seq-keyed cases apply the same blocks as
// sequence-keyed batches (what kvrouter bridge publishes): no engine map.
func BenchmarkApply(b *testing.B) {
	for _, sc := range []struct {
		name     string
		window   int
		shared   bool
		seqKeyed bool
	}{
		{"entries=64k/unique", 4, false, false},
		{"entries=1M/unique", 64, false, false},
		{"entries=1M/shared8", 64, true, false},
		{"entries=64k/unique/seq-keyed", 4, false, true},
		{"entries=1M/unique/seq-keyed", 64, false, true},
		{"entries=1M/shared8/seq-keyed", 64, true, true},
	} {
		b.Run(sc.name, func(b *testing.B) {
			wl := newApplyWorkload("worker", 1000, sc.window, 2*sc.window, sc.shared, sc.seqKeyed)
			x := New(Config{})
			warmApply(x, wl)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := threadCPU()
			for n := 0; n < b.N; n++ {
				i := wl.warm + n
				x.ApplyBatch(uint64(i), &wl.batches[i%len(wl.batches)])
			}
			cpu := threadCPU() - cpu0
			b.StopTimer()
			blocks := float64(b.N * 16)
			b.ReportMetric(blocks/b.Elapsed().Seconds(), "stored-blocks/s")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/blocks, "ns/stored-block")
			b.ReportMetric(float64(cpu.Nanoseconds())/blocks, "cpu-ns/stored-block")
			// After churn, the tables' rebuild policy sets the memory.
			b.ReportMetric(x.Stats().BytesPerEntry, "stats-B/entry")
		})
	}
}

// BenchmarkApplyMemoryFloor is the memory traffic of Apply/entries=1M
// without the index: per op, 16 stored blocks and 16 removals, each
// touching one random 16-byte bucket in its worker's 32 KB engine table
// and one in a 32 MB block table, in the same order (all stores' buckets
// loaded before any is written; a removal's block bucket only once its
// engine bucket named it). It says what four random cache lines per
// stored block cost on this machine, against which Apply's figure is
// read (docs/benchmarks/index.md). lines=2 is the same without the engine
// tables: what a block would cost in memory if removals named sequence
// hashes, so that the index kept no engine map (the lever docs/benchmarks.md
// weighs for apply at 1M entries, issue 29).
func BenchmarkApplyMemoryFloor(b *testing.B) {
	b.Run("lines=4", func(b *testing.B) { applyMemoryFloor(b, true) })
	b.Run("lines=2", func(b *testing.B) { applyMemoryFloor(b, false) })
}

func applyMemoryFloor(b *testing.B, engines bool) {
	const (
		workers   = 1000
		engWords  = 2 * 2048    // one worker's engine table: 2,048 buckets of two words
		tabWords  = 2 * 1 << 21 // 2M buckets: a 1M-entry table at load 1/2
		perBatch  = 16
		engMask   = engWords/2 - 1
		tableMask = tabWords/2 - 1
	)
	eng := make([]uint64, workers*engWords)
	tab := make([]uint64, tabWords)
	for i := range eng {
		eng[i] = mix(uint64(i))
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var ctr, sink uint64
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		base := uint64(n%workers) * engWords
		var eb, tb [perBatch]uint64
		for i := range perBatch { // stores: load both buckets of every block
			ctr++
			h := mix(ctr)
			eb[i], tb[i] = base+2*(h&engMask), 2*(mix(h)&tableMask)
			if engines {
				sink += eng[eb[i]]
			}
			sink += tab[tb[i]]
		}
		for i := range perBatch { // then write them
			if engines {
				eng[eb[i]], eng[eb[i]+1] = tb[i], uint64(n)
			}
			tab[tb[i]+1]++
		}
		for i := range perBatch { // removals: the engine buckets first
			ctr++
			eb[i] = base + 2*(mix(ctr^0x9e3779b97f4a7c15)&engMask)
			if engines {
				sink += eng[eb[i]]
			}
		}
		for i := range perBatch { // the block bucket each one names
			if engines {
				tb[i] = 2 * (mix(eng[eb[i]]) & tableMask)
				eng[eb[i]] = 0
			} else {
				tb[i] = 2 * (mix(eb[i]) & tableMask) // named by the removal itself
			}
			sink += tab[tb[i]]
		}
		for i := range perBatch {
			tab[tb[i]+1]--
		}
	}
	b.StopTimer()
	blocks := float64(b.N * perBatch)
	b.ReportMetric(blocks/b.Elapsed().Seconds(), "stored-blocks/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/blocks, "ns/stored-block")
	if sink == 1 {
		b.Log(sink) // keeps the loads
	}
}

// BenchmarkClearWorker is what a sequence-keyed worker pays for having no
// engine map: clearing it (an engine restart, a resync, its removal)
// walks the block table. At 1M entries over 1,000 workers, one op clears
// one worker's 1,024 blocks and stores them again (one batch).
func BenchmarkClearWorker(b *testing.B) {
	for _, keying := range []struct {
		name     string
		seqKeyed bool
	}{{"engine-keyed", false}, {"seq-keyed", true}} {
		b.Run("entries=1M/"+keying.name, func(b *testing.B) {
			const window = 64
			wl := newApplyWorkload("worker", 1000, window, window, false, keying.seqKeyed)
			x := New(Config{})
			warmApply(x, wl)
			// One batch per worker storing everything it holds.
			refill := make([]kvevents.Batch, 1000)
			for i := range refill {
				refill[i] = kvevents.Batch{Worker: fmt.Sprintf("worker-%04d", i), Epoch: 1, SeqKeyed: keying.seqKeyed,
					Events: []kvevents.Event{{Kind: kvevents.KindStored}}}
				for r := 0; r < window; r++ {
					refill[i].Events[0].Blocks = append(refill[i].Events[0].Blocks, wl.batches[r*1000+i].Events[0].Blocks...)
				}
			}
			b.ResetTimer()
			for n := 0; n < b.N; n++ {
				bt := &refill[n%len(refill)]
				x.ClearWorker(bt.Key())
				x.ApplyBatch(uint64(n), bt)
			}
			b.StopTimer()
			if got := x.Stats().Entries; got != 1000*window*16 {
				b.Fatalf("%d entries after the clears, want %d", got, 1000*window*16)
			}
		})
	}
}

func warmApply(x *Index, wl *applyWorkload) {
	for i := 0; i < wl.warm; i++ {
		x.ApplyBatch(uint64(i), &wl.batches[i%len(wl.batches)])
	}
}

// lookupFixture is 1M distinct blocks over 1,000 workers (1,000 chains of
// 1,000 blocks, one per worker) plus the prompts the scenarios look up.
type lookupFixture struct {
	x       *Index
	prompts map[string][][]kvevents.SeqHash
}

var (
	fixtureOnce sync.Once
	fixture     *lookupFixture
)

func getLookupFixture() *lookupFixture {
	fixtureOnce.Do(func() {
		const nw, per = 1000, 1000
		x := New(Config{})
		f := &lookupFixture{x: x, prompts: map[string][][]kvevents.SeqHash{}}
		key := func(w int) workerref.Target { return workerref.Target{Worker: fmt.Sprintf("worker-%04d", w)} }
		store := func(w int, hs []kvevents.SeqHash) {
			ev := kvevents.Event{Kind: kvevents.KindStored}
			for _, h := range hs {
				ev.Blocks = append(ev.Blocks, kvevents.StoredBlock{Engine: kvevents.EngineHash(h) ^ 1, Seq: h})
			}
			k := key(w)
			x.ApplyBatch(0, &kvevents.Batch{Worker: k.Worker, Events: []kvevents.Event{ev}})
		}
		for w := 0; w < nw; w++ {
			hs := make([]kvevents.SeqHash, per)
			for i := range hs {
				hs[i] = seqOf(uint64(w)+1000, uint64(i))
			}
			store(w, hs)
		}
		prompt := func(ns uint64) []kvevents.SeqHash {
			hs := make([]kvevents.SeqHash, 128)
			for i := range hs {
				hs[i] = seqOf(ns, uint64(i))
			}
			return hs
		}
		// hit-1: one worker holds the whole prompt.
		p := prompt(1)
		store(7, p)
		f.prompts["hit1"] = [][]kvevents.SeqHash{p}
		// hit-8: eight workers hold prefixes of 16, 32, ..., 128 blocks.
		p = prompt(2)
		for i := 0; i < 8; i++ {
			store(100+i, p[:16*(i+1)])
		}
		f.prompts["hit8"] = [][]kvevents.SeqHash{p}
		// shared1000: all 1,000 workers hold the first 8 blocks (a system
		// prompt), four of them the whole prompt.
		p = prompt(3)
		for w := 0; w < nw; w++ {
			n := 8
			if w%250 == 0 {
				n = 128
			}
			store(w, p[:n])
		}
		f.prompts["shared1000"] = [][]kvevents.SeqHash{p}
		// miss: nobody holds the first block.
		f.prompts["miss"] = [][]kvevents.SeqHash{prompt(4)}
		// cold: 1,024 different fully held prompts, looked up in turn, so
		// the table lines are not in cache.
		var cold [][]kvevents.SeqHash
		for i := 0; i < 1024; i++ {
			p := prompt(uint64(10 + i))
			store(i%nw, p)
			cold = append(cold, p)
		}
		f.prompts["cold-hit1"] = cold
		fixture = f
	})
	return fixture
}

// BenchmarkLookup looks up a 128-block prompt against 1M indexed blocks
// over 1,000 workers (about 1.01M blocks, 1.14M entries in all).
func BenchmarkLookup(b *testing.B) {
	f := getLookupFixture()
	for _, sc := range []string{"hit1", "hit8", "shared1000", "miss", "cold-hit1"} {
		b.Run(sc, func(b *testing.B) {
			ps := f.prompts[sc]
			var out Overlaps
			f.x.Lookup(ps[0], LookupOptions{}, &out)
			matched := out.Total
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := threadCPU()
			for i := 0; i < b.N; i++ {
				f.x.Lookup(ps[i%len(ps)], LookupOptions{}, &out)
			}
			cpu := threadCPU() - cpu0
			b.StopTimer()
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
			if matched > 0 {
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(matched), "ns/matched-block")
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/float64(matched), "cpu-ns/matched-block")
			}
		})
	}
}

// BenchmarkLookupParallel runs lookups on every P while one goroutine
// applies batches (1,000 workers, steady state), to show readers neither
// block on writers nor on each other.
func BenchmarkLookupParallel(b *testing.B) {
	f := getLookupFixture()
	p := f.prompts["hit8"][0]
	wl := newApplyWorkload("applier", 200, 8, 16, false, false)
	x := f.x
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	var applied int
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				applied = i
				return
			default:
			}
			x.ApplyBatch(0, &wl.batches[i%len(wl.batches)])
			if i%64 == 0 {
				runtime.Gosched()
			}
		}
	}()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var out Overlaps
		for pb.Next() {
			x.Lookup(p, LookupOptions{}, &out)
		}
	})
	b.StopTimer()
	close(stop)
	wg.Wait()
	// leave the shared fixture as it was: remove the writer's workers
	for w := 0; w < 200; w++ {
		x.RemoveWorker(fmt.Sprintf("applier-%04d", w))
	}
	b.ReportMetric(float64(applied)/b.Elapsed().Seconds(), "batches/s")
}

// rwIndex is the design alternative BenchmarkReadPath compares against: a
// sharded Go map per shard behind a sync.RWMutex, holding (like the inline
// case) the worker slots of a block in one word. Its lookup takes a read
// lock per block.
type rwIndex struct {
	shards [256]struct {
		mu sync.RWMutex
		m  map[uint64]uint64
		_  [32]byte
	}
}

func newRWIndex() *rwIndex {
	r := &rwIndex{}
	for i := range r.shards {
		r.shards[i].m = map[uint64]uint64{}
	}
	return r
}

func (r *rwIndex) put(k, v uint64) {
	sh := &r.shards[mix(k)>>56]
	sh.mu.Lock()
	sh.m[k] = v
	sh.mu.Unlock()
}

func (r *rwIndex) del(k uint64) {
	sh := &r.shards[mix(k)>>56]
	sh.mu.Lock()
	delete(sh.m, k)
	sh.mu.Unlock()
}

// depth returns how many leading hashes hold slot+1 in field 0.
func (r *rwIndex) depth(hs []kvevents.SeqHash, slot uint64) int {
	for i, h := range hs {
		sh := &r.shards[mix(uint64(h))>>56]
		sh.mu.RLock()
		v, ok := sh.m[uint64(h)]
		sh.mu.RUnlock()
		if !ok || v&fieldMask != slot+1 {
			return i
		}
	}
	return len(hs)
}

// BenchmarkReadPath justifies the read path: lookups of a 128-block prompt
// held by one worker, on 2 goroutines (RunParallel on this 2-core VM),
// while a writer goroutine inserts and deletes other blocks as fast as it
// can, against (a) this index (lock-free reads) and (b) rwIndex (sharded
// map + RWMutex per shard, the obvious alternative). The rwIndex lookup
// does strictly less work (no sets, no results), so what it loses is
// the locks: one read-lock pair per block, whose shared counters bounce
// between the readers' cores and queue behind the writer.
func BenchmarkReadPath(b *testing.B) {
	prompt := make([]kvevents.SeqHash, 128)
	for i := range prompt {
		prompt[i] = seqOf(77, uint64(i))
	}
	const background = 200000
	run := func(b *testing.B, lookup func([]kvevents.SeqHash) int, write func(i int)) {
		b.Run("1-reader", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if lookup(prompt) != 128 {
					panic("lost the prompt")
				}
			}
		})
		b.Run("2-readers+writer", func(b *testing.B) { runContended(b, prompt, lookup, write) })
	}
	b.Run("lockfree-index", func(b *testing.B) {
		x := New(Config{})
		ev := kvevents.Event{Kind: kvevents.KindStored}
		for _, h := range prompt {
			ev.Blocks = append(ev.Blocks, kvevents.StoredBlock{Engine: kvevents.EngineHash(h), Seq: h})
		}
		x.ApplyBatch(0, &kvevents.Batch{Worker: "p", Events: []kvevents.Event{ev}})
		var bg kvevents.Event
		bg.Kind = kvevents.KindStored
		for i := 0; i < background; i++ {
			bg.Blocks = append(bg.Blocks, kvevents.StoredBlock{Engine: engOf(5, uint64(i)), Seq: seqOf(5, uint64(i))})
		}
		x.ApplyBatch(0, &kvevents.Batch{Worker: "w", Events: []kvevents.Event{bg}})
		k := workerref.Target{Worker: "p"}
		var pool sync.Pool
		pool.New = func() any { return new(Overlaps) }
		st := kvevents.Batch{Worker: "w", Events: []kvevents.Event{{Kind: kvevents.KindStored, Blocks: make([]kvevents.StoredBlock, 1)}}}
		rm := kvevents.Batch{Worker: "w", Events: []kvevents.Event{{Kind: kvevents.KindRemoved, Removed: make([]kvevents.EngineHash, 1)}}}
		run(b, func(hs []kvevents.SeqHash) int {
			out := pool.Get().(*Overlaps)
			x.Lookup(hs, LookupOptions{}, out)
			d := out.Get(k)
			pool.Put(out)
			return d
		}, func(i int) {
			n := uint64(background + i)
			st.Events[0].Blocks[0] = kvevents.StoredBlock{Engine: engOf(5, n), Seq: seqOf(5, n)}
			x.ApplyBatch(0, &st)
			rm.Events[0].Removed[0] = engOf(5, n-background)
			x.ApplyBatch(0, &rm)
		})
	})
	b.Run("rwmutex-map", func(b *testing.B) {
		r := newRWIndex()
		for _, h := range prompt {
			r.put(uint64(h), 1)
		}
		for i := 0; i < background; i++ {
			r.put(uint64(seqOf(5, uint64(i))), 2)
		}
		run(b, func(hs []kvevents.SeqHash) int { return r.depth(hs, 0) }, func(i int) {
			n := uint64(background + i)
			r.put(uint64(seqOf(5, n)), 2)
			r.del(uint64(seqOf(5, n-background)))
		})
	})
}

func runContended(b *testing.B, prompt []kvevents.SeqHash, lookup func([]kvevents.SeqHash) int, write func(i int)) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writes int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				writes = i
				return
			default:
			}
			write(i)
		}
	}()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if lookup(prompt) != 128 {
				panic("lost the prompt")
			}
		}
	})
	b.StopTimer()
	close(stop)
	wg.Wait()
	b.ReportMetric(float64(writes)/b.Elapsed().Seconds(), "writes/s")
}

// BenchmarkMemoryPerEntry measures the heap an index really holds per
// (block, worker) entry (after GC, HeapAlloc before and after building),
// next to what Stats estimates. 1,000 workers × 1,000 blocks.
func BenchmarkMemoryPerEntry(b *testing.B) {
	for _, sc := range []struct {
		name    string
		sharing int // workers holding each block
	}{{"1-worker-per-block", 1}, {"8-workers-per-block", 8}, {"64-workers-per-block", 64}} {
		b.Run(sc.name, func(b *testing.B) {
			const nw, per = 1000, 1000
			for i := 0; i < b.N; i++ {
				var m0, m1 runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&m0)
				x := New(Config{})
				ev := kvevents.Event{Kind: kvevents.KindStored, Blocks: make([]kvevents.StoredBlock, per)}
				for w := 0; w < nw; w++ {
					ns := uint64(w / sc.sharing)
					for j := range ev.Blocks {
						ev.Blocks[j] = kvevents.StoredBlock{Engine: engOf(ns, uint64(j)), Seq: seqOf(ns, uint64(j))}
					}
					x.ApplyBatch(0, &kvevents.Batch{Worker: fmt.Sprintf("worker-%04d", w), Events: []kvevents.Event{ev}})
				}
				runtime.GC()
				runtime.ReadMemStats(&m1)
				st := x.Stats()
				b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/float64(st.Entries), "heap-B/entry")
				b.ReportMetric(st.BytesPerEntry, "stats-B/entry")
				b.ReportMetric(float64(st.Entries), "entries")
				runtime.KeepAlive(x)
			}
		})
	}
}

// BenchmarkApprox measures the decision-fed indexes on the routing path:
// Record of a 128-block prompt for one of 1,000 workers (the first 64
// blocks a system prompt every worker already has: TTL refreshes) and a
// Lookup of a prompt, one Record per simulated millisecond.
//
//   - approx: TTL 120 s, default cap 2^20: ~0.9M live entries, so every
//     Record also evicts about as many entries as it adds (prune to 80 %).
//   - predicted: TTL 5 s: ~320k live entries, every Record expires about
//     as many as it adds.
func BenchmarkApprox(b *testing.B) {
	for _, sc := range []struct {
		name string
		ttl  time.Duration
	}{{"approx", 120 * time.Second}, {"predicted", DefaultPredictedTTL}} {
		b.Run(sc.name, func(b *testing.B) { benchApprox(b, sc.ttl) })
	}
}

func benchApprox(b *testing.B, ttl time.Duration) {
	clk := testutil.NewClock(time.Unix(0, 0))
	a := NewApprox(ApproxConfig{TTL: ttl, Clock: clk.Now})
	prompts := make([][]kvevents.SeqHash, 4096)
	for i := range prompts {
		hs := make([]kvevents.SeqHash, 128)
		for j := range hs {
			if j < 64 {
				hs[j] = seqOf(1, uint64(j)) // shared system prompt
			} else {
				hs[j] = seqOf(uint64(i)+2, uint64(j))
			}
		}
		prompts[i] = hs
	}
	keys := make([]workerref.Target, 1000)
	for i := range keys {
		keys[i] = workerref.Target{Worker: fmt.Sprintf("worker-%04d", i)}
	}
	for i := 0; i < 16384; i++ {
		a.Record(keys[i%1000], prompts[i%len(prompts)], clk.Now())
		clk.Advance(time.Millisecond)
	}
	b.Run("record", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			a.Record(keys[i%1000], prompts[i%len(prompts)], clk.Now())
			clk.Advance(time.Millisecond)
		}
		b.ReportMetric(float64(a.Stats().Entries), "entries")
	})
	b.Run("lookup", func(b *testing.B) {
		var out Overlaps
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			a.Lookup(prompts[i%len(prompts)], LookupOptions{}, &out)
		}
	})
}

// BenchmarkPredictedLookup looks up prompts in a predicted index with 8
// workers, each prompt recorded for one or two of them, in a random order:
//
//   - blocks=128: shaped like a replica's under BenchmarkRouteNATS: 4,096
//     prompts of 128 blocks, half of them behind one of 16 shared
//     64-block prefixes (about 400k entries, out of the cache);
//   - blocks=12500: 64 prompts of 200k tokens at 16 tokens per block,
//     half of them sharing their first half (about 600k entries).
//
// "bisect" is Approx.Lookup; "scan" is the block-by-block Index.Lookup of
// the same table, the cost before the bisection.
func BenchmarkPredictedLookup(b *testing.B) {
	for _, sh := range []struct{ prompts, blocks int }{{4096, 128}, {64, 12500}} {
		a, prompts := predictedFixture(sh.prompts, sh.blocks)
		order := rand.New(rand.NewPCG(7, 8)).Perm(len(prompts))
		for _, sc := range []struct {
			name   string
			lookup func([]kvevents.SeqHash, LookupOptions, *Overlaps)
		}{{"bisect", a.Lookup}, {"scan", a.idx.Lookup}} {
			b.Run(fmt.Sprintf("blocks=%d/%s", sh.blocks, sc.name), func(b *testing.B) {
				var out Overlaps
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					sc.lookup(prompts[order[i%len(order)]], LookupOptions{}, &out)
				}
			})
		}
	}
}

// predictedFixture records n prompts of the given blocks, half of them
// behind one of 16 shared prefixes of half their length, each for one or
// two of 8 workers.
func predictedFixture(n, blocks int) (*Approx, [][]kvevents.SeqHash) {
	clk := testutil.NewClock(time.Unix(0, 0))
	a := NewApprox(ApproxConfig{TTL: time.Hour, Clock: clk.Now})
	r := rand.New(rand.NewPCG(5, 6))
	prompts := make([][]kvevents.SeqHash, n)
	for i := range prompts {
		hs := make([]kvevents.SeqHash, blocks)
		shared := i%2 == 0
		prefix := uint64(r.IntN(16))
		for j := range hs {
			if shared && j < blocks/2 {
				hs[j] = seqOf(prefix+1, uint64(j))
			} else {
				hs[j] = seqOf(uint64(i)+100, uint64(j))
			}
		}
		prompts[i] = hs
		for range 1 + r.IntN(2) {
			a.Record(workerref.Target{Worker: fmt.Sprintf("w%d", r.IntN(8))}, hs, clk.Now())
		}
	}
	return a, prompts
}
