package bindings

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/kvrouter/kvrouter/session"
	"github.com/kvrouter/kvrouter/workerref"
)

// commit is the commit rule: steps 2 and 3 of Route (select, then create,
// renew, re-bind or reject, every write conditional on the revision read),
// for one Route call. Each round decides on cur; a write that does not land
// leaves the key's new state in cur and the next round decides again. A
// selection keeps a binding when their targets agree
// (workerref.Target.Agrees).
//
// Start at run and round; then one method per outcome: create, renew,
// reject, rebind, and for the writes that did not simply land, ours (a
// write that got no answer, or a conflict, turned out to have landed) and
// lost (a Soft re-bind lost to another writer).
//
// It lives for one Route call only, which is why it holds ctx.
type commit struct {
	t                     *Table
	ctx                   context.Context
	model, sessionID, key string
	mode                  session.Mode // of a binding it creates
	sel                   Selector

	cur readState // the state this round decides on
	ch  choice
	fl  *flight // set while this call is the session's creator in this replica

	base   uint64                    // nonces of this call: base-<write index>
	writes int                       // writes made so far
	intent [maxAttemptsLimit]Outcome // what each write meant, if it lands late
	// unanswered has bit i set when write i got no answer (else it was
	// answered, by a conflict, when it did not land): for the counters.
	unanswered uint32
	// lostSoft is set when a Soft re-bind to wanted lost to a writer that
	// moved the binding: keep theirs (KeptOther) unless the value turns out
	// to be ours.
	lostSoft bool
	wanted   workerref.Target
}

// errAgain ends a round that changed cur without ending Route: run decides
// again. It never leaves run.
var errAgain = errors.New("bindings: decide again on the new state")

// newCommit starts a commit from the state cur that Route read; mode is the
// mode of a binding it creates.
func (t *Table) newCommit(ctx context.Context, model, sessionID, key string, mode session.Mode, sel Selector, cur readState) commit {
	return commit{t: t, ctx: ctx, model: model, sessionID: sessionID, key: key, mode: mode, sel: sel,
		cur: cur, base: rand.Uint64()}
}

// run decides round after round until Route's result is known.
func (c *commit) run() (Result, error) {
	defer c.release()
	for {
		res, err := c.round()
		if err != errAgain {
			return res, err
		}
	}
}

// round decides once on cur. Before the rule applies, cur is checked: a
// malformed value ends Route, and a value that is one of our own writes or
// the result of a lost Soft re-bind settles it.
//
// A value carrying one of our nonces is our write whatever its answer said:
// not only a write that got no answer, also one answered as a conflict. A
// JetStream publish can be answered twice, and the first answer wins: a
// stream leader that processes two copies of one write (seen right after
// an election while a node was cut off) refuses the second at once as a
// conflict (10164) with the first, which commits a moment later. Taking
// that for another writer's binding made the create that wrote it report
// fresh (issue 25's partition run 4, docs/faults.md).
func (c *commit) round() (Result, error) {
	if err := c.check(); err != nil {
		c.t.st.malformed.Add(1)
		return c.fail(err)
	}
	if c.writes > 0 && c.cur.present {
		if i, ok := nonceIndex(c.cur.rec.Nonce, c.base); ok && i < c.writes {
			return c.ours(i)
		}
	}
	if c.lostSoft {
		c.lostSoft = false
		if c.cur.present {
			return c.lost()
		}
	}
	if !c.cur.present {
		return c.create()
	}
	bound := c.cur.rec.binding(c.cur.rev)
	tgt, err := c.t.next(c.ctx, &c.ch, c.sel, &c.cur.rec, c.model, c.sessionID)
	if err != nil {
		return c.fail(err)
	}
	switch {
	case bound.Target.Agrees(tgt):
		return c.renew(bound, merge(bound.Target, tgt))
	case bound.Mode == session.Hard && c.t.live(bound.Worker):
		return c.reject(bound, tgt)
	default: // Soft, or Hard whose worker departed
		return c.rebind(bound, tgt)
	}
}

// check reports a malformed value in cur, or one stored under this key that
// names another model or session.
func (c *commit) check() error {
	if c.cur.bad != nil {
		return c.cur.bad
	}
	if c.cur.present && (c.cur.rec.Model != c.model || c.cur.rec.Session != c.sessionID) {
		return &MalformedValueError{Key: c.key, Revision: c.cur.rev,
			Err: fmt.Errorf("value names model %q session %q", c.cur.rec.Model, c.cur.rec.Session)}
	}
	return nil
}

// create binds the unbound session to a new selection. One creator per
// session in this replica: a request that finds another one creating waits
// for it (await) instead of racing. Should the create lose, a session still
// unbound keeps the selection; one bound by someone else selects again
// under their binding.
func (c *commit) create() (Result, error) {
	if c.fl == nil {
		f, leader := c.t.flights.join(c.key)
		if !leader {
			return c.await(f)
		}
		c.fl = f
	}
	if c.writes >= c.t.cfg.MaxAttempts {
		return c.t.exhausted(c.model, c.sessionID, c.ch.selections)
	}
	tgt, err := c.t.next(c.ctx, &c.ch, c.sel, nil, c.model, c.sessionID)
	if err != nil {
		return c.fail(err)
	}
	now := time.Now()
	rec := recordFor(c.model, c.sessionID, tgt, c.mode, 1, c.t.cfg.ReplicaID, now, now, c.t.msgTTL, "")
	st, landed, err := c.write(Created, &rec, now)
	// The binding (ours or the winner's, from the leader) is in the cache
	// now: let waiters read it.
	c.release()
	if err != nil {
		return c.fail(err)
	}
	if landed {
		return c.done(Created, tgt, st.rec.binding(st.rev)), nil
	}
	c.cur = st
	if !st.present {
		c.ch.carry(tgt)
	}
	return Result{}, errAgain
}

// await waits for the session's creator in this replica, then decides on
// what it stored.
func (c *commit) await(f *flight) (Result, error) {
	c.t.st.waits.Add(1)
	select {
	case <-f.done:
	case <-c.ctx.Done():
		return c.fail(unavailable(c.ctx, "wait for the creation", c.key, c.ctx.Err()))
	}
	st, err := c.t.readKey(c.ctx, c.key)
	if err != nil {
		return c.fail(err)
	}
	c.cur, c.ch.hasCarried = st, false
	return Result{}, errAgain
}

// renew serves a selection tgt that agrees with the binding: no write while
// the binding is fresh, else a renewal so that it outlives this request by
// IdleTTL.
func (c *commit) renew(bound Binding, tgt workerref.Target) (Result, error) {
	now := time.Now()
	if c.t.fresh(&c.cur, now) {
		return c.done(Fresh, tgt, bound), nil
	}
	rec := c.cur.rec
	rec.Writer, rec.Renewed, rec.TTLSeconds = c.t.cfg.ReplicaID, now.UTC(), int64(c.t.msgTTL/time.Second)
	return c.replace(Renewed, &rec, tgt, bound, now)
}

// reject refuses a selection tgt that disagrees with a Hard binding whose
// worker is live, on the leader's word only: the cache may lag a re-bind
// made by a replica that saw the worker depart.
func (c *commit) reject(bound Binding, tgt workerref.Target) (Result, error) {
	if !c.cur.leader {
		st, err := c.t.leaderRead(c.ctx, c.key)
		if err != nil {
			return c.fail(err)
		}
		if st.rev != c.cur.rev {
			if sameRequirement(&st, &c.cur) {
				c.ch.carry(tgt)
			}
			c.cur = st
			return Result{}, errAgain
		}
	}
	c.t.st.outcome[Rejected].Add(1)
	return Result{Outcome: Rejected, Binding: bound, Selections: c.ch.selections},
		&HardConflictError{Model: c.model, Session: c.sessionID, Bound: bound.Target, Selected: tgt}
}

// rebind moves a Soft binding, or a Hard one whose worker departed, to tgt.
func (c *commit) rebind(bound Binding, tgt workerref.Target) (Result, error) {
	now := time.Now()
	rec := recordFor(c.model, c.sessionID, tgt, bound.Mode, bound.Version+1, c.t.cfg.ReplicaID, now, now, c.t.msgTTL, "")
	return c.replace(Rebound, &rec, tgt, bound, now)
}

// replace writes rec over the binding bound (a renewal or a re-bind, want)
// and, should the write not land, prepares the next round: the selection
// tgt stands while the requirement is unchanged, and a Soft re-bind that
// lost to another writer's move is settled by lost.
func (c *commit) replace(want Outcome, rec *record, tgt workerref.Target, bound Binding, now time.Time) (Result, error) {
	if c.writes >= c.t.cfg.MaxAttempts {
		return c.t.exhausted(c.model, c.sessionID, c.ch.selections)
	}
	st, landed, err := c.write(want, rec, now)
	if err != nil {
		if want == Renewed && errors.Is(err, ErrFull) {
			// A full replicated bucket refuses renewals too (the server's
			// pre-check counts every message as new): the binding stands
			// until its TTL runs out, serve under it.
			c.t.st.renewalsRefused.Add(1)
			return c.done(Fresh, tgt, bound), nil
		}
		return c.fail(err)
	}
	if landed {
		return c.done(want, tgt, st.rec.binding(st.rev)), nil
	}
	if sameRequirement(&st, &c.cur) {
		// Only renewed (or our write did not land): the requirement is
		// unchanged, so the selection stands; re-decide on the new
		// revision without selecting again.
		c.ch.carry(tgt)
	} else if want == Rebound && bound.Mode == session.Soft {
		c.lostSoft, c.wanted = true, tgt
	}
	c.cur = st
	return Result{}, errAgain
}

// write makes this call's next conditional write, rec over cur's revision,
// meaning want should it land late; see Table.tryWrite.
func (c *commit) write(want Outcome, rec *record, now time.Time) (st readState, landed bool, err error) {
	rec.Nonce = makeNonce(c.base, c.writes)
	c.intent[c.writes] = want
	st, landed, amb, err := c.t.tryWrite(c.ctx, c.key, rec, c.cur.rev, now)
	if amb {
		c.unanswered |= 1 << c.writes
	}
	c.writes++
	return st, landed, err
}

// ours settles Route when cur is write i of ours that was not seen to land
// (it got no answer, or a conflict): it landed after all (a later write of
// ours may then have lost to it), so Route ends as that write meant.
func (c *commit) ours(i int) (Result, error) {
	if c.unanswered&(1<<i) != 0 {
		c.t.st.ambiguousLanded.Add(1)
	} else {
		c.t.st.conflictsLanded.Add(1)
	}
	b := c.cur.rec.binding(c.cur.rev)
	return c.done(c.intent[i], b.Target, b), nil
}

// lost settles a Soft re-bind to wanted that lost to another writer's move:
// keep theirs and send the request to wanted anyway (KeptOther), unless
// they moved it where we wanted it.
func (c *commit) lost() (Result, error) {
	theirs := c.cur.rec.binding(c.cur.rev)
	if theirs.Target.Agrees(c.wanted) {
		return c.done(Fresh, merge(theirs.Target, c.wanted), theirs), nil
	}
	return c.done(KeptOther, c.wanted, theirs), nil
}

// release lets this replica's waiters for the session go, if this call is
// its creator.
func (c *commit) release() {
	if c.fl != nil {
		c.t.flights.finish(c.key, c.fl)
		c.fl = nil
	}
}

func (c *commit) done(o Outcome, tgt workerref.Target, b Binding) Result {
	return c.t.done(o, tgt, b, c.ch.selections)
}

func (c *commit) fail(err error) (Result, error) {
	return Result{Selections: c.ch.selections}, err
}

// choice is where one round of commit sends the request: a selection carried
// over from the round before (the requirement did not change, so it
// stands), or else a new call of the Selector; selections counts the calls
// of the whole Route.
type choice struct {
	carried    workerref.Target
	hasCarried bool
	selections int
}

// carry keeps tgt as the next round's selection.
func (c *choice) carry(tgt workerref.Target) { c.carried, c.hasCarried = tgt, true }

// next returns the carried selection, or else selects under rec (nil:
// unbound) while Route has made fewer than MaxAttempts selections.
func (t *Table) next(ctx context.Context, c *choice, sel Selector, rec *record, model, session string) (workerref.Target, error) {
	if c.hasCarried {
		c.hasCarried = false
		return c.carried, nil
	}
	if c.selections >= t.cfg.MaxAttempts {
		return workerref.Target{}, t.exhaustedErr(model, session)
	}
	c.selections++
	return t.selectUnder(ctx, sel, rec, model, session)
}
