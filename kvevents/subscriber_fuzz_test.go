package kvevents

import (
	"testing"

	"github.com/kvrouter/kvrouter/workerref"
)

// seqCheckSink checks the Subscriber's ordering promise on every call: for
// each (worker, rank), an applied batch either continues the previous one
// (same epoch, first id = previous next id), or is the first one seen, or
// directly follows a Resync for that worker.
type seqCheckSink struct {
	t       *testing.T
	cur     map[workerref.Target]Cursor
	resynce map[workerref.Target]bool
}

func (s *seqCheckSink) ApplyBatch(_ uint64, b *Batch) {
	k := b.Key()
	c, seen := s.cur[k]
	if seen && !s.resynce[k] && (b.Epoch != c.Epoch || b.FirstEventID != c.NextID) {
		s.t.Fatalf("%v: batch epoch %d ids %d.. applied after epoch %d next %d without a resync",
			k, b.Epoch, b.FirstEventID, c.Epoch, c.NextID)
	}
	if len(b.Events) == 0 {
		s.t.Fatalf("%v: empty batch applied", k)
	}
	s.cur[k] = Cursor{Epoch: b.Epoch, NextID: b.NextEventID()}
	s.resynce[k] = false
}

func (s *seqCheckSink) Resync(sig Signal) { s.resynce[sig.Key()] = true }

// FuzzSubscriberProcess drives the subscriber's per-message step with a
// stream of generated batches (workers, epochs, ids chosen by the fuzzer)
// mixed with raw fuzzer bytes, and checks the ordering promise above. It
// needs no server: process is what the consume callback runs.
func FuzzSubscriberProcess(f *testing.F) {
	f.Add([]byte{0, 1, 1, 2, 0, 1, 5, 2, 0, 1, 5, 2, 0, 1, 6, 3, 0, 2, 1, 1})
	f.Add([]byte{1, 1, 1, 1, 255, 0x97, 0x01, 3, 1, 7, 9, 9})
	f.Fuzz(func(t *testing.T, ops []byte) {
		sink := &seqCheckSink{t: t, cur: map[workerref.Target]Cursor{}, resynce: map[workerref.Target]bool{}}
		sub := newSubscriber(nil, SubscriberConfig{Sink: sink})
		workers := []string{"a", "b", "c"}
		var seq uint64
		for len(ops) >= 4 {
			op, epoch, first, n := ops[0], ops[1], ops[2], int(ops[3]%8)
			ops = ops[4:]
			seq++
			w := workers[int(op)%len(workers)]
			subject := EventSubject("", "m", w)
			if op == 255 { // raw bytes: the rest of the input as one message
				sub.process(subject, seq, ops)
				ops = nil
				break
			}
			b := rawBatch(w, uint64(epoch%3), uint64(first%16), n)
			if first >= 240 { // far beyond the id window, or a confirmation of such a jump
				b = rawBatch(w, uint64(epoch%3), DefaultMaxIDJump*uint64(first-238), n)
			}
			b.Rank = uint32(op>>4) % 2
			data, err := AppendBatch(nil, b)
			if err != nil {
				sub.process(subject, seq, []byte{0xc1}) // counted as bad, skipped
				continue
			}
			sub.process(subject, seq, data)
		}
		if st := sub.Stats(); st.Batches+st.Duplicates+st.Bad+st.IDJumps != st.Messages || st.Messages != seq {
			t.Fatalf("stats %+v after %d messages: every message is applied, a duplicate, an ignored id jump, or bad", st, seq)
		}
	})
}
