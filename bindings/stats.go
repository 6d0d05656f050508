package bindings

import (
	"sync/atomic"
	"time"
)

// Stats are the table's counters since Open, for the host to export as
// metrics. Outcomes are counted per Route call.
type Stats struct {
	Created, Renewed, Fresh, Rebound, Rejected, KeptOther uint64

	// Writes is every conditional write sent (create, renew, re-bind, end).
	Writes uint64
	// Conflicts is writes that lost (codes 10071/10164).
	Conflicts uint64
	// Ambiguous is writes that got no answer; each was resolved by a leader
	// read. AmbiguousLanded counts those that turned out to have landed;
	// Unresolved those the leader could not be asked about in time.
	Ambiguous, AmbiguousLanded, Unresolved uint64
	// ConflictsLanded is writes answered as conflicts that had landed all
	// the same: the conflict answered a second copy of the write (a
	// publish delivered twice while the network heals), refused by the
	// leader while the first copy was in flight (commit.round).
	ConflictsLanded uint64
	// InFlightWaits is re-reads after a conflict that found the key
	// unchanged because the winning write was still in flight (R3).
	InFlightWaits uint64
	// Exhausted is Route/End calls that gave up after MaxAttempts.
	Exhausted uint64
	// Waits is first requests that waited for a concurrent creator of the
	// same session in this replica.
	Waits uint64
	// BadInput is rejected session ids and model names; Malformed is reads
	// that found an unusable stored value; SelectErrors is selector errors.
	BadInput, Malformed, SelectErrors uint64
	// LeaderReads is reads of a key from the stream leader (STREAM.MSG.GET,
	// or a direct get on a one-replica stream); ReadRetries those repeated
	// because nobody answered (leader change); DirectFallbacks direct gets
	// whose answer did not count (an absence, a mirror's answer, an error),
	// so STREAM.MSG.GET was asked too (store.go, leaderReadOnce).
	LeaderReads, ReadRetries, DirectFallbacks uint64
	// Ended is bindings removed by End.
	Ended uint64

	// StaleFallbacks is first reads sent to the leader because the cache
	// could not show it was at most MaxStaleness behind the bucket;
	// HardReads those sent there because the cache held a Hard binding.
	StaleFallbacks, HardReads uint64
	// Probes is answered freshness probes (quorum marks the majority
	// accepted, quorum.go); ProbeErrors those that got no answer.
	Probes, ProbeErrors uint64
	// Confirms is leader reads confirmed through the majority (quorum.go;
	// none on a one-replica stream); ConfirmMismatches those whose key had
	// moved on, so the read was made again; ConfirmTimeouts those that got
	// no answer (a leader cut off from its peers cannot commit one);
	// ConfirmsRefused those a full bucket refused (the read then stands
	// unconfirmed, quorum.go).
	Confirms, ConfirmMismatches, ConfirmTimeouts, ConfirmsRefused uint64
	// WatchRestarts is watches ended or found stalled and started again
	// (with a cache rebuilt from nothing).
	WatchRestarts uint64
	// RenewalsRefused is renewals the server refused because the bucket
	// was full (ErrFull); the request was served under the binding.
	RenewalsRefused uint64

	CacheHits, CacheMisses, CacheEvictions uint64
	CacheEntries                           int
	// CacheComplete is false once the cache evicted an entry (or under
	// StrictReads): misses are then confirmed on the leader.
	CacheComplete bool
	// CacheFresh reports whether the cache may answer reads now: it is
	// shown to be at most MaxStaleness behind the bucket. CacheAge is how
	// far behind it may be (-1 when nothing has been shown since the watch
	// started).
	CacheFresh bool
	CacheAge   time.Duration
}

// Outcome returns the counter of one outcome.
func (s Stats) Outcome(o Outcome) uint64 {
	switch o {
	case Created:
		return s.Created
	case Renewed:
		return s.Renewed
	case Fresh:
		return s.Fresh
	case Rebound:
		return s.Rebound
	case Rejected:
		return s.Rejected
	case KeptOther:
		return s.KeptOther
	}
	return 0
}

type counters struct {
	outcome                                  [numOutcomes]atomic.Uint64
	writes, conflicts                        atomic.Uint64
	ambiguous, ambiguousLanded, unresolved   atomic.Uint64
	exhausted, waits, inFlightWaits          atomic.Uint64
	conflictsLanded                          atomic.Uint64
	badInput, malformed, selectErrors, ended atomic.Uint64
	leaderReads, readRetries                 atomic.Uint64
	directFallbacks                          atomic.Uint64
	staleFallbacks, hardReads                atomic.Uint64
	probes, probeErrors, watchRestarts       atomic.Uint64
	confirms, confirmMismatches, confirmLost atomic.Uint64
	confirmsRefused                          atomic.Uint64
	renewalsRefused                          atomic.Uint64
}

// Stats returns a snapshot of the counters.
func (t *Table) Stats() Stats {
	c := &t.st
	now := time.Now()
	age, ok := t.proof.age(now)
	if !ok || t.cfg.StrictReads {
		age = -1
	}
	return Stats{
		Created:           c.outcome[Created].Load(),
		Renewed:           c.outcome[Renewed].Load(),
		Fresh:             c.outcome[Fresh].Load(),
		Rebound:           c.outcome[Rebound].Load(),
		Rejected:          c.outcome[Rejected].Load(),
		KeptOther:         c.outcome[KeptOther].Load(),
		Writes:            c.writes.Load(),
		Conflicts:         c.conflicts.Load(),
		Ambiguous:         c.ambiguous.Load(),
		AmbiguousLanded:   c.ambiguousLanded.Load(),
		Unresolved:        c.unresolved.Load(),
		InFlightWaits:     c.inFlightWaits.Load(),
		ConflictsLanded:   c.conflictsLanded.Load(),
		Exhausted:         c.exhausted.Load(),
		Waits:             c.waits.Load(),
		BadInput:          c.badInput.Load(),
		Malformed:         c.malformed.Load(),
		SelectErrors:      c.selectErrors.Load(),
		LeaderReads:       c.leaderReads.Load(),
		ReadRetries:       c.readRetries.Load(),
		DirectFallbacks:   c.directFallbacks.Load(),
		Ended:             c.ended.Load(),
		CacheHits:         t.cache.hits.Load(),
		CacheMisses:       t.cache.misses.Load(),
		CacheEvictions:    t.cache.evictions.Load(),
		CacheEntries:      t.cache.len(),
		CacheComplete:     !t.cache.incomplete.Load() && !t.cfg.StrictReads,
		CacheFresh:        t.cacheFresh(now),
		CacheAge:          age,
		StaleFallbacks:    c.staleFallbacks.Load(),
		HardReads:         c.hardReads.Load(),
		Probes:            c.probes.Load(),
		ProbeErrors:       c.probeErrors.Load(),
		Confirms:          c.confirms.Load(),
		ConfirmMismatches: c.confirmMismatches.Load(),
		ConfirmTimeouts:   c.confirmLost.Load(),
		ConfirmsRefused:   c.confirmsRefused.Load(),
		WatchRestarts:     c.watchRestarts.Load(),
		RenewalsRefused:   c.renewalsRefused.Load(),
	}
}
