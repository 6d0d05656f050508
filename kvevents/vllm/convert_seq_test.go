package vllm

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
)

// seqEv is a sequence-keyed event as a router applies it: a Stored's
// sequence hashes or a Removed's RemovedSeqs (nil for a Cleared, whose
// tier routers ignore).
type seqEv struct {
	kind kvevents.EventKind
	tier kvevents.Tier
	seqs []kvevents.SeqHash
}

func (e seqEv) String() string { return fmt.Sprintf("%v %v %x", e.kind, e.tier, e.seqs) }

func stSeq(tier kvevents.Tier, s ...kvevents.SeqHash) seqEv {
	return seqEv{kvevents.KindStored, tier, s}
}
func rmSeq(tier kvevents.Tier, s ...kvevents.SeqHash) seqEv {
	return seqEv{kvevents.KindRemoved, tier, s}
}

var clSeq = seqEv{kind: kvevents.KindCleared}

// storedOn is a positional BlockStored (block size 4) on medium.
func storedOn(medium string, parent any, hashes []uint64, tokens ...[]uint32) []any {
	return []any{"BlockStored", u64s(hashes...), parent, toks(slices.Concat(tokens...)...), 4, nil, medium}
}

func removedOn(medium string, hashes ...uint64) []any {
	return []any{"BlockRemoved", u64s(hashes...), medium}
}

// convertSeqKeyed converts events with c and returns them as seqEvs,
// failing t if any is not a valid event of a sequence-keyed batch.
func convertSeqKeyed(t *testing.T, c *Converter, events ...any) ([]seqEv, error) {
	t.Helper()
	var vb Batch
	if err := DecodeBatch(mp(t, []any{0.0, events, 0}), &vb); err != nil {
		t.Fatal(err)
	}
	evs, err := c.Convert(&vb, nil)
	checkSeqKeyed(t, evs)
	out := make([]seqEv, 0, len(evs))
	for _, e := range evs {
		se := seqEv{kind: e.Kind, tier: e.Tier}
		switch e.Kind {
		case kvevents.KindStored:
			for _, b := range e.Blocks {
				se.seqs = append(se.seqs, b.Seq)
			}
		case kvevents.KindRemoved:
			se.seqs = append(se.seqs, e.RemovedSeqs...)
		case kvevents.KindCleared:
			se.tier = 0
		}
		out = append(out, se)
	}
	return out, err
}

// checkSeqKeyed fails t unless evs encode as a sequence-keyed batch and
// none is empty.
func checkSeqKeyed(t *testing.T, evs []kvevents.Event) {
	t.Helper()
	for i, e := range evs {
		if (e.Kind == kvevents.KindStored && len(e.Blocks) == 0) || (e.Kind == kvevents.KindRemoved && len(e.RemovedSeqs) == 0) {
			t.Fatalf("event %d is empty: %+v", i, e)
		}
	}
	if len(evs) == 0 {
		return
	}
	b := kvevents.Batch{Model: "m", Worker: "w", FirstEventID: 1, Events: evs, SeqKeyed: true}
	if _, err := kvevents.AppendBatch(nil, &b); err != nil {
		t.Fatalf("not a sequence-keyed batch: %v (%+v)", err, evs)
	}
}

func TestSeqKeyedConverter(t *testing.T) {
	seed := kvevents.SeedFor("", "")
	ta, tb, tc := vecTokens[:4], vecTokens[4:], []uint32{9, 9, 9, 9}
	root := func(tokens []uint32) kvevents.SeqHash { return kvevents.SeqHashes(nil, tokens, 4, seed)[0] }
	a, b, c := root(ta), root(tb), root(tc)
	ab := kvevents.SeqHashes(nil, vecTokens, 4, seed)[1] // tb chained after ta
	ba := kvevents.SeqHashesFrom(nil, b, ta, 4, seed)[0]
	dev, host := kvevents.TierDevice, kvevents.TierHost

	type step struct {
		cleared bool  // RoutersCleared before the events
		events  []any // one vLLM batch
		want    []seqEv
		err     error // errors.Is the returned error; nil = none
	}
	for _, tc := range []struct {
		name       string
		maxTracked int
		steps      []step
		stats      ConverterStats // its SeqKeyed counters and TableResets, compared
	}{
		{
			name: "duplicate store",
			steps: []step{
				{events: []any{storedOn("GPU", nil, []uint64{1}, ta)}, want: []seqEv{stSeq(dev, a)}},
				{events: []any{storedOn("GPU", nil, []uint64{1}, ta)}},
			},
			stats: ConverterStats{SeqStored: 1, Duplicates: 1, EmptyStored: 1},
		},
		{
			name: "two engine blocks of one sequence hash",
			steps: []step{
				{events: []any{storedOn("GPU", nil, []uint64{1}, ta)}, want: []seqEv{stSeq(dev, a)}},
				{events: []any{storedOn("GPU", nil, []uint64{2}, ta)}},
				{events: []any{removedOn("GPU", 1)}},
				{events: []any{removedOn("GPU", 2)}, want: []seqEv{rmSeq(dev, a)}},
			},
			stats: ConverterStats{SeqStored: 1, SeqRemoved: 1, EmptyStored: 1, EmptyRemoved: 1},
		},
		{
			name: "tiers counted separately",
			steps: []step{
				{events: []any{storedOn("GPU", nil, []uint64{1}, ta)}, want: []seqEv{stSeq(dev, a)}},
				{events: []any{storedOn("CPU", nil, []uint64{1}, ta)}, want: []seqEv{stSeq(host, a)}},
				{events: []any{storedOn("CPU", nil, []uint64{2}, ta)}},
				{events: []any{removedOn("GPU", 1)}, want: []seqEv{rmSeq(dev, a)}},
				{events: []any{removedOn("CPU", 1)}},
				{events: []any{removedOn("CPU", 2)}, want: []seqEv{rmSeq(host, a)}},
			},
			stats: ConverterStats{SeqStored: 2, SeqRemoved: 2, EmptyStored: 1, EmptyRemoved: 1},
		},
		{
			name: "rebound engine hash",
			steps: []step{
				{events: []any{storedOn("GPU", nil, []uint64{1}, ta), storedOn("CPU", nil, []uint64{1}, ta)},
					want: []seqEv{stSeq(dev, a), stSeq(host, a)}},
				{events: []any{storedOn("GPU", nil, []uint64{2}, ta)}},
				// Block 1 now holds tb: a leaves the host tier (its only
				// copy there) but not the device tier (block 2), before b
				// is stored.
				{events: []any{storedOn("GPU", nil, []uint64{1}, tb)}, want: []seqEv{rmSeq(host, a), stSeq(dev, b)}},
				{events: []any{removedOn("CPU", 1)}},
				{events: []any{removedOn("GPU", 2)}, want: []seqEv{rmSeq(dev, a)}},
				{events: []any{removedOn("GPU", 1)}, want: []seqEv{rmSeq(dev, b)}},
			},
			stats: ConverterStats{SeqStored: 3, SeqRemoved: 3, Rebound: 1, EmptyStored: 1, UnknownRemoved: 1, EmptyRemoved: 1},
		},
		{
			name: "rebound within one event",
			steps: []step{
				// The same engine hash twice: a is announced and taken back
				// by the rebinding in one event, so only ab is stored.
				{events: []any{storedOn("GPU", nil, []uint64{1, 1}, ta, tb)}, want: []seqEv{stSeq(dev, ab)}},
				{events: []any{removedOn("GPU", 1)}, want: []seqEv{rmSeq(dev, ab)}},
			},
			stats: ConverterStats{SeqStored: 1, SeqRemoved: 1, Rebound: 1},
		},
		{
			name: "rebound back to a sequence hash it left",
			steps: []step{
				{events: []any{storedOn("GPU", nil, []uint64{1}, ta)}, want: []seqEv{stSeq(dev, a)}},
				// Block 1 leaves a (removed first) and block 2 brings it back.
				{events: []any{storedOn("GPU", nil, []uint64{1, 2}, tb, ta)}, want: []seqEv{rmSeq(dev, a), stSeq(dev, b, ba)}},
			},
			stats: ConverterStats{SeqStored: 3, SeqRemoved: 1, Rebound: 1},
		},
		{
			name: "unknown removals",
			steps: []step{
				{events: []any{removedOn("GPU", 9)}},
				{events: []any{storedOn("CPU", nil, []uint64{1}, ta)}, want: []seqEv{stSeq(host, a)}},
				{events: []any{removedOn("GPU", 1, 9)}},
				{events: []any{removedOn("CPU", 1)}, want: []seqEv{rmSeq(host, a)}},
			},
			stats: ConverterStats{SeqStored: 1, SeqRemoved: 1, UnknownRemoved: 3, EmptyRemoved: 2},
		},
		{
			name: "clear forgets the counts",
			steps: []step{
				{events: []any{storedOn("GPU", nil, []uint64{1}, ta), storedOn("GPU", nil, []uint64{2}, tb)},
					want: []seqEv{stSeq(dev, a), stSeq(dev, b)}},
				{events: []any{[]any{"AllBlocksCleared"}}, want: []seqEv{clSeq}},
				{events: []any{storedOn("GPU", nil, []uint64{1}, ta), removedOn("GPU", 2)}, want: []seqEv{stSeq(dev, a)}},
			},
			stats: ConverterStats{SeqStored: 3, UnknownRemoved: 1, EmptyRemoved: 1},
		},
		{
			name: "child of a known block",
			steps: []step{
				{events: []any{storedOn("GPU", nil, []uint64{1}, ta)}, want: []seqEv{stSeq(dev, a)}},
				{events: []any{storedOn("GPU", uint64(1), []uint64{2}, tb)}, want: []seqEv{stSeq(dev, ab)}},
			},
			stats: ConverterStats{SeqStored: 2},
		},
		{
			name:       "table reset clears the routers",
			maxTracked: 2,
			steps: []step{
				{events: []any{storedOn("GPU", nil, []uint64{1}, ta)}, want: []seqEv{stSeq(dev, a)}},
				{events: []any{storedOn("GPU", nil, []uint64{2}, tb)}, want: []seqEv{stSeq(dev, b)}},
				{events: []any{storedOn("GPU", nil, []uint64{3}, tc)}, want: []seqEv{clSeq, stSeq(dev, c)}},
				{events: []any{removedOn("GPU", 1)}},
				{events: []any{storedOn("GPU", uint64(1), []uint64{4}, tb)}, err: ErrUnknownParent},
			},
			stats: ConverterStats{SeqStored: 3, TableResets: 1, UnknownRemoved: 1, EmptyRemoved: 1},
		},
		{
			name: "routers cleared by the caller",
			steps: []step{
				{events: []any{storedOn("GPU", nil, []uint64{1}, ta), storedOn("GPU", nil, []uint64{2}, tb)},
					want: []seqEv{stSeq(dev, a), stSeq(dev, b)}},
				// Stored again after the routers dropped it: announced again.
				{cleared: true, events: []any{storedOn("GPU", nil, []uint64{1}, ta)}, want: []seqEv{stSeq(dev, a)}},
				// 2 was never announced since: its removal is dropped.
				{events: []any{removedOn("GPU", 1, 2)}, want: []seqEv{rmSeq(dev, a)}},
				// ...but a child of a block from before still chains.
				{events: []any{storedOn("GPU", nil, []uint64{3}, tb), storedOn("GPU", uint64(3), []uint64{4}, ta)},
					want: []seqEv{stSeq(dev, b), stSeq(dev, ba)}},
			},
			stats: ConverterStats{SeqStored: 5, SeqRemoved: 1, UnknownRemoved: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conv, err := NewConverter(ConverterConfig{BlockSize: 4, MaxTracked: tc.maxTracked, SeqKeyed: true})
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range tc.steps {
				if st.cleared {
					conv.RoutersCleared()
				}
				got, err := convertSeqKeyed(t, conv, st.events...)
				if (st.err == nil && err != nil) || !errors.Is(err, st.err) {
					t.Fatalf("step %d: error %v, want %v", i, err, st.err)
				}
				if !slices.EqualFunc(got, st.want, func(x, y seqEv) bool {
					return x.kind == y.kind && x.tier == y.tier && slices.Equal(x.seqs, y.seqs)
				}) {
					t.Fatalf("step %d: got %v, want %v", i, got, st.want)
				}
			}
			s := conv.Stats()
			got := ConverterStats{SeqStored: s.SeqStored, SeqRemoved: s.SeqRemoved, Duplicates: s.Duplicates, Rebound: s.Rebound,
				EmptyStored: s.EmptyStored, EmptyRemoved: s.EmptyRemoved, UnknownRemoved: s.UnknownRemoved, TableResets: s.TableResets}
			if got != tc.stats {
				t.Errorf("stats %+v, want %+v", got, tc.stats)
			}
		})
	}
}

// RoutersCleared is a no-op for an engine-keyed converter: routers resolve
// its removals themselves.
func TestRoutersClearedEngineKeyed(t *testing.T) {
	c, _ := NewConverter(ConverterConfig{BlockSize: 4})
	if _, err := convert(t, c, storedEv(nil, []uint64{1}, vecTokens[:4])); err != nil {
		t.Fatal(err)
	}
	c.RoutersCleared()
	evs, err := convert(t, c, storedEv(nil, []uint64{1}, vecTokens[:4]), []any{"BlockRemoved", u64s(1)})
	if err != nil || len(evs) != 2 || evs[0].Blocks[0].Engine != 1 || evs[1].Removed[0] != 1 || c.Tracked() != 0 {
		t.Fatalf("got %+v, %v, tracked %d", evs, err, c.Tracked())
	}
}

// shadowBlock is what the engine holds under one engine hash, as far as the
// converter can know it.
type shadowBlock struct {
	seq   kvevents.SeqHash
	tiers uint8
}

// Random streams of vLLM events through a SeqKeyed converter, applied to a
// naive router (a set of (sequence hash, tier) per engine: Stored adds,
// Removed removes, Cleared empties). After every batch the router holds
// exactly the (sequence hash, tier) pairs of the engine blocks the
// converter tracks, computed from a naive shadow of the engine (engine
// hash -> sequence hash and tiers). The shadow forgets what a table reset
// forgets (MaxTracked is small: after a reset only what was stored since
// is expected), and what it holds at RoutersCleared counts as never
// announced. Every Stored names a pair the router does not hold and every
// Removed one it does.
func TestSeqKeyedMatchesShadowProperty(t *testing.T) {
	const maxTracked = 5
	seed := kvevents.SeedFor("", "")
	pool := [][]uint32{{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}}
	media := []string{"GPU", "CPU"}
	var total ConverterStats
	for run := range 40 {
		rng := rand.New(rand.NewPCG(uint64(run), 7))
		conv, _ := NewConverter(ConverterConfig{BlockSize: 4, MaxTracked: maxTracked, SeqKeyed: true})
		shadow := map[kvevents.EngineHash]shadowBlock{}
		router := map[seqTier]bool{}
		for step := range 300 {
			if rng.IntN(30) == 0 {
				// What the bridge does at a resync: a Cleared of its own.
				conv.RoutersCleared()
				clear(router)
				for h, b := range shadow {
					b.tiers = 0
					shadow[h] = b
				}
			}
			var events []any
			failed := false
			for range 1 + rng.IntN(3) {
				medium := media[rng.IntN(len(media))]
				bit := tierBit(mediumTier(medium))
				switch r := rng.IntN(100); {
				case r < 3:
					events = append(events, []any{"AllBlocksCleared"})
					clear(shadow)
				case r < 40:
					hs := make([]uint64, 1+rng.IntN(3))
					for i := range hs {
						hs[i] = 1 + uint64(rng.IntN(7)) // 7 is never stored
					}
					events = append(events, removedOn(medium, hs...))
					for _, h := range hs {
						eh := kvevents.EngineHash(h)
						if b, ok := shadow[eh]; ok {
							if b.tiers &^= bit; b.tiers == 0 {
								delete(shadow, eh)
							} else {
								shadow[eh] = b
							}
						}
					}
				default:
					hs := make([]uint64, 1+rng.IntN(3))
					var tokens []uint32
					for i := range hs {
						hs[i] = 1 + uint64(rng.IntN(6))
						tokens = append(tokens, pool[rng.IntN(len(pool))]...)
					}
					var parent any
					seqs := kvevents.SeqHashes(nil, tokens, 4, seed)
					if rng.IntN(4) == 0 {
						p := kvevents.EngineHash(1 + rng.IntN(7))
						parent = uint64(p)
						pb, ok := shadow[p]
						if !ok {
							failed = true // skipped: nothing changes
							events = append(events, storedOn(medium, parent, hs, tokens))
							continue
						}
						seqs = kvevents.SeqHashesFrom(nil, pb.seq, tokens, 4, seed)
					}
					events = append(events, storedOn(medium, parent, hs, tokens))
					if len(shadow)+len(hs) > maxTracked {
						clear(shadow)
					}
					for i, h := range hs {
						eh := kvevents.EngineHash(h)
						b, ok := shadow[eh]
						if !ok || b.seq != seqs[i] {
							b = shadowBlock{seq: seqs[i]}
						}
						b.tiers |= bit
						shadow[eh] = b
					}
				}
			}
			got, err := convertSeqKeyed(t, conv, events...)
			if failed != (err != nil) || (err != nil && !errors.Is(err, ErrUnknownParent)) {
				t.Fatalf("run %d step %d: error %v, a parent was unknown: %v", run, step, err, failed)
			}
			for _, e := range got {
				for _, s := range e.seqs {
					k := seqTier{s, e.tier}
					switch {
					case e.kind == kvevents.KindStored && router[k]:
						t.Fatalf("run %d step %d: %v stores %x, already held", run, step, e, s)
					case e.kind == kvevents.KindRemoved && !router[k]:
						t.Fatalf("run %d step %d: %v removes %x, not held", run, step, e, s)
					}
					router[k] = e.kind == kvevents.KindStored
					if !router[k] {
						delete(router, k)
					}
				}
				if e.kind == kvevents.KindCleared {
					clear(router)
				}
			}
			want := map[seqTier]bool{}
			for _, b := range shadow {
				for t := range kvevents.Tier(8) {
					if b.tiers&tierBit(t) != 0 {
						want[seqTier{b.seq, t}] = true
					}
				}
			}
			if !maps.Equal(router, want) {
				t.Fatalf("run %d step %d: after %v -> %v\nrouter %v\nwant   %v", run, step, events, got, router, want)
			}
			if conv.Tracked() != len(shadow) {
				t.Fatalf("run %d step %d: converter tracks %d blocks, shadow %d", run, step, conv.Tracked(), len(shadow))
			}
		}
		s := conv.Stats()
		total.TableResets += s.TableResets
		total.Rebound += s.Rebound
		total.Duplicates += s.Duplicates
		total.UnknownRemoved += s.UnknownRemoved
		total.EmptyStored += s.EmptyStored
		total.EmptyRemoved += s.EmptyRemoved
		total.UnknownParent += s.UnknownParent
		total.Clears += s.Clears
	}
	// The streams exercised every rule.
	if total.TableResets == 0 || total.Rebound == 0 || total.Duplicates == 0 || total.UnknownRemoved == 0 ||
		total.EmptyStored == 0 || total.EmptyRemoved == 0 || total.UnknownParent == 0 || total.Clears == 0 {
		t.Fatalf("a rule was never exercised: %+v", total)
	}
}

// A steady stream of stores and removals of the same blocks allocates
// nothing once the converter's buffers and maps have grown.
func TestSeqKeyedAllocs(t *testing.T) {
	stored := vllmStored16x16(t, false)
	hashes := make([]uint64, 16)
	for i := range hashes {
		hashes[i] = uint64(0x9e3779b97f4a7c15) * uint64(i+1)
	}
	removed := mp(t, []any{1700000000.5, []any{removedOn("GPU", hashes...)}, 0})
	var vb Batch
	conv, _ := NewConverter(ConverterConfig{BlockSize: 16, SeqKeyed: true})
	var out []kvevents.Event
	run := func() {
		for _, payload := range [][]byte{stored, removed} {
			if err := DecodeBatch(payload, &vb); err != nil {
				t.Fatal(err)
			}
			var err error
			if out, err = conv.Convert(&vb, out[:0]); err != nil || len(out) != 1 {
				t.Fatalf("%d events, %v", len(out), err)
			}
		}
	}
	run()
	if allocs := testing.AllocsPerRun(100, run); allocs > 0 {
		t.Fatalf("decoding and converting a store and a removal allocated %.1f times per run, want 0", allocs)
	}
	if len(out[0].RemovedSeqs) != 16 {
		t.Fatalf("last event %+v", out[0])
	}
}

// BenchmarkConvertChurn is the converter's steady state at 32,768 tracked
// engine blocks: one op converts a BlockStored of 16 new blocks (16 tokens
// each, hashed) and a BlockRemoved of the 16 stored 2,048 ops earlier. The
// seq-keyed case is what the bridge pays, once per engine, for routers to
// keep no engine map: the per-(sequence hash, tier) counts.
func BenchmarkConvertChurn(b *testing.B) {
	const per, window, rounds = 16, 2048, 4096
	batches := make([]Batch, rounds)
	for r := range batches {
		st := Event{Kind: kvevents.KindStored, BlockSize: 16, TokenIDs: make([]uint32, per*16)}
		for j := range per {
			st.BlockHashes = append(st.BlockHashes, kvevents.EngineHash(uint64(r*per+j+1)*0x9e3779b97f4a7c15))
		}
		for i := range st.TokenIDs {
			st.TokenIDs[i] = uint32(r*7919+i) % 151000
		}
		rm := Event{Kind: kvevents.KindRemoved}
		for j := range per {
			rm.BlockHashes = append(rm.BlockHashes, kvevents.EngineHash(uint64(((r-window+rounds)%rounds)*per+j+1)*0x9e3779b97f4a7c15))
		}
		batches[r].Events = []Event{st, rm}
	}
	for _, seqKeyed := range []bool{false, true} {
		b.Run(fmt.Sprintf("seq-keyed=%v", seqKeyed), func(b *testing.B) {
			conv, _ := NewConverter(ConverterConfig{BlockSize: 16, SeqKeyed: seqKeyed})
			var out []kvevents.Event
			for r := range rounds {
				out, _ = conv.Convert(&batches[r], out[:0])
			}
			b.ReportAllocs()
			b.ResetTimer()
			for n := 0; n < b.N; n++ {
				var err error
				if out, err = conv.Convert(&batches[n%rounds], out[:0]); err != nil || len(out) != 2 {
					b.Fatalf("%d events, %v", len(out), err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*per), "ns/stored-block")
		})
	}
}
