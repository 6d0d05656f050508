package kvevents

import (
	"math"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/workerref"
)

// feed hands batches to a subscriber's per-message step, as the consume
// callback would, numbering stream sequences from 1.
func feed(t *testing.T, sub *Subscriber, batches ...*Batch) {
	t.Helper()
	for _, b := range batches {
		data, err := AppendBatch(nil, b)
		if err != nil {
			t.Fatal(err)
		}
		sub.process(EventSubject("", b.Model, b.Worker), sub.handled.Add(1), data)
	}
}

// One batch whose first id is far beyond the expected one (here 2^64-2) is
// ignored and counted: the worker's real batches, which continue where it
// stood, go on being applied instead of looking like duplicates for the
// rest of the epoch.
func TestSubscriberIgnoresImplausibleIDJump(t *testing.T) {
	sink := &recSink{}
	sub := newSubscriber(nil, SubscriberConfig{Sink: sink})
	feed(t, sub,
		rawBatch("w", 7, 1, 2),
		rawBatch("w", 7, math.MaxUint64-2, 1), // forged: ignored
		rawBatch("w", 7, 3, 2),                // the worker's next batch: applied
		rawBatch("w", 7, 1, 1),                // an old one: still a duplicate
	)
	ids, _ := sink.events()
	if len(ids) != 4 || ids[2] != 3 || ids[3] != 4 {
		t.Fatalf("applied ids %v, want 1..4", ids)
	}
	order, _, _ := sink.snapshot()
	if strings.Join(order, ",") != "apply,apply" {
		t.Fatalf("calls %v, want two applies and no resync", order)
	}
	st := sub.Stats()
	if st.IDJumps != 1 || st.Gaps != 0 || st.Duplicates != 1 || st.Batches != 2 {
		t.Fatalf("stats %+v, want 1 id jump ignored, no gap", st)
	}
}

// A jump the worker's next batch continues is real (a worker that was cut
// off for longer than the window): it is a resync, and the batches after it
// are applied. The same holds backwards, so a baseline pushed far ahead (a
// forged first batch, or a forged snapshot cursor) cannot freeze the worker:
// its real batches confirm themselves.
func TestSubscriberConfirmedIDJumpResyncs(t *testing.T) {
	const far = DefaultMaxIDJump + 10
	cases := []struct {
		name    string
		cursors map[workerref.Target]Cursor
		batches []*Batch
		order   string
		applied []uint64 // first ids of the applied batches
	}{
		{"forward", nil,
			[]*Batch{rawBatch("w", 7, 1, 2), rawBatch("w", 7, far, 1), rawBatch("w", 7, far+1, 1)},
			"apply,resync:gap,apply", []uint64{1, far + 1}},
		{"forged first batch", nil,
			[]*Batch{rawBatch("w", 7, math.MaxUint64-2, 1), rawBatch("w", 7, 1, 1), rawBatch("w", 7, 2, 1)},
			"apply,resync:gap,apply", []uint64{math.MaxUint64 - 2, 2}},
		{"forged snapshot cursor", map[workerref.Target]Cursor{{Worker: "w"}: {Epoch: 7, NextID: math.MaxUint64 - 1}},
			[]*Batch{rawBatch("w", 7, 1, 1), rawBatch("w", 7, 2, 1), rawBatch("w", 7, 3, 1)},
			"resync:gap,apply,apply", []uint64{2, 3}},
		{"jump not continued", nil,
			[]*Batch{rawBatch("w", 7, 1, 1), rawBatch("w", 7, far, 1), rawBatch("w", 7, 2, 1), rawBatch("w", 7, far+1, 1)},
			"apply,apply", []uint64{1, 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sink := &cursorSink{}
			sink.cursors = c.cursors
			sub := newSubscriber(nil, SubscriberConfig{Sink: sink})
			sub.loadCursors()
			feed(t, sub, c.batches...)
			order, signals, batches := sink.snapshot()
			if strings.Join(order, ",") != c.order {
				t.Fatalf("calls %v, want %s", order, c.order)
			}
			var firsts []uint64
			for _, b := range batches {
				firsts = append(firsts, b.FirstEventID)
			}
			if len(firsts) != len(c.applied) {
				t.Fatalf("applied batches starting at %v, want %v", firsts, c.applied)
			}
			for i := range firsts {
				if firsts[i] != c.applied[i] {
					t.Fatalf("applied batches starting at %v, want %v", firsts, c.applied)
				}
			}
			st := sub.Stats()
			if st.IDJumps == 0 {
				t.Fatalf("stats %+v: the jump was not counted", st)
			}
			for _, s := range signals {
				if s.Kind != SignalGap {
					t.Fatalf("signal %+v, want a gap", s)
				}
			}
		})
	}
}

// A batch whose worker or model is not the one its subject names (a
// publisher writing for another worker) is rejected and counted, whichever
// way the names differ; the NATS permissions of a worker cover its own
// subject only, so this is the check that binds the payload to it.
func TestSubscriberRejectsBatchForAnotherSubject(t *testing.T) {
	cases := []struct {
		name, subject string
		b             *Batch
	}{
		{"other worker", EventSubject("", "m", "attacker"), rawBatch("victim", 1, 1, 1)},
		{"other model", EventSubject("", "m2", "victim"), rawBatch("victim", 1, 1, 1)},
		{"worker name prefix", EventSubject("", "m", "vic"), rawBatch("victim", 1, 1, 1)},
		{"unescaped dot", "kvr.events.m.a.b", rawBatch("a.b", 1, 1, 1)},
		{"other prefix", EventSubject("acme", "m", "victim"), rawBatch("victim", 1, 1, 1)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sink := &recSink{}
			sub := newSubscriber(nil, SubscriberConfig{Sink: sink})
			data, err := AppendBatch(nil, c.b)
			if err != nil {
				t.Fatal(err)
			}
			sub.process(c.subject, 1, data)
			if ids, _ := sink.events(); len(ids) != 0 {
				t.Fatalf("applied %v from a batch on %s", ids, c.subject)
			}
			if st := sub.Stats(); st.Mismatched != 1 || st.Bad != 1 {
				t.Fatalf("stats %+v, want 1 mismatched", st)
			}
		})
	}
	// The control: the same batch on its own subject is applied.
	sink := &recSink{}
	sub := newSubscriber(nil, SubscriberConfig{Sink: sink})
	feed(t, sub, rawBatch("a.b", 1, 1, 1))
	if st := sub.Stats(); st.Batches != 1 || st.Bad != 0 {
		t.Fatalf("stats %+v, want the batch on its own subject applied", st)
	}
}
