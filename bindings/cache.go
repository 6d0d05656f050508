package bindings

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// cache is the replica's bounded view of the bucket, fed by a watch. It
// answers the commit protocol's first read without a round trip. It may lag
// the bucket (another replica's write not yet delivered); the protocol stays
// correct because every write is conditional on the revision read, and a
// lost write re-reads from the stream leader.
//
// Entries are keyed by the escaped KV key. A tombstone (delete, purge or
// expiry marker) is kept for a while so that a late write-through of an
// older read cannot resurrect the key, and so that a create can name the
// tombstone's revision as the expected last revision.
type cache struct {
	mu        sync.RWMutex
	m         map[string]readState
	max       int
	markerTTL time.Duration

	// incomplete is set once an entry has been evicted for room (or the
	// watch died): from then on a miss does not prove absence and Route
	// reads from the leader instead.
	incomplete atomic.Bool

	hits, misses, evictions atomic.Uint64
}

func newCache(max int, markerTTL time.Duration) *cache {
	return &cache{m: make(map[string]readState, min(max, 1024)), max: max, markerTTL: markerTTL}
}

// get returns the cached state of key. ok is false on a miss.
func (c *cache) get(key []byte) (readState, bool) {
	c.mu.RLock()
	st, ok := c.m[string(key)]
	c.mu.RUnlock()
	if ok {
		c.hits.Add(1)
	} else {
		c.misses.Add(1)
	}
	return st, ok
}

// getString is get for a key already held as a string.
func (c *cache) getString(key string) (readState, bool) {
	c.mu.RLock()
	st, ok := c.m[key]
	c.mu.RUnlock()
	return st, ok
}

// put stores st unless the cache already holds a newer revision of key.
func (c *cache) put(key string, st *readState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old, ok := c.m[key]
	if ok && old.rev > st.rev {
		return
	}
	if !ok && len(c.m) >= c.max {
		if !st.present {
			// A tombstone of a key we do not hold is not worth evicting
			// a live binding for.
			return
		}
		c.makeRoomLocked(time.Now())
	}
	c.m[key] = *st
}

// putRead stores the result of a leader read. A read that found nothing at
// all only clears a tombstone or an expired entry: the cache may already
// hold a newer write delivered by the watch.
func (c *cache) putRead(key string, st *readState) {
	if st.rev == 0 {
		c.mu.Lock()
		if old, ok := c.m[key]; ok && (!old.present || !old.live(time.Now())) {
			delete(c.m, key)
		}
		c.mu.Unlock()
		return
	}
	c.put(key, st)
}

// apply folds one watch entry into the cache.
func (c *cache) apply(e jetstream.KeyValueEntry) {
	key := e.Key()
	switch e.Operation() {
	case jetstream.KeyValuePut:
		// Our own writes come back through the watch: they are already
		// cached (written through), so skip decoding them again and only
		// take the server's storage time, from which the TTL runs.
		c.mu.Lock()
		if old, ok := c.m[key]; ok && old.rev >= e.Revision() {
			if old.rev == e.Revision() && old.present {
				old.storedAt = e.Created()
				c.m[key] = old
			}
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		st := stateFromValue(key, e.Revision(), e.Value(), e.Created())
		c.put(key, &st)
	default: // delete, purge, expiry marker
		c.put(key, &readState{rev: e.Revision(), storedAt: e.Created()})
	}
}

// makeRoomLocked drops one entry: an expired entry or an old tombstone if one
// of the first few looked at is, else an arbitrary one (then the cache no
// longer proves absence).
func (c *cache) makeRoomLocked(now time.Time) {
	n := 0
	var victim string
	for k, st := range c.m {
		if c.dead(&st, now) {
			delete(c.m, k)
			return
		}
		if n == 0 {
			victim = k
		}
		if n++; n >= 8 {
			break
		}
	}
	if n > 0 {
		delete(c.m, victim)
		c.evictions.Add(1)
		c.incomplete.Store(true)
	}
}

// dead reports whether an entry can leave: a value whose TTL ran out, or a
// tombstone older than the marker TTL (the server drops the marker then).
func (c *cache) dead(st *readState, now time.Time) bool {
	if st.present {
		return !st.live(now)
	}
	return now.Sub(st.storedAt) >= c.markerTTL
}

// sweep removes expired entries and old tombstones.
func (c *cache) sweep(now time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for k, st := range c.m {
		if c.dead(&st, now) {
			delete(c.m, k)
			n++
		}
	}
	return n
}

// reset empties the cache for a new watch: an entry the old one missed the
// removal of (its marker gone too) must not linger.
func (c *cache) reset() {
	c.mu.Lock()
	clear(c.m)
	c.incomplete.Store(false)
	c.mu.Unlock()
}

func (c *cache) len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.m)
}
