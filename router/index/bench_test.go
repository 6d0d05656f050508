package index

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
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
type applyWorkload struct {
	batches []kvevents.Batch
	warm    int // batches to apply before timing (fills the window)
}

func newApplyWorkload(prefix string, nw, window, rounds int, shared bool) *applyWorkload {
	const per = 16
	wl := &applyWorkload{warm: nw * window}
	for r := 0; r < rounds; r++ {
		for w := 0; w < nw; w++ {
			b := kvevents.Batch{Worker: fmt.Sprintf("%s-%04d", prefix, w), Epoch: 1}
			st := kvevents.Event{Kind: kvevents.KindStored}
			for j := 0; j < per; j++ {
				n := uint64(r*per + j)
				ns := uint64(w)
				if shared {
					// Each block content is shared by 8 workers.
					ns = uint64(w / 8)
				}
				st.Blocks = append(st.Blocks, kvevents.StoredBlock{Engine: engOf(ns, n), Seq: seqOf(ns, n)})
			}
			if r > 0 {
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
					rm.Removed = append(rm.Removed, engOf(ns, n))
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
// time included.
func BenchmarkApply(b *testing.B) {
	for _, sc := range []struct {
		name   string
		window int
		shared bool
	}{
		{"entries=64k/unique", 4, false},
		{"entries=1M/unique", 64, false},
		{"entries=1M/shared8", 64, true},
	} {
		b.Run(sc.name, func(b *testing.B) {
			wl := newApplyWorkload("worker", 1000, sc.window, 2*sc.window, sc.shared)
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
		key := func(w int) kvevents.WorkerKey { return kvevents.WorkerKey{Worker: fmt.Sprintf("worker-%04d", w)} }
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
	wl := newApplyWorkload("applier", 200, 8, 16, false)
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
