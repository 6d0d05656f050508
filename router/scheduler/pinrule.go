package scheduler

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/kvrouter/kvrouter/session"
	"github.com/kvrouter/kvrouter/workerref"
)

// pinPlan is the pin rule's verdict for one request: what limits its
// admission and its selection. The queue and selectWorker only execute it.
type pinPlan struct {
	// exact is an explicit pinned target: the only candidates, and the
	// queue lane the request waits in while that target is busy.
	exact *workerref.Target
	// hard confines selection to this target while it has an eligible row;
	// otherwise selection runs over the fleet (HardFallback).
	hard *workerref.Target
	// soft is handed to the policy as Context.Affinity.
	soft *workerref.Target
	// softOnFallback is the classifier's target when the request is Hard:
	// it is used only if the Hard target turns out to be ineligible.
	softOnFallback *workerref.Target
}

// applyPinRule is THE PIN RULE: the one place where a request's pin and
// affinity decide how it is admitted and which workers a policy may pick
// from. Every policy gets the same treatment; none handles Hard itself.
//
//  1. Hard: selection is limited to the bound target, for every policy,
//     while that target is eligible (known, rank registered, inside the
//     allowed set, available or draining, not overloaded): a draining
//     worker takes no new sessions and no unbound work but keeps serving
//     the Hard sessions bound to it until it departs. An ineligible target
//     selects normally (Decision.HardFallback); the host's commit then
//     re-binds or rejects. If the policy's own filters reject the bound
//     target, that counts as ineligible too.
//  2. Admission is not narrowed by Hard: a Hard request waits in the router
//     only when every eligible worker is busy, like any request, and
//     otherwise goes to its bound worker and queues there (plan.exact stays
//     nil, so the queue treats it as fleet-wide). A Hard request bound to a
//     draining worker that is not busy is admitted even when no available
//     worker is free (queue.go hardTargetDraining), so a drain never turns
//     its sessions' requests into no_eligible_worker.
//  3. Soft: the target reaches the policy as Context.Affinity. The default
//     policy keeps it while it is a candidate; custom policies receive the
//     full candidate set. A draining worker is not a candidate for Soft
//     work: its Soft sessions move (re-bind) elsewhere, which lets a drain
//     finish sooner.
//  4. A classifier's target is Soft: it replaces a Soft target but can
//     neither replace nor clear a Hard one (it is consulted only if the Hard
//     target is ineligible).
//  5. An explicit pinned target is exact (its eligible rows are the only
//     candidates; no classifier is consulted), has its own queue lane and
//     waits in the router while it is busy; a blocked lane never blocks
//     requests for other workers.
//  6. A pin and an affinity requirement (of either strength) that disagree
//     are rejected here, before selection, with ErrPinConflict. They agree
//     when they name the same worker and, where both name a rank, the same
//     rank (workerref.Target.Agrees, the rule the bindings table applies
//     too, so the host passes pin and binding through unchanged). An
//     agreeing pair is exact on the more specific of the two: a worker-only
//     pin with a ranked affinity is pinned to that rank, a ranked pin with a
//     worker-only affinity keeps the pin's rank. The affinity adds nothing
//     else (no Hard narrowing, no Soft preference, no classifier).
//
// selectWorker executes the plan at selection time; pump/canAdmit execute
// points 2 and 5 at admission.
func applyPinRule(r *Request, cls Classifier) (pinPlan, error) {
	var p pinPlan
	aff := r.Affinity
	if r.Pinned != nil {
		p.exact = r.Pinned // 5
		if aff != nil {
			if !r.Pinned.Agrees(aff.Target) { // 6
				return p, fmt.Errorf("%w: request %q pinned to %s but its %s affinity is %s",
					ErrPinConflict, r.ID, r.Pinned, aff.Mode, aff.Target)
			}
			if r.Pinned.AnyRank && !aff.Target.AnyRank {
				// 6: the more specific of two agreeing targets. Pointing
				// into the caller's Affinity (valid while it waits in
				// Schedule; lanes copy the target) keeps this allocation-free.
				p.exact = &aff.Target
			}
		}
		return p, nil
	}
	if aff != nil && aff.Mode == session.Hard {
		p.hard = &aff.Target // 1, 2
		if cls != nil {
			if t, ok := cls.Classify(r); ok {
				p.softOnFallback = &t // 4
			}
		}
		return p, nil
	}
	if aff != nil {
		p.soft = &aff.Target // 3
	}
	if cls != nil {
		if t, ok := cls.Classify(r); ok {
			p.soft = &t // 4: a classifier target is Soft and overrides a Soft one
		}
	}
	return p, nil
}

// selectWorker executes a request's pin plan (see applyPinRule): it builds
// the candidate set — the pinned target's eligible rows, or the Hard
// target's eligible rows, or the fleet's eligible rows — runs the policy and
// validates its choice. It books nothing.
func (c *core) selectWorker(w *waiter) (slot int32, overlap int, fellBack bool, err error) {
	c.prepare(w)
	slot, overlap, fellBack, err = c.runPinPlan(w)
	c.unprepare()
	return slot, overlap, fellBack, err
}

func (c *core) runPinPlan(w *waiter) (slot int32, overlap int, fellBack bool, err error) {
	x := c.context(w)
	p := &w.plan
	switch {
	case p.exact != nil:
		c.collectTarget(w, *p.exact)
	case p.hard != nil:
		c.collectBound(w, *p.hard)
		if c.cands.Len() > 0 {
			slot, overlap, err = c.runPolicy(x, nil)
			if !errors.Is(err, ErrNoCandidate) {
				return slot, overlap, false, err
			}
		}
		fellBack = true
		c.stats.hardFallbacks.Add(1)
		c.collectAll(w)
	default:
		c.collectAll(w)
	}
	if c.cands.Len() == 0 {
		return -1, 0, fellBack, fmt.Errorf("%w for request %q", ErrNoEligibleWorker, w.req.ID)
	}
	soft := p.soft
	if fellBack {
		soft = p.softOnFallback
	}
	slot, overlap, err = c.runPolicy(x, soft)
	return slot, overlap, fellBack, err
}

// runPolicy calls the policy over c.cands with an optional Soft target and
// validates the row it returns.
func (c *core) runPolicy(x *Context, soft *workerref.Target) (int32, int, error) {
	cs := &c.cands
	x.hasAff, cs.hasAff = false, false
	if soft != nil {
		x.aff, x.hasAff = *soft, true
		cs.aff, cs.hasAff = c.fl.resolve(*soft), true
	}
	c.seq[x.Request.Leg]++
	var i int
	var err error
	if c.defaultPolicy != nil {
		i, err = c.defaultPolicy.Select(x, cs) // builtin: no panic guard, no dynamic call
	} else {
		i, err = c.callPolicy(x, cs)
	}
	if err != nil {
		if !errors.Is(err, ErrNoCandidate) {
			c.stats.policyErrors.Add(1)
		}
		return -1, 0, fmt.Errorf("policy %s: %w", c.policy.Name(), err)
	}
	if i < 0 || i >= cs.Len() {
		c.stats.policyErrors.Add(1)
		return -1, 0, fmt.Errorf("%w: policy %s chose row %d of %d", ErrPolicy, c.policy.Name(), i, cs.Len())
	}
	slot, overlap := cs.slots[i], int(cs.ovAt(cs.slots[i]))
	if x.Request.Leg != LegDecode { // a decode leg's overlap is a transfer, not a hit
		c.share.note(overlap, x.RequestBlocks)
		c.held.note(x.held)
		c.stats.uncachedShare.Store(math.Float64bits(1 - c.share.value()))
	}
	return slot, overlap, nil
}

// blocks is n / BlockSize, by shift when the block size is a power of two
// (it always is in practice; a division costs more than a selection over
// two workers).
func (c *core) blocks(n int64) int64 {
	if c.bsShift >= 0 {
		return n >> c.bsShift
	}
	return n / int64(c.cfg.BlockSize)
}

// callPolicy runs the policy, turning a panic in it (a custom policy's bug)
// into ErrPolicy for this request instead of a crashed caller holding the
// scheduler's lock.
func (c *core) callPolicy(x *Context, cs *Candidates) (i int, err error) {
	defer func() {
		if p := recover(); p != nil {
			c.cfg.Logger.Error("scheduler: policy panicked", "policy", c.policy.Name(), "panic", fmt.Sprint(p))
			i, err = -1, fmt.Errorf("%w: policy %s panicked: %v", ErrPolicy, c.policy.Name(), p)
		}
	}()
	return c.policy.Select(x, cs)
}

// context fills the reusable selection context for w.
func (c *core) context(w *waiter) *Context {
	x := &c.x
	r := w.req
	x.Request = r
	x.BlockSize = c.cfg.BlockSize
	x.invBS = c.invBS
	x.RequestBlocks = len(r.SeqHashes)
	x.PromptTokens = r.Tokens
	x.Seq = c.seq[r.Leg]
	x.CachedShare = c.share.value()
	x.HeldShare, x.held = c.held.v, w.held
	x.rng = &c.rng
	return x
}

// prepare resolves w's overlaps into the epoch-stamped per-slot array and
// its shared active blocks into c.shared; unprepare resets what it touched.
func (c *core) prepare(w *waiter) {
	fl := c.fl
	cs := &c.cands
	if n := len(fl.key); len(c.shared) < n || len(cs.prefill) != n {
		// the fleet grew: resize the per-slot scratch, re-take its arrays
		c.shared = append(c.shared, make([]int32, n-len(c.shared))...)
		cs.ov = append(cs.ov, make([]uint64, n-len(cs.ov))...)
		cs.rep = append(cs.rep, make([]uint64, n-len(cs.rep))...)
		cs.warm = append(cs.warm, make([]uint64, n-len(cs.warm))...)
		cs.f = fl
		cs.prefill, cs.decode, cs.active = fl.prefill, fl.decode, fl.active
		cs.prefillF, cs.decodeF = fl.prefillF, fl.decodeF
		cs.shared = c.shared
	}
	cs.epoch += 1 << 32
	if cs.epoch == 0 { // wrapped after 2^32 selections: old stamps could match
		clear(cs.ov)
		clear(cs.rep)
		clear(cs.warm)
		cs.epoch = 1 << 32
	}
	r := w.req
	c.prepareAdapter(r)
	ov, rep, ep := cs.ov, cs.rep, cs.epoch
	limit := uint32(max(int64(len(r.SeqHashes)), c.blocks(int64(r.Tokens))))
	hints := fl.hints
	deepest := uint32(0) // the deepest reported overlap on any worker
	ovs := w.overlaps()
	for i := range ovs {
		o := &ovs[i] // not a copy: this loop runs once per worker holding the prefix
		if o.Blocks <= 0 {
			continue
		}
		var s int32
		// the positional hint, inlined by hand (as a function it is over
		// the inlining budget); a truncating uint32 cannot match a wrong
		// hint because hints only exist for lengths and ranks < 2^16 and
		// the name address is compared too
		if i < len(hints) && hints[i].p == unsafe.StringData(o.Key.Worker) &&
			hints[i].lr == uint32(len(o.Key.Worker))<<16|o.Key.Rank {
			s = hints[i].slot
		} else {
			s = fl.slotAtSlow(i, o.Key)
			hints = fl.hints
		}
		if s < 0 {
			continue
		}
		v := min(uint32(min(o.Blocks, 1<<31)), limit)
		if cur := ov[s]; cur < ep || uint32(cur) < v {
			ov[s] = ep | uint64(v)
		}
		if o.Reported > 0 { // at most the entry's Blocks (Validate)
			v = min(uint32(min(o.Reported, 1<<31)), v)
			deepest = max(deepest, v)
			if cur := rep[s]; cur < ep || uint32(cur) < v {
				rep[s] = ep | uint64(v)
			}
		}
	}
	// Prompt blocks already active on a worker are counted once there. The
	// hashes are a prefix chain and bookings hold whole chains, so the first
	// hash no worker holds ends the walk.
	if c.holders.len() > 0 {
		for _, h := range r.SeqHashes {
			first, more, ok := c.holders.holdersOf(h)
			if !ok {
				break
			}
			c.countShared(first.slot)
			for _, hd := range more {
				c.countShared(hd.slot)
			}
		}
	}
	if c.bookedPrefix {
		// The walk above ends at the first hash no booking names, so
		// shared[s] is the prompt prefix booked on s (BookedPrefixCounter).
		floor := uint32(0)
		if c.bookedOnlyNew {
			floor = deepest
		}
		for _, s := range c.shTouched {
			v := min(uint32(c.shared[s]), limit)
			if v <= floor {
				continue // some worker's events report this prefix already
			}
			if cur := ov[s]; cur < ep || uint32(cur) < v {
				ov[s] = ep | uint64(v)
			}
		}
	}
	total := c.blocks(int64(r.Tokens) + c.bookedOutput(r) + int64(c.cfg.BlockSize) - 1)
	cs.anyShared = len(c.shTouched) > 0
	cs.newBlks = max(total, int64(len(r.SeqHashes)))
}

// countShared counts one more active prompt block of the request on slot.
func (c *core) countShared(slot int32) {
	if c.shared[slot] == 0 {
		c.shTouched = append(c.shTouched, slot)
	}
	c.shared[slot]++
}

func (c *core) unprepare() {
	for _, s := range c.shTouched {
		c.shared[s] = 0
	}
	c.shTouched = c.shTouched[:0]
}

// collectAll sets c.cands to every eligible row w may use, in (worker, rank)
// order. Without an allowed set that is the fleet's maintained list.
func (c *core) collectAll(w *waiter) {
	fl := c.fl
	cs := &c.cands
	if w.allowed == nil {
		cs.slots, cs.owned = fl.eligibleSlots(w.req.Leg), false
		return
	}
	cs.slots, cs.owned = cs.own[:0], true
	for _, name := range w.allowed { // sorted, so the order matches fl.order
		wid := fl.widOf(name)
		if wid < 0 {
			continue
		}
		for _, s := range fl.workers[wid].slots {
			if fl.eligible(s) && c.legOK(w, s) {
				cs.slots = append(cs.slots, s)
			}
		}
	}
	cs.own = cs.slots[:0]
}

// collectTarget sets c.cands to t's eligible rows that w may use.
func (c *core) collectTarget(w *waiter, t workerref.Target) { c.collectRows(w, t, false) }

// collectBound is collectTarget for a Hard requirement's target, whose
// draining rows are candidates too (fleet.eligibleBound).
func (c *core) collectBound(w *waiter, t workerref.Target) { c.collectRows(w, t, true) }

func (c *core) collectRows(w *waiter, t workerref.Target, bound bool) {
	fl := c.fl
	cs := &c.cands
	cs.slots, cs.owned = cs.own[:0], true
	if w.allows(t.Worker) {
		var one [1]int32
		for _, s := range fl.slotsOf(fl.resolve(t), &one) {
			if (fl.eligible(s) || bound && fl.eligibleBound(s)) && c.legOK(w, s) {
				cs.slots = append(cs.slots, s)
			}
		}
	}
	cs.own = cs.slots[:0]
}
