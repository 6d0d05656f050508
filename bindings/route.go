package bindings

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvrouter/kvrouter/session"
	"github.com/kvrouter/kvrouter/workerref"
)

// Route is the commit protocol, called once per request that has a session
// id. It
//
//  1. reads the binding and its revision (firstRead): a Hard binding
//     from the stream leader; a Soft one or an absence from the watch-fed
//     cache while it is provably at most MaxStaleness behind the bucket,
//     else from the leader (also under StrictReads, and after any lost or
//     unanswered write);
//  2. calls sel with the requirement (nil when unbound, else the bound
//     target and the binding's mode as its strength);
//  3. commits, every write conditional on the revision read:
//     - unbound: create the binding with the idle TTL. If another replica
//     created it first, re-read from the leader and select again under
//     the winner's binding. Concurrent first requests of the session in
//     this replica wait for the one creating it instead of racing;
//     - selected == bound: no write while the binding is fresh (Fresh);
//     once more than StoredTTL - IdleTTL has passed since it was stored,
//     renew it (Renewed), so that it outlives this request by IdleTTL;
//     - Hard, selected != bound: if the bound worker is not live
//     (Config.Liveness), re-bind (Rebound); if it is live, leave the
//     binding and return a *HardConflictError (Rejected);
//     - Soft, selected != bound: re-bind (Rebound); if another writer
//     moved the binding first, keep theirs and send the request to the
//     selected worker anyway (KeptOther).
//
// A write that gets no answer (a timeout while the stream leader changes)
// is resolved by reading the key from the leader and comparing the nonce in
// the value, never by assuming; if the leader cannot be asked in time Route
// returns ErrAmbiguous (also matching ErrUnavailable). ctx's deadline bounds
// everything Route waits for: a leader that does not answer before it is
// ErrUnavailable. A create past MaxSessions is ErrFull. After MaxAttempts
// lost rounds it returns
// ErrTooManyConflicts. A malformed stored value is reported
// (ErrMalformedValue) and left alone.
//
// On success the request goes to Result.Target. On Rejected, Route returns
// the Result (with the unchanged binding) and the error.
//
// A binding Route creates has Config.DefaultMode; RouteMode lets the request
// choose.
func (t *Table) Route(ctx context.Context, model, sessionID string, sel Selector) (Result, error) {
	return t.RouteMode(ctx, model, sessionID, session.Unset, sel)
}

// RouteMode is Route where a binding the request creates gets mode
// (session.Unset = Config.DefaultMode). The mode rule: mode applies only when
// the session has no binding yet; an existing binding keeps the mode stored
// in its value (its strength, and the mode of its re-binds), whatever the
// request asks for.
func (t *Table) RouteMode(ctx context.Context, model, sessionID string, mode session.Mode, sel Selector) (Result, error) {
	if mode == session.Unset {
		mode = t.cfg.DefaultMode
	}
	if !mode.Valid() {
		return Result{}, fmt.Errorf("%w: %s", session.ErrUnknownMode, mode)
	}
	if sel == nil {
		return Result{}, ErrNilSelector
	}
	if t.closed.Load() {
		return Result{}, ErrClosed
	}
	if err := validate(model, sessionID); err != nil {
		t.st.badInput.Add(1)
		return Result{}, err
	}
	var kbuf [maxKeyLen]byte
	kb := appendKey(kbuf[:0], model, sessionID)
	cur, err := t.firstRead(ctx, kb)
	if err != nil {
		return Result{}, err
	}
	// The hot path: a fresh binding that selection agrees with costs no
	// write and no allocation.
	if cur.present && cur.bad == nil && cur.rec.Model == model && cur.rec.Session == sessionID && t.fresh(&cur, time.Now()) {
		tgt, err := t.selectUnder(ctx, sel, &cur.rec, model, sessionID)
		if err != nil {
			return Result{Selections: 1}, err
		}
		bound := cur.rec.binding(cur.rev)
		if bound.Target.Agrees(tgt) {
			t.st.outcome[Fresh].Add(1)
			return Result{Outcome: Fresh, Target: merge(bound.Target, tgt), Binding: bound, Selections: 1}, nil
		}
		c := t.newCommit(ctx, model, sessionID, string(kb), mode, sel, cur)
		c.ch.selections = 1
		c.ch.carry(tgt) // the selection stands: decide on it without selecting again
		return c.run()
	}
	c := t.newCommit(ctx, model, sessionID, string(kb), mode, sel, cur)
	return c.run()
}

// tryWrite makes one conditional write of rec over revision expect. landed
// reports that it is stored (st is then the new state, also written through
// to the cache). Otherwise st is the key's state read from the leader after
// the conflict or the unanswered write (ambiguous is then true).
func (t *Table) tryWrite(ctx context.Context, key string, rec *record, expect uint64, now time.Time) (st readState, landed, ambiguous bool, err error) {
	val, err := encodeRecord(rec)
	if err != nil {
		return readState{}, false, false, fmt.Errorf("bindings: encode value of key %q: %w", key, err)
	}
	rev, err := t.casWrite(ctx, key, val, expect, t.msgTTL)
	if err == nil {
		st = readState{present: true, rev: rev, rec: *rec, storedAt: now, ttl: rec.ttl()}
		t.cache.put(key, &st)
		return st, true, false, nil
	}
	if errors.Is(err, ErrConflict) {
		t.st.conflicts.Add(1)
		cerr := err
		st, err = t.leaderRead(ctx, key)
		// On R3 a conflict (10164) can mean that another write to the key
		// is still in flight: the leader still shows the revision we
		// expected. Wait for it to land (briefly) rather than spend an
		// attempt losing to it again.
		for wait := time.Millisecond; err == nil && st.rev == expect && wait <= 128*time.Millisecond; wait *= 2 {
			t.st.inFlightWaits.Add(1)
			select {
			case <-ctx.Done():
				return st, false, false, unavailable(ctx, "wait for an in-flight write", key, ctx.Err())
			case <-time.After(wait):
			}
			st, err = t.leaderRead(ctx, key)
		}
		if err == nil && st.present && st.bad == nil && st.rec.Nonce == rec.Nonce {
			// The write in flight was this one: the conflict answered a
			// second copy of it (commit.round settles it as ours).
			t.cfg.Logger.Warn("bindings: a write answered as a conflict landed", "key", key, "revision", st.rev, "nonce", rec.Nonce, "conflict", cerr)
		}
		return st, false, false, err
	}
	if !isAmbiguous(err) {
		return readState{}, false, false, fmt.Errorf("bindings: write key %q: %w", key, err)
	}
	// Unknown outcome: ask the leader while ctx allows (the caller's
	// deadline bounds the whole Route). Should that be too late, the watch
	// shows the cache the outcome, and Hard reads ask the leader anyway.
	t.st.ambiguous.Add(1)
	st, rerr := t.leaderRead(ctx, key)
	if rerr != nil {
		t.st.unresolved.Add(1)
		return readState{}, false, true, fmt.Errorf("%w: key %q: write: %v; leader read: %w", ErrAmbiguous, key, err, rerr)
	}
	if st.present && st.bad == nil && st.rec.Nonce == rec.Nonce {
		t.st.ambiguousLanded.Add(1)
		return st, true, true, nil
	}
	return st, false, true, nil
}

// readKey reads key after waiting for a concurrent creator: the cache holds
// the creator's result (or the winner's binding it read from the leader).
func (t *Table) readKey(ctx context.Context, key string) (readState, error) {
	if !t.cfg.StrictReads {
		st, ok := t.cache.getString(key)
		if ok && st.present && st.live(time.Now()) {
			return st, nil
		}
	}
	return t.leaderRead(ctx, key)
}

// selectUnder calls the selector with the requirement of rec (nil: unbound).
func (t *Table) selectUnder(ctx context.Context, sel Selector, rec *record, model, session string) (workerref.Target, error) {
	var req *Requirement
	if rec != nil {
		req = t.reqPool.Get().(*Requirement)
		req.Target = workerref.Any(rec.Worker)
		if rec.Rank != nil {
			req.Target = workerref.Of(rec.Worker, *rec.Rank)
		}
		req.Mode = rec.Mode
	}
	tgt, err := sel(ctx, req)
	if req != nil {
		*req = Requirement{}
		t.reqPool.Put(req)
	}
	if err != nil {
		t.st.selectErrors.Add(1)
		return workerref.Target{}, fmt.Errorf("%w: session %q (model %q): %w", ErrSelect, session, model, err)
	}
	if tgt.Worker == "" {
		t.st.selectErrors.Add(1)
		return workerref.Target{}, fmt.Errorf("%w: session %q (model %q): selector returned no worker", ErrSelect, session, model)
	}
	return tgt, nil
}

func (t *Table) done(o Outcome, tgt workerref.Target, b Binding, selections int) Result {
	t.st.outcome[o].Add(1)
	return Result{Outcome: o, Target: tgt, Binding: b, Selections: selections}
}

func (t *Table) exhausted(model, session string, selections int) (Result, error) {
	return Result{Selections: selections}, t.exhaustedErr(model, session)
}

func (t *Table) exhaustedErr(model, session string) error {
	t.st.exhausted.Add(1)
	return fmt.Errorf("%w: session %q (model %q) after %d attempts: %w",
		ErrTooManyConflicts, session, model, t.cfg.MaxAttempts, ErrConflict)
}

// fresh reports whether the entry needs no renewal yet: it will still be
// stored IdleTTL from now, i.e. at most its TTL - IdleTTL has passed
// since it was stored (StoredTTL). An entry written with a shorter TTL
// (an older writer stored IdleTTL itself) is renewed at once.
func (t *Table) fresh(st *readState, now time.Time) bool {
	ttl := st.ttl
	if ttl <= 0 {
		ttl = t.msgTTL
	}
	return now.Sub(st.storedAt) <= ttl-t.cfg.IdleTTL
}

// merge is where a request matching its binding goes: the bound rank if the
// binding has one, else the selected one.
func merge(bound, selected workerref.Target) workerref.Target {
	if !bound.AnyRank {
		return bound
	}
	return selected
}

// sameRequirement reports whether two states ask selection the same thing
// (both valid bindings with equal target and mode).
func sameRequirement(a, b *readState) bool {
	if !a.present || !b.present || a.bad != nil || b.bad != nil {
		return false
	}
	ra, rb := &a.rec, &b.rec
	if ra.Worker != rb.Worker || ra.Mode != rb.Mode || (ra.Rank == nil) != (rb.Rank == nil) {
		return false
	}
	return ra.Rank == nil || *ra.Rank == *rb.Rank
}
