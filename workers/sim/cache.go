package sim

import (
	"fmt"
	"slices"

	"github.com/kvrouter/kvrouter/kvevents"
)

const nilBlock int32 = -1

// block is one physical KV block of a rank.
type block struct {
	hash       kvevents.SeqHash // valid when cached
	parent     kvevents.SeqHash // hash of the block before it in its sequence, when depth > 0
	depth      int32            // position in its sequence (0 = first block)
	cached     bool             // registered in byHash: full, hashed, reusable by prefix
	ref        int32            // running requests holding it
	prev, next int32            // LRU links, valid while cached && ref == 0
}

// kvCache is a vLLM-style block pool with prefix caching:
//
//   - a block is free-empty (never filled or not reusable), cached (full,
//     registered under its sequence hash) or held (ref > 0) by running
//     requests, possibly several sharing a prefix;
//   - cached blocks nobody holds sit in an LRU list; they stay reusable until
//     a new allocation needs their memory. Allocation takes free-empty blocks
//     first, then evicts the least recently released cached block and reports
//     its hash;
//   - a held block is never evicted.
//
// Requests release their blocks last-to-first, so within a released chain the
// tail is older in the LRU than its parent and is evicted first: the cache
// never holds a block whose parent it has evicted.
//
// One sequence hash maps to at most one block. When a request fills a block
// whose hash another request has just cached, it adopts the cached block and
// frees its own (see core.register), so events never announce a hash twice.
//
// Not safe for concurrent use; the rank's core lock guards it.
type kvCache struct {
	blocks   []block
	free     []int32 // free-empty blocks, used as a stack
	lruHead  int32   // oldest released cached block (evicted first)
	lruTail  int32
	lruLen   int
	byHash   map[kvevents.SeqHash]int32
	evicted  []kvevents.SeqHash // hashes evicted since the caller last took them
	nEvicted uint64
}

func newKVCache(n int) *kvCache {
	c := &kvCache{
		blocks:  make([]block, n),
		free:    make([]int32, n),
		lruHead: nilBlock,
		lruTail: nilBlock,
		byHash:  make(map[kvevents.SeqHash]int32),
	}
	// Pop from the end: block 0 is handed out first.
	for i := range c.free {
		c.free[i] = int32(n - 1 - i)
	}
	return c
}

func (c *kvCache) total() int { return len(c.blocks) }

// available is how many blocks an allocation can get: free-empty plus
// evictable cached blocks.
func (c *kvCache) available() int { return len(c.free) + c.lruLen }

// active is the number of blocks held by running requests.
func (c *kvCache) active() int { return len(c.blocks) - c.available() }

// lookup returns the block caching h.
func (c *kvCache) lookup(h kvevents.SeqHash) (int32, bool) {
	b, ok := c.byHash[h]
	return b, ok
}

// evictable reports whether block b sits in the LRU (cached, unheld).
func (c *kvCache) evictable(b int32) bool {
	blk := &c.blocks[b]
	return blk.cached && blk.ref == 0
}

// acquire takes a reference on block b (a prefix hit or an adopted block).
func (c *kvCache) acquire(b int32) {
	blk := &c.blocks[b]
	if blk.ref == 0 && blk.cached {
		c.lruRemove(b)
	}
	blk.ref++
}

// allocate returns a block for new content, with one reference. The caller
// has checked available() > 0. An evicted hash is appended to c.evicted.
func (c *kvCache) allocate() int32 {
	var b int32
	if n := len(c.free); n > 0 {
		b = c.free[n-1]
		c.free = c.free[:n-1]
	} else {
		b = c.lruHead
		c.lruRemove(b)
		blk := &c.blocks[b]
		delete(c.byHash, blk.hash)
		c.evicted = append(c.evicted, blk.hash)
		c.nEvicted++
		blk.cached = false
		blk.hash = 0
	}
	c.blocks[b].ref = 1
	return b
}

// register makes held block b the cached block of h, the depth-th block
// of its sequence, whose previous block is parent. The caller has checked
// that h is not cached yet.
func (c *kvCache) register(b int32, h, parent kvevents.SeqHash, depth int) {
	blk := &c.blocks[b]
	blk.hash = h
	blk.parent = parent
	blk.depth = int32(depth)
	blk.cached = true
	c.byHash[h] = b
}

// release drops one reference on b. An unheld cached block goes to the
// LRU's most-recent end; an unheld uncached one becomes free-empty.
func (c *kvCache) release(b int32) {
	blk := &c.blocks[b]
	blk.ref--
	if blk.ref > 0 {
		return
	}
	if blk.cached {
		c.lruPush(b)
		return
	}
	c.free = append(c.free, b)
}

// releaseChain releases a request's blocks last to first (see kvCache).
func (c *kvCache) releaseChain(bs []int32) {
	for i := len(bs) - 1; i >= 0; i-- {
		c.release(bs[i])
	}
}

// takeEvicted returns the hashes evicted since the last call, reusing dst.
func (c *kvCache) takeEvicted(dst []kvevents.SeqHash) []kvevents.SeqHash {
	dst = append(dst[:0], c.evicted...)
	c.evicted = c.evicted[:0]
	return dst
}

// hashes returns every cached hash, sorted.
func (c *kvCache) hashes() []kvevents.SeqHash {
	out := make([]kvevents.SeqHash, 0, len(c.byHash))
	for h := range c.byHash {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

func (c *kvCache) lruPush(b int32) {
	blk := &c.blocks[b]
	blk.prev, blk.next = c.lruTail, nilBlock
	if c.lruTail != nilBlock {
		c.blocks[c.lruTail].next = b
	} else {
		c.lruHead = b
	}
	c.lruTail = b
	c.lruLen++
}

func (c *kvCache) lruRemove(b int32) {
	blk := &c.blocks[b]
	if blk.prev != nilBlock {
		c.blocks[blk.prev].next = blk.next
	} else {
		c.lruHead = blk.next
	}
	if blk.next != nilBlock {
		c.blocks[blk.next].prev = blk.prev
	} else {
		c.lruTail = blk.prev
	}
	blk.prev, blk.next = nilBlock, nilBlock
	c.lruLen--
}

// check verifies the pool's invariants (tests): counts add up, the LRU holds
// exactly the cached unheld blocks, and every cached block's parent is
// cached (eviction is leaf-first).
func (c *kvCache) check() error {
	inLRU := 0
	for b := c.lruHead; b != nilBlock; b = c.blocks[b].next {
		blk := &c.blocks[b]
		if !blk.cached || blk.ref != 0 {
			return fmt.Errorf("block %d in LRU: cached %v ref %d", b, blk.cached, blk.ref)
		}
		inLRU++
	}
	if inLRU != c.lruLen {
		return fmt.Errorf("LRU walk %d, length %d", inLRU, c.lruLen)
	}
	unheldCached := 0
	for i := range c.blocks {
		blk := &c.blocks[i]
		if blk.ref < 0 {
			return fmt.Errorf("block %d ref %d", i, blk.ref)
		}
		if blk.cached && blk.ref == 0 {
			unheldCached++
		}
		if blk.cached && blk.depth > 0 {
			if _, ok := c.byHash[blk.parent]; !ok {
				return fmt.Errorf("block %d (depth %d) cached without its parent", i, blk.depth)
			}
		}
	}
	if unheldCached != c.lruLen {
		return fmt.Errorf("%d unheld cached blocks, %d in LRU", unheldCached, c.lruLen)
	}
	if len(c.byHash) > len(c.blocks) {
		return fmt.Errorf("%d hashes for %d blocks", len(c.byHash), len(c.blocks))
	}
	return nil
}
