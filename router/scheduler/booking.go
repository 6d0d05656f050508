package scheduler

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// ErrExceedsCapacity is behind every *CapacityError.
var ErrExceedsCapacity = errors.New("scheduler: request exceeds the largest worker's KV capacity")

// CapacityError refuses a request that would book more KV blocks (prompt
// plus expected output) than the largest worker of the model holds: no
// worker could ever serve it, and its booking would block the fleet until
// it expired.
type CapacityError struct {
	Request        string
	Tokens         int   // prompt tokens
	ExpectedOutput int   // expected output tokens
	BlockSize      int   // tokens per block
	Blocks         int64 // KV blocks the request needs
	MaxBlocks      int64 // KV blocks of the largest worker
}

func (e *CapacityError) Error() string {
	return "request " + strconv.Quote(e.Request) + " needs " + strconv.FormatInt(e.Blocks, 10) + " KV blocks (" +
		strconv.Itoa(e.Tokens) + " prompt + " + strconv.Itoa(e.ExpectedOutput) + " expected output tokens at " +
		strconv.Itoa(e.BlockSize) + " per block); the largest worker holds " + strconv.FormatInt(e.MaxBlocks, 10) +
		" blocks (" + strconv.FormatInt(e.MaxBlocks*int64(e.BlockSize), 10) + " tokens)"
}

func (e *CapacityError) Unwrap() error { return ErrExceedsCapacity }

// checkCapacity refuses r when its prompt and expected output, in blocks
// (what book would charge), exceed the KV blocks of every live worker. A
// fleet with a worker of unknown capacity (KVBlocks 0), or none at all,
// refuses nothing here. It walks the live slots once: selection walks them
// anyway.
func (c *core) checkCapacity(r *Request) error {
	fl := c.fl
	largest := int64(0)
	for _, s := range fl.order {
		kv := fl.kvBlocks[s]
		if kv <= 0 {
			return nil
		}
		largest = max(largest, kv)
	}
	bs := int64(c.cfg.BlockSize)
	need := (int64(r.Tokens) + int64(r.ExpectedOutput) + bs - 1) / bs
	if largest == 0 || need <= largest {
		return nil
	}
	return &CapacityError{Request: r.ID, Tokens: r.Tokens, ExpectedOutput: r.ExpectedOutput, BlockSize: c.cfg.BlockSize,
		Blocks: need, MaxBlocks: largest}
}

// bookedOutput is the output tokens a booking of r counts as decode
// blocks: its expected output, unless the policy books prompt blocks only.
func (c *core) bookedOutput(r *Request) int64 {
	if c.noOutput {
		return 0
	}
	return int64(r.ExpectedOutput)
}

// booking is the load one admitted request holds on one worker.
type booking struct {
	id      string
	slot    int32
	key     workerref.Target
	attempt uint64
	prefill int64 // uncached prompt tokens, until prefill is done
	// pulled is a decode leg's uncached prompt tokens not charged as
	// prefill: its engine pulls them from the prefill leg's (serveWhole).
	pulled      int64
	private     int64 // decode blocks not named by a seq hash (partial block + output)
	hashes      []kvevents.SeqHash
	touched     time.Time // admission or prefill-done: the expiry clock
	prefillDone bool
}

func (b *booking) fence() Fence { return Fence{RequestID: b.id, Worker: b.key, Attempt: b.attempt} }

// holder is one worker holding a seq hash in its active bookings.
type holder struct {
	slot int32
	n    int32 // bookings on that worker naming the hash
}

type remoteKey struct{ replica, id string }

// remoteBooking is a booking another replica told us about. Its blocks are
// not deduplicated against ours (the event carries counts, not hashes), which
// errs towards counting too much.
type remoteBooking struct {
	slot        int32
	attempt     uint64
	prefill     int64
	blocks      int64
	at          time.Time
	prefillDone bool
}

// book records the predicted load of an admitted request on slot.
func (c *core) book(r *Request, slot int32, overlap int, now time.Time) *booking {
	c.attempt++
	bs := int64(c.cfg.BlockSize)
	tokens := int64(r.Tokens)
	uncached := max(0, tokens-int64(overlap)*bs)
	total := (tokens + c.bookedOutput(r) + bs - 1) / bs
	hashed := int64(len(r.SeqHashes))
	b := &booking{
		id: r.ID, slot: slot, key: c.fl.key[slot], attempt: c.attempt,
		prefill: uncached, private: max(0, total-hashed), touched: now,
	}
	if r.Leg == LegDecode && c.fl.flags[slot]&fDecodeOnly != 0 {
		// A decode engine pulls the prompt from the prefill leg's engine:
		// charging it as prefill here would hold decode legs in the queue
		// for prefill their worker never runs, while their prefill legs
		// wait for a prefill worker. A both worker keeps the charge until
		// the route splits: it may serve the request whole.
		b.prefill, b.pulled = 0, uncached
	}
	if n := len(c.hashPool); n > 0 {
		b.hashes = c.hashPool[n-1][:0]
		c.hashPool = c.hashPool[:n-1]
	}
	b.hashes = append(b.hashes, r.SeqHashes...)
	fl := c.fl
	fl.lDecode[slot] += c.holders.addAll(b.hashes, slot)
	fl.lDecode[slot] += b.private
	fl.lPrefill[slot] += b.prefill
	fl.lActive[slot]++
	fl.routed[slot] += max(0, hashed-int64(overlap))
	fl.refresh(slot, &c.th)
	c.bookings[b.id] = b
	c.stats.bookings.Add(1)
	c.emit(BookingEvent{Kind: BookingAdd, RequestID: b.id, Worker: b.key.Worker, Rank: b.key.Rank,
		Attempt: b.attempt, PrefillTokens: int(b.prefill), Blocks: int(hashed + b.private), At: now})
	return b
}

// release removes a booking's load; emitFree says whether other replicas
// must hear about it (false when the worker itself is gone).
func (c *core) release(b *booking, now time.Time, emitFree bool) {
	fl := c.fl
	live := fl.flags[b.slot]&fLive != 0 && fl.key[b.slot] == b.key
	if left := c.holders.decAll(b.hashes, b.slot); live {
		fl.lDecode[b.slot] -= left
	}
	if live {
		if !b.prefillDone {
			fl.lPrefill[b.slot] -= b.prefill
		}
		fl.lDecode[b.slot] -= b.private
		fl.lActive[b.slot]--
		fl.refresh(b.slot, &c.th)
	}
	delete(c.bookings, b.id)
	c.stats.bookings.Add(-1)
	if emitFree {
		c.emit(BookingEvent{Kind: BookingFree, RequestID: b.id, Worker: b.key.Worker, Rank: b.key.Rank,
			Attempt: b.attempt, At: now})
	}
	if cap(b.hashes) <= 4096 && len(c.hashPool) < 1024 {
		c.hashPool = append(c.hashPool, b.hashes[:0])
	}
	b.hashes = nil
}

// fenced returns the booking f names, or an error saying why not.
func (c *core) fenced(f Fence) (*booking, error) {
	b, ok := c.bookings[f.RequestID]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnknownBooking, f)
	}
	if b.attempt != f.Attempt || b.key != f.Worker {
		c.stats.staleFences.Add(1)
		return nil, fmt.Errorf("%w: %s (current %s)", ErrStaleFence, f, b.fence())
	}
	return b, nil
}

func (c *core) prefillDone(f Fence) error {
	b, err := c.fenced(f)
	if err != nil {
		return err
	}
	if b.prefillDone {
		return nil
	}
	now := c.cfg.Now()
	b.prefillDone = true
	b.touched = now
	c.fl.lPrefill[b.slot] -= b.prefill
	c.fl.refresh(b.slot, &c.th)
	c.emit(BookingEvent{Kind: BookingPrefillDone, RequestID: b.id, Worker: b.key.Worker, Rank: b.key.Rank,
		Attempt: b.attempt, At: now})
	c.pump()
	return nil
}

// serveWhole moves a decode leg's uncached prompt tokens onto its worker's
// prefill load (whole: the decode worker computes the prompt, a PD route's
// single-worker outcome) or off it (the route split: the decode engine
// pulls the prompt). Peers hear a repeated add of the same attempt with
// the new prefill tokens.
func (c *core) serveWhole(f Fence, whole bool) error {
	b, err := c.fenced(f)
	if err != nil {
		return err
	}
	if b.prefillDone {
		return nil
	}
	move := b.pulled
	if !whole {
		move = -b.prefill
	}
	if move == 0 {
		return nil
	}
	b.prefill += move
	b.pulled -= move
	c.fl.lPrefill[b.slot] += move
	c.fl.refresh(b.slot, &c.th)
	c.emit(BookingEvent{Kind: BookingAdd, RequestID: b.id, Worker: b.key.Worker, Rank: b.key.Rank,
		Attempt: b.attempt, PrefillTokens: int(b.prefill), Blocks: len(b.hashes) + int(b.private), At: c.cfg.Now()})
	if move < 0 {
		c.pump()
	}
	return nil
}

func (c *core) free(f Fence, rollback bool) error {
	b, err := c.fenced(f)
	if err != nil {
		return err
	}
	if rollback {
		c.stats.rollbacks.Add(1)
	}
	c.release(b, c.cfg.Now(), true)
	c.pump()
	return nil
}

func (c *core) emit(ev BookingEvent) {
	fn := c.onChange()
	if fn == nil {
		return
	}
	c.evSeq++
	ev.Replica = c.cfg.Replica
	ev.Seq = c.evSeq
	fn(ev)
}

// applyRemote folds another replica's booking change into the load view.
func (c *core) applyRemote(ev BookingEvent) error {
	if ev.Replica == c.cfg.Replica {
		c.stats.remoteEchoes.Add(1)
		return nil // our own echo
	}
	k := remoteKey{ev.Replica, ev.RequestID}
	rb, have := c.remote[k]
	fl := c.fl
	switch ev.Kind {
	case BookingAdd:
		slot := fl.lookup(ev.Worker, ev.Rank)
		if slot < 0 {
			c.stats.remoteIgnored.Add(1)
			return nil // a worker we do not know (yet): nothing to load
		}
		if have {
			if rb.attempt == ev.Attempt {
				c.remoteServeWhole(rb, ev)
				return nil // else a duplicate delivery
			}
			c.dropRemote(k, rb) // a newer attempt replaces the old one
		}
		if len(c.remote) >= c.cfg.MaxRemoteBookings {
			c.stats.remoteDropped.Add(1)
			return nil
		}
		at := c.cfg.Now()
		rb = &remoteBooking{slot: slot, attempt: ev.Attempt, prefill: int64(max(0, ev.PrefillTokens)),
			blocks: int64(max(0, ev.Blocks)), at: at}
		c.remote[k] = rb
		fl.rPrefill[slot] += rb.prefill
		fl.rDecode[slot] += rb.blocks
		fl.rActive[slot]++
		fl.refresh(slot, &c.th)
		c.stats.remoteBookings.Store(int64(len(c.remote)))
	case BookingPrefillDone:
		if !have || rb.attempt != ev.Attempt {
			c.stats.remoteIgnored.Add(1)
			return nil
		}
		if !rb.prefillDone {
			rb.prefillDone = true
			rb.at = c.cfg.Now()
			fl.rPrefill[rb.slot] -= rb.prefill
			fl.refresh(rb.slot, &c.th)
		}
	case BookingFree:
		if !have || rb.attempt != ev.Attempt {
			c.stats.remoteIgnored.Add(1)
			return nil
		}
		c.dropRemote(k, rb)
	}
	c.pump()
	return nil
}

// remoteServeWhole applies a repeated add of the same attempt: a peer's
// serveWhole moved a decode leg's prompt tokens onto or off its worker's
// prefill load (a duplicate delivery changes nothing).
func (c *core) remoteServeWhole(rb *remoteBooking, ev BookingEvent) {
	move := int64(max(0, ev.PrefillTokens)) - rb.prefill
	if rb.prefillDone || move == 0 {
		return
	}
	rb.prefill += move
	c.fl.rPrefill[rb.slot] += move
	c.fl.refresh(rb.slot, &c.th)
}

func (c *core) dropRemote(k remoteKey, rb *remoteBooking) {
	fl := c.fl
	if !rb.prefillDone {
		fl.rPrefill[rb.slot] -= rb.prefill
	}
	fl.rDecode[rb.slot] -= rb.blocks
	fl.rActive[rb.slot]--
	fl.refresh(rb.slot, &c.th)
	delete(c.remote, k)
	c.stats.remoteBookings.Store(int64(len(c.remote)))
}

// observeLoad turns a worker's own load report into a correction of the
// predicted load. The correction is an offset x = reported − booked, kept
// until the next report (or LoadReportTTL), and floored at −remote so that
// it can cancel remote bookings the worker does not see (a replica that
// died, a lost free) but never this replica's own bookings, which may be
// newer than the report. fleet.refresh applies it as local + max(0,
// remote + x), so it cannot push a load below zero once those remote
// bookings are gone.
func (c *core) observeLoad(rep LoadReport) {
	fl := c.fl
	s := fl.lookup(rep.Key.Worker, rep.Key.Rank)
	if s < 0 {
		c.stats.loadIgnored.Add(1)
		return
	}
	now := c.cfg.Now()
	at := rep.At
	if at.IsZero() {
		at = now
	}
	if at.Before(fl.lastRep[s]) {
		c.stats.loadIgnored.Add(1)
		return // an older report overtaken by a newer one
	}
	fl.lastRep[s] = at
	if rep.KVTotalBlocks > 0 {
		fl.kvBlocks[s] = int64(rep.KVTotalBlocks)
	}
	fl.xPrefill[s] = max(int64(rep.PrefillTokens)-fl.lPrefill[s]-fl.rPrefill[s], -fl.rPrefill[s])
	fl.xDecode[s] = max(int64(rep.KVUsedBlocks)-fl.lDecode[s]-fl.rDecode[s], -fl.rDecode[s])
	fl.xActive[s] = max(int32(rep.ActiveRequests+rep.WaitingRequests)-fl.lActive[s]-fl.rActive[s], -fl.rActive[s])
	fl.waiting[s] = int32(rep.WaitingRequests)
	fl.xAt[s] = now
	fl.refresh(s, &c.th)
	c.pump()
}

// guard expires vanished bookings, stale remote bookings and old load
// corrections, and rejects expired waiters.
func (c *core) guard(now time.Time) {
	for _, b := range c.bookings {
		if now.Sub(b.touched) >= c.cfg.BookingTTL {
			c.stats.expired.Add(1)
			c.cfg.Logger.Warn("scheduler: booking expired", "request", b.id, "worker", b.key.String(),
				"attempt", b.attempt, "age", now.Sub(b.touched))
			c.release(b, now, true)
		}
	}
	for k, rb := range c.remote {
		if now.Sub(rb.at) >= c.cfg.RemoteTTL {
			c.stats.remoteExpired.Add(1)
			c.dropRemote(k, rb)
		}
	}
	fl := c.fl
	for s := range fl.key {
		if !fl.xAt[s].IsZero() && now.Sub(fl.xAt[s]) >= c.cfg.LoadReportTTL {
			fl.xPrefill[s], fl.xDecode[s], fl.xActive[s] = 0, 0, 0
			fl.xAt[s] = time.Time{}
			fl.waiting[s] = 0
			fl.refresh(int32(s), &c.th)
		}
	}
	c.expireDeadlines(now)
	c.pump()
}
