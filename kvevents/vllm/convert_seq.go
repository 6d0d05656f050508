package vllm

import "github.com/kvrouter/kvrouter/kvevents"

// This file is the converter's sequence-keyed mode
// (ConverterConfig.SeqKeyed): the engine -> sequence map and the per
// (sequence hash, tier) counts stay here, and routers get plain set adds
// and removes (kvevents.Batch.SeqKeyed).
//
// Invariant: for every (s, t), counts[{s, t}] is the number of known
// entries with seq s and tier bit t, and routers hold (s, t) exactly when
// it is >= 1 (since the last KindCleared they were sent).

// RoutersCleared tells a SeqKeyed converter that its caller made routers
// drop every block of the engine (a KindCleared of its own, as the bridge
// sends when events were lost) although the engine may still hold them.
// The counts restart from zero, so a block the engine stores again is
// announced again, and the removal of one stored before is dropped
// (routers no longer hold it). The engine -> sequence map is kept: an
// engine hash names the same content for the engine's life, so a later
// child of a block stored before still gets its true sequence hashes.
// Without this, a block whose removal was among the lost events would
// count as held, and its next store would be a duplicate never announced.
// Engine-keyed converters keep everything (routers resolve removals
// themselves and take every store).
func (c *Converter) RoutersCleared() {
	if !c.cfg.SeqKeyed {
		return
	}
	clear(c.counts)
	for h, e := range c.known {
		if e.tiers != 0 {
			e.tiers = 0
			c.known[h] = e
		}
	}
}

// forget drops every block and count (none in engine-keyed mode): after
// it routers hold nothing.
func (c *Converter) forget() {
	clear(c.known)
	clear(c.counts)
}

// release takes one engine block off k's count and reports whether that
// was the last one (routers must drop k).
func (c *Converter) release(k seqTier) bool {
	n := c.counts[k]
	if n <= 1 {
		delete(c.counts, k)
		return n == 1
	}
	c.counts[k] = n - 1
	return false
}

// tierOf is the tier a block is counted under: the one its tierBit names.
func tierOf(t kvevents.Tier) kvevents.Tier { return min(t, 7) }

// storedSeq converts one BlockStored, appending to dst a Removed per tier
// that rebinding left empty, then a Stored of the blocks new to ev's tier
// (after a KindCleared when it resets the table).
func (c *Converter) storedSeq(ev *Event, dst []kvevents.Event) ([]kvevents.Event, error) {
	seed, err := c.hash(ev)
	if err != nil {
		return dst, err
	}
	c.stats.StoredBlocks += uint64(len(ev.BlockHashes))
	if len(c.known)+len(ev.BlockHashes) > c.cfg.MaxTracked {
		// A forgotten block's removal could never be translated: routers
		// drop the engine's blocks now rather than keep them for good.
		c.forget()
		c.stats.TableResets++
		dst = append(dst, kvevents.Event{Kind: kvevents.KindCleared})
	}
	tier := tierOf(ev.Tier)
	bit := tierBit(tier)
	start := len(c.blocks)
	c.lost = c.lost[:0]
	for j, h := range ev.BlockHashes {
		s := c.seqs[j]
		e, ok := c.known[h]
		switch {
		case ok && e.seq == s && e.tiers&bit != 0:
			c.stats.Duplicates++
			continue
		case ok && e.seq != s:
			// The engine reused the id for other content: the old
			// content leaves every tier this block held it on.
			c.stats.Rebound++
			c.unbind(e, tier, start)
			fallthrough
		case !ok:
			e = convEntry{seq: s, seed: seed}
		}
		e.tiers |= bit
		c.known[h] = e
		k := seqTier{s, tier}
		n := c.counts[k] + 1
		c.counts[k] = n
		if n == 1 {
			c.blocks = append(c.blocks, kvevents.StoredBlock{Seq: s})
		}
	}
	dst = c.appendLost(dst)
	if len(c.blocks) == start {
		c.stats.EmptyStored++
		return dst, nil
	}
	c.stats.SeqStored += uint64(len(c.blocks) - start)
	return append(dst, kvevents.Event{
		Kind: kvevents.KindStored, Tier: ev.Tier,
		Blocks: c.blocks[start:len(c.blocks):len(c.blocks)],
	}), nil
}

// unbind releases the old entry e of a rebound engine hash on each of its
// tiers, noting in c.lost what that leaves empty. A block this very event
// announced on tier (the same engine hash twice in one BlockStored) is
// taken back out of the pending Stored instead: the Removed events go
// first, so they could not undo it.
func (c *Converter) unbind(e convEntry, tier kvevents.Tier, start int) {
	for t := kvevents.Tier(0); e.tiers != 0; t++ {
		if e.tiers&(1<<t) == 0 {
			continue
		}
		e.tiers &^= 1 << t
		if !c.release(seqTier{e.seq, t}) {
			continue
		}
		if t == tier {
			if i := pendingIndex(c.blocks[start:], e.seq); i >= 0 {
				c.blocks = append(c.blocks[:start+i], c.blocks[start+i+1:]...)
				continue
			}
		}
		c.lost = append(c.lost, seqTier{e.seq, t})
	}
}

func pendingIndex(blocks []kvevents.StoredBlock, s kvevents.SeqHash) int {
	for i := range blocks {
		if blocks[i].Seq == s {
			return i
		}
	}
	return -1
}

// appendLost appends one Removed per tier of c.lost, tiers in order.
func (c *Converter) appendLost(dst []kvevents.Event) []kvevents.Event {
	if len(c.lost) == 0 {
		return dst
	}
	for t := range kvevents.Tier(8) {
		start := len(c.removed)
		for _, k := range c.lost {
			if k.tier == t {
				c.removed = append(c.removed, k.seq)
			}
		}
		if n := len(c.removed); n > start {
			c.stats.SeqRemoved += uint64(n - start)
			dst = append(dst, kvevents.Event{Kind: kvevents.KindRemoved, Tier: t, RemovedSeqs: c.removed[start:n:n]})
		}
	}
	return dst
}

// removedSeq converts one BlockRemoved: a Removed of the sequence hashes
// whose last engine block on ev's tier left, or nothing.
func (c *Converter) removedSeq(ev *Event, dst []kvevents.Event) []kvevents.Event {
	tier := tierOf(ev.Tier)
	bit := tierBit(tier)
	start := len(c.removed)
	for _, h := range ev.BlockHashes {
		e, ok := c.known[h]
		if !ok || e.tiers&bit == 0 {
			// Never announced on this tier (or not since RoutersCleared):
			// routers do not hold it.
			c.stats.UnknownRemoved++
			if ok && e.tiers == 0 {
				delete(c.known, h)
			}
			continue
		}
		if e.tiers &^= bit; e.tiers == 0 {
			delete(c.known, h)
		} else {
			c.known[h] = e
		}
		if c.release(seqTier{e.seq, tier}) {
			c.removed = append(c.removed, e.seq)
		}
	}
	c.stats.RemovedBlocks += uint64(len(ev.BlockHashes))
	n := len(c.removed)
	if n == start {
		c.stats.EmptyRemoved++
		return dst
	}
	c.stats.SeqRemoved += uint64(n - start)
	return append(dst, kvevents.Event{Kind: kvevents.KindRemoved, Tier: ev.Tier, RemovedSeqs: c.removed[start:n:n]})
}
