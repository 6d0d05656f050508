package scheduler

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/kvrouter/kvrouter/workerref"
)

// waiter is one Schedule call inside the core: admitted at once or queued.
type waiter struct {
	req      *Request // the caller's; valid while the caller waits in Schedule
	plan     pinPlan
	allowed  []string  // sorted copy of req.Allowed; nil = every worker
	fresh    []Overlap // refreshed overlaps (nil: req.Overlaps)
	seq      uint64    // arrival order
	uncached int64     // WSPT key: prompt tokens not cached on the best worker
	class    string
	arrived  time.Time
	overAt   time.Time // overlaps as of
	deadline time.Time
	dlIndex  int // position in the deadline heap, -1 when not in it
	tier     *tier
	lane     *lane // nil: the tier's shared queue
	queued   bool
	held     bool // it waited in the queue (its selection is noted in core.held)
	done     bool
	// reply carries the answer of a queued waiter to its caller; nil until
	// it is queued: a waiter answered within submit, on its caller's
	// goroutine, gets res instead (answered).
	reply    chan result
	res      result
	answered bool
	// booking handed over in the reply (for abandonment after admission)
	fence Fence
}

type result struct {
	d   Decision
	err error
}

// answer gives w its result: on reply once it was queued (its caller
// waits there), else in res for the caller that is still inside submit.
func (w *waiter) answer(res result) {
	if w.reply != nil {
		w.reply <- res
		return
	}
	w.res, w.answered = res, true
}

func (w *waiter) overlaps() []Overlap {
	if w.fresh != nil {
		return w.fresh
	}
	return w.req.Overlaps
}

func (w *waiter) allows(worker string) bool {
	if w.allowed == nil {
		return true
	}
	_, ok := slices.BinarySearch(w.allowed, worker)
	return ok
}

// tier is one priority level: a shared queue plus per-target pinned lanes.
type tier struct {
	prio   int
	shared []*waiter
	lanes  []*lane
	laneBy map[workerref.Target]*lane
}

// lane holds pinned requests for one exact target.
type lane struct {
	target workerref.Target
	q      []*waiter
}

type classLoad struct {
	requests int
	tokens   int64
}

type queueState struct {
	tiers   []*tier // by priority, highest first
	byPrio  map[int]*tier
	byID    map[string]*waiter
	classes map[string]*classLoad
	dl      deadlineHeap
	seq     uint64
	n       int
}

func newQueueState() queueState {
	return queueState{
		byPrio:  map[int]*tier{},
		byID:    map[string]*waiter{},
		classes: map[string]*classLoad{},
	}
}

// submit is a new Schedule call arriving at the core.
func (c *core) submit(w *waiter) {
	r := w.req
	if _, dup := c.bookings[r.ID]; dup {
		c.reject(w, fmt.Errorf("%w: %q has a live booking", ErrDuplicateRequest, r.ID))
		return
	}
	if _, dup := c.q.byID[r.ID]; dup {
		c.reject(w, fmt.Errorf("%w: %q is queued", ErrDuplicateRequest, r.ID))
		return
	}
	if err := c.checkCapacity(r); err != nil {
		c.stats.badInput.Add(1)
		c.reject(w, err)
		return
	}
	plan, err := applyPinRule(r, c.cfg.Classifier)
	if err != nil {
		c.stats.pinConflicts.Add(1)
		c.reject(w, err)
		return
	}
	w.plan = plan
	if r.Allowed != nil {
		w.allowed = slices.Clone(r.Allowed)
		slices.Sort(w.allowed)
		w.allowed = slices.Compact(w.allowed)
	}
	now := c.cfg.Now()
	w.arrived, w.overAt = now, now
	if err := c.checkSchedulable(w); err != nil {
		c.reject(w, err)
		return
	}
	if c.canAdmit(w) {
		c.admit(w, now)
		return
	}
	// Every worker w could use is busy: wait.
	if r.NoWait {
		c.reject(w, fmt.Errorf("%w: request %q", ErrWouldQueue, r.ID))
		return
	}
	if !r.Deadline.IsZero() && !now.Before(r.Deadline) {
		c.stats.deadlines.Add(1)
		c.reject(w, fmt.Errorf("%w: request %q deadline %s already passed", ErrDeadline, r.ID, r.Deadline.Format(time.RFC3339Nano)))
		return
	}
	w.uncached = c.uncachedTokens(w)
	w.class = r.Class
	if err := c.checkLimit(w); err != nil {
		c.stats.overloaded.Add(1)
		c.reject(w, err)
		return
	}
	c.enqueue(w)
}

// checkSchedulable rejects a request that no live, available worker could
// ever serve as things stand: a pin on an unknown, out-of-range, draining or
// disallowed target, or an allowed set with no available worker.
func (c *core) checkSchedulable(w *waiter) error {
	fl := c.fl
	if t := w.plan.exact; t != nil {
		if !w.allows(t.Worker) {
			return fmt.Errorf("%w: pinned target %s is outside the allowed set", ErrNoEligibleWorker, t)
		}
		var one [1]int32
		for _, s := range fl.slotsOf(fl.resolve(*t), &one) {
			if fl.schedulable(s) && c.legOK(w, s) {
				return nil
			}
		}
		return fmt.Errorf("%w: pinned target %s is unknown, unavailable or not a %s worker", ErrNoEligibleWorker, t, w.req.Leg)
	}
	if c.hardTargetDraining(w, fl.eligibleBound) {
		return nil // a draining worker still serves the Hard sessions bound to it
	}
	if w.allowed == nil {
		for _, s := range fl.order {
			if fl.schedulable(s) && c.legOK(w, s) {
				return nil
			}
		}
		if fl.roled > 0 {
			return fmt.Errorf("%w: no available worker takes %s legs", ErrNoEligibleWorker, w.req.Leg)
		}
		return fmt.Errorf("%w: no available worker", ErrNoEligibleWorker)
	}
	for _, name := range w.allowed {
		if wid := fl.widOf(name); wid >= 0 {
			for _, s := range fl.workers[wid].slots {
				if fl.schedulable(s) && c.legOK(w, s) {
					return nil
				}
			}
		}
	}
	return fmt.Errorf("%w: no available worker in the allowed set %v", ErrNoEligibleWorker, w.allowed)
}

// canAdmit: some worker w may use is free (live, available, under every
// threshold). A pinned request looks only at its target (rule 5); every
// other request, Hard-bound ones included, looks fleet-wide (rule 2).
func (c *core) canAdmit(w *waiter) bool {
	fl := c.fl
	if t := w.plan.exact; t != nil {
		return c.targetFree(*t)
	}
	if c.hardTargetDraining(w, func(s int32) bool { return fl.eligibleBound(s) && fl.flags[s]&fBusy == 0 }) {
		return true
	}
	if fl.nonBusy == 0 {
		return false
	}
	if w.allowed == nil {
		if fl.roled == 0 {
			return true
		}
		for _, s := range fl.order {
			if fl.free(s) && fl.serves(s, w.req.Leg) {
				return true
			}
		}
		return false
	}
	for _, name := range w.allowed {
		if wid := fl.widOf(name); wid >= 0 {
			for _, s := range fl.workers[wid].slots {
				if fl.free(s) && c.legOK(w, s) {
					return true
				}
			}
		}
	}
	return false
}

// hardTargetDraining: w is Hard-bound (the pin rule's plan.hard) to a
// draining worker it may use and one of the target's slots passes ok. The
// fleet-wide checks count only available workers; this is the one case
// where a worker that is not available may take the request.
func (c *core) hardTargetDraining(w *waiter, ok func(int32) bool) bool {
	t := w.plan.hard
	if t == nil || !w.allows(t.Worker) {
		return false
	}
	fl := c.fl
	var one [1]int32
	for _, s := range fl.slotsOf(fl.resolve(*t), &one) {
		if fl.flags[s]&fDraining != 0 && ok(s) && c.legOK(w, s) {
			return true
		}
	}
	return false
}

func (c *core) targetFree(t workerref.Target) bool {
	fl := c.fl
	var one [1]int32
	for _, s := range fl.slotsOf(fl.resolve(t), &one) {
		if fl.free(s) {
			return true
		}
	}
	return false
}

// uncachedTokens is the WSPT key: prompt tokens minus the best cached prefix
// among the workers the request may use.
func (c *core) uncachedTokens(w *waiter) int64 {
	best := 0
	for _, o := range w.overlaps() {
		if w.plan.exact != nil && !w.plan.exact.Contains(o.Key.Worker, o.Key.Rank) {
			continue
		}
		if !w.allows(o.Key.Worker) {
			continue
		}
		best = max(best, o.Blocks)
	}
	return max(1, int64(w.req.Tokens)-int64(best)*int64(c.cfg.BlockSize))
}

func (c *core) limitFor(class string) QueueLimit {
	if l, ok := c.cfg.Queue.Limits[class]; ok {
		return l
	}
	return c.cfg.Queue.Default
}

func (c *core) checkLimit(w *waiter) error {
	l := c.limitFor(w.class)
	cl := c.q.classes[w.class]
	if cl == nil {
		cl = &classLoad{}
	}
	mult := 1
	if l.PerWorker {
		mult = max(1, len(c.fl.order))
	}
	if l.Requests > 0 && cl.requests+1 > l.Requests*mult {
		return fmt.Errorf("%w: class %q has %d requests queued (limit %d)", ErrOverloaded, w.class, cl.requests, l.Requests*mult)
	}
	if l.Tokens > 0 && cl.tokens+w.uncached > int64(l.Tokens)*int64(mult) {
		return fmt.Errorf("%w: class %q has %d uncached tokens queued (limit %d)", ErrOverloaded, w.class, cl.tokens, int64(l.Tokens)*int64(mult))
	}
	return nil
}

// before orders two waiters of one tier: FCFS by arrival, WSPT by uncached
// tokens then arrival.
func (c *core) before(a, b *waiter) bool {
	if c.cfg.Queue.Order == WSPT && a.uncached != b.uncached {
		return a.uncached < b.uncached
	}
	return a.seq < b.seq
}

func (c *core) insert(q []*waiter, w *waiter) []*waiter {
	i := sort.Search(len(q), func(i int) bool { return c.before(w, q[i]) })
	return slices.Insert(q, i, w)
}

func (c *core) enqueue(w *waiter) {
	if w.reply == nil {
		w.reply = make(chan result, 1) // the caller will wait on it
	}
	q := &c.q
	q.seq++
	w.seq = q.seq
	t := q.byPrio[w.req.Priority]
	if t == nil {
		t = &tier{prio: w.req.Priority, laneBy: map[workerref.Target]*lane{}}
		q.byPrio[t.prio] = t
		i := sort.Search(len(q.tiers), func(i int) bool { return q.tiers[i].prio < t.prio })
		q.tiers = slices.Insert(q.tiers, i, t)
	}
	w.tier = t
	if p := w.plan.exact; p != nil {
		l := t.laneBy[*p]
		if l == nil {
			l = &lane{target: *p}
			t.laneBy[*p] = l
			t.lanes = append(t.lanes, l)
		}
		w.lane = l
		l.q = c.insert(l.q, w)
	} else {
		t.shared = c.insert(t.shared, w)
	}
	w.queued, w.held = true, true
	w.dlIndex = -1
	if !w.req.Deadline.IsZero() {
		w.deadline = w.req.Deadline
		heap.Push(&q.dl, w)
	}
	q.byID[w.req.ID] = w
	cl := q.classes[w.class]
	if cl == nil {
		cl = &classLoad{}
		q.classes[w.class] = cl
	}
	cl.requests++
	cl.tokens += w.uncached
	q.n++
	c.stats.waiting.Store(int64(q.n))
	c.stats.queued.Add(1)
	c.rearm()
}

// dequeue takes a waiter out of every queue structure.
func (c *core) dequeue(w *waiter) {
	if !w.queued {
		return
	}
	q := &c.q
	w.queued = false
	if w.lane != nil {
		w.lane.q = remove(w.lane.q, w)
	} else {
		w.tier.shared = remove(w.tier.shared, w)
	}
	if w.dlIndex >= 0 {
		heap.Remove(&q.dl, w.dlIndex)
	}
	delete(q.byID, w.req.ID)
	if cl := q.classes[w.class]; cl != nil {
		cl.requests--
		cl.tokens -= w.uncached
		if cl.requests == 0 {
			delete(q.classes, w.class)
		}
	}
	q.n--
	c.stats.waiting.Store(int64(q.n))
}

func remove(q []*waiter, w *waiter) []*waiter {
	if i := slices.Index(q, w); i >= 0 {
		return slices.Delete(q, i, i+1)
	}
	return q
}

// pump admits every waiter that can now be admitted, highest tier first;
// within a tier, pinned lanes whose target is free first (a pinned request
// can use nothing else), then the shared queue in order. A waiter that
// cannot be admitted is skipped, not waited on: every worker it may use is
// busy, so nothing admitted after it takes capacity it could have used.
// Called after every change that can free capacity.
func (c *core) pump() {
	if c.q.n == 0 || c.pumping {
		return
	}
	c.pumping = true
	defer func() { c.pumping = false }()
	now := c.cfg.Now()
	for _, t := range c.q.tiers {
		for _, l := range t.lanes {
			for len(l.q) > 0 && c.targetFree(l.target) {
				w := l.q[0]
				c.dequeue(w)
				c.admit(w, now)
			}
		}
		for i := 0; i < len(t.shared) && c.fl.nonBusy > 0; {
			w := t.shared[i]
			if c.canAdmit(w) {
				c.dequeue(w)
				c.admit(w, now)
				continue
			}
			i++
		}
	}
	c.tidy()
	c.rearm()
}

// tidy drops empty lanes and tiers.
func (c *core) tidy() {
	q := &c.q
	tiers := q.tiers[:0]
	for _, t := range q.tiers {
		lanes := t.lanes[:0]
		for _, l := range t.lanes {
			if len(l.q) > 0 {
				lanes = append(lanes, l)
			} else {
				delete(t.laneBy, l.target)
			}
		}
		clear(t.lanes[len(lanes):])
		t.lanes = lanes
		if len(t.lanes) > 0 || len(t.shared) > 0 {
			tiers = append(tiers, t)
		} else {
			delete(q.byPrio, t.prio)
		}
	}
	clear(q.tiers[len(tiers):])
	q.tiers = tiers
}

// admit selects a worker for w, books it and replies.
func (c *core) admit(w *waiter, now time.Time) {
	if c.cfg.Refresh != nil && c.cfg.Queue.RefreshAfter > 0 && now.Sub(w.overAt) >= c.cfg.Queue.RefreshAfter {
		w.fresh = c.cfg.Refresh(w.req, w.fresh[:0])
		if w.fresh == nil {
			w.fresh = []Overlap{}
		}
		w.overAt = now
		c.stats.refreshes.Add(1)
	}
	slot, overlap, fellBack, err := c.selectWorker(w)
	if err != nil {
		if errors.Is(err, ErrNoEligibleWorker) || errors.Is(err, ErrNoCandidate) {
			c.stats.noEligible.Add(1)
		}
		c.reject(w, err)
		return
	}
	b := c.book(w.req, slot, overlap, now)
	w.fence = b.fence()
	w.done = true
	c.stats.admitted.Add(1)
	w.answer(result{d: Decision{
		Worker: b.key, OverlapBlocks: overlap, Fence: w.fence, Waited: now.Sub(w.arrived),
		HardFallback: fellBack, Policy: c.policy.Name(),
	}})
	if c.onAdmit != nil {
		c.onAdmit(w, slot)
	}
}

func (c *core) reject(w *waiter, err error) {
	c.dequeue(w)
	w.done = true
	w.answer(result{err: err})
}

// abandon handles a caller that stopped waiting (context done): a queued
// waiter leaves the queue; an admitted one has its booking rolled back.
func (c *core) abandon(w *waiter) {
	if w.queued {
		c.dequeue(w)
		c.stats.canceled.Add(1)
		c.tidy()
		c.rearm()
		return
	}
	if w.done && w.fence.RequestID != "" {
		if b, err := c.fenced(w.fence); err == nil {
			c.stats.rollbacks.Add(1)
			c.release(b, c.cfg.Now(), true)
			c.pump()
		}
	}
}

// cancel handles Cancel(id): a queued request is rejected with ErrCanceled,
// a booked one is freed.
func (c *core) cancel(id string) error {
	if w, ok := c.q.byID[id]; ok {
		c.stats.canceled.Add(1)
		c.reject(w, fmt.Errorf("%w: %q", ErrCanceled, id))
		c.tidy()
		c.rearm()
		return nil
	}
	if b, ok := c.bookings[id]; ok {
		c.release(b, c.cfg.Now(), true)
		c.pump()
		return nil
	}
	return fmt.Errorf("%w: %q", ErrUnknownRequest, id)
}

// recheck rejects waiters that can no longer be served after a membership
// change (their pin departed or drains, or no allowed worker is left).
func (c *core) recheck() {
	if c.q.n == 0 {
		return
	}
	var dead []*waiter
	for _, w := range c.q.byID {
		if err := c.checkSchedulable(w); err != nil {
			dead = append(dead, w)
		}
	}
	slices.SortFunc(dead, func(a, b *waiter) int { return cmp.Compare(a.seq, b.seq) })
	for _, w := range dead {
		c.stats.noEligible.Add(1)
		c.reject(w, fmt.Errorf("request %q: %w", w.req.ID, c.checkSchedulable(w)))
	}
	c.tidy()
	c.rearm()
}

// expireDeadlines rejects waiters whose deadline has passed.
func (c *core) expireDeadlines(now time.Time) {
	for c.q.dl.Len() > 0 {
		w := c.q.dl[0]
		if now.Before(w.deadline) {
			break
		}
		c.stats.deadlines.Add(1)
		c.reject(w, fmt.Errorf("%w: request %q waited %s", ErrDeadline, w.req.ID, now.Sub(w.arrived)))
	}
	c.tidy()
	c.rearm()
}

// rearm sets the deadline timer to the next deadline.
func (c *core) rearm() {
	if c.setTimer == nil {
		return
	}
	if c.q.dl.Len() == 0 {
		c.setTimer(time.Time{})
		return
	}
	c.setTimer(c.q.dl[0].deadline)
}

// deadlineHeap orders queued waiters with a deadline, earliest first.
type deadlineHeap []*waiter

func (h deadlineHeap) Len() int { return len(h) }
func (h deadlineHeap) Less(i, j int) bool {
	if h[i].deadline.Equal(h[j].deadline) {
		return h[i].seq < h[j].seq
	}
	return h[i].deadline.Before(h[j].deadline)
}
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].dlIndex = i
	h[j].dlIndex = j
}
func (h *deadlineHeap) Push(x any) {
	w := x.(*waiter)
	w.dlIndex = len(*h)
	*h = append(*h, w)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	n := len(old)
	w := old[n-1]
	old[n-1] = nil
	w.dlIndex = -1
	*h = old[:n-1]
	return w
}
