package bridge

import (
	"errors"
	"fmt"

	"github.com/kvrouter/kvrouter/internal/msgpack"
)

// salvage re-reads a KVEventBatch that did not decode as a whole, one event
// at a time, so that one bad event does not lose the others: it splits the
// envelope ([ts, events, dp_rank...] or {"ts", "events",
// "data_parallel_rank"}) into raw values with internal/msgpack's Reader,
// wraps each event in a batch of its own, [ts, [event], dp_rank], and hands
// that and the raw event to try (which decodes the batch with
// vllm.DecodeBatch). It returns how many events try refused, and an error
// when the envelope itself cannot be read (nothing of the batch is usable).
func salvage(payload []byte, buf *[]byte, try func(single, event []byte) bool) (bad int, err error) {
	ts, events, rank, err := splitEnvelope(payload)
	if err != nil {
		return 0, err
	}
	for _, ev := range events {
		b := (*buf)[:0]
		b = append(b, 0x93) // fixarray of 3
		b = append(b, ts...)
		b = append(b, 0x91) // fixarray of 1
		b = append(b, ev...)
		b = append(b, rank...)
		*buf = b
		if !try(b, ev) {
			bad++
		}
	}
	return bad, nil
}

var msgpackNil = []byte{0xc0}

// onlyStores reports whether a raw event that did not decode still reads as
// a BlockStored (its tag, first in an array or under "type" in a map):
// losing it only under-counts. Anything else, a removal, a clear, an
// unknown or unreadable tag, may have dropped blocks the routers still hold.
func onlyStores(event []byte) bool {
	r := msgpack.NewReader(event)
	c, err := r.Peek()
	if err != nil {
		return false
	}
	if !msgpack.IsMap(c) {
		if n, err := r.ArrayLen(); err != nil || n < 1 {
			return false
		}
		tag, err := r.Str()
		return err == nil && string(tag) == "BlockStored"
	}
	n, err := r.MapLen()
	if err != nil {
		return false
	}
	stored := false // every "type" key (the decoder keeps the last) says BlockStored
	for range n {
		k, err := r.Str()
		if err != nil {
			return false
		}
		if string(k) != "type" {
			if r.Skip() != nil {
				return false
			}
			continue
		}
		tag, err := r.Str()
		if err != nil || string(tag) != "BlockStored" {
			return false
		}
		stored = true
	}
	return stored
}

// splitEnvelope returns the raw ts, each raw event and the raw dp_rank
// (msgpack nil when absent) of a batch. The Reader checks every declared
// length against the bytes left before anything is allocated for it.
func splitEnvelope(payload []byte) (ts []byte, events [][]byte, rank []byte, err error) {
	r := msgpack.NewReader(payload)
	c, err := r.Peek()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("batch envelope: %w", err)
	}
	var evRaw []byte
	if msgpack.IsMap(c) {
		ts, evRaw, rank, err = envelopeMap(&r)
	} else {
		ts, evRaw, rank, err = envelopeArray(&r)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	if ts == nil || evRaw == nil {
		return nil, nil, nil, errors.New("batch envelope without ts or events")
	}
	er := msgpack.NewReader(evRaw)
	n, err := er.ArrayLen()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("batch events: %w", err)
	}
	events = make([][]byte, 0, n)
	for i := range n {
		v, err := er.Raw()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("batch event %d: %w", i, err)
		}
		events = append(events, v)
	}
	if rank == nil {
		rank = msgpackNil
	}
	return ts, events, rank, nil
}

// envelopeMap returns the raw ts, events and data_parallel_rank of a map
// envelope, keys in any order, other keys skipped.
func envelopeMap(r *msgpack.Reader) (ts, events, rank []byte, err error) {
	n, err := r.MapLen()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("batch envelope map: %w", err)
	}
	for range n {
		k, err := envelopeKey(r)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("batch envelope key: %w", err)
		}
		v, err := r.Raw()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("batch envelope %q: %w", k, err)
		}
		switch string(k) {
		case "ts":
			ts = v
		case "events":
			events = v
		case "data_parallel_rank":
			rank = v
		}
	}
	return ts, events, rank, nil
}

// envelopeArray returns the raw ts, events and dp_rank of an array
// envelope of at least two elements, later ones skipped.
func envelopeArray(r *msgpack.Reader) (ts, events, rank []byte, err error) {
	n, err := r.ArrayLen()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("batch envelope: %w", err)
	}
	if n < 2 {
		return nil, nil, nil, fmt.Errorf("batch envelope of %d elements, want at least 2", n)
	}
	for i := range n {
		v, err := r.Raw()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("batch envelope element %d: %w", i, err)
		}
		switch i {
		case 0:
			ts = v
		case 1:
			events = v
		case 2:
			rank = v
		}
	}
	return ts, events, rank, nil
}

// envelopeKey reads a map key leniently, since salvage exists to keep what
// it can: a string, a byte string, or nil (read as "").
func envelopeKey(r *msgpack.Reader) ([]byte, error) {
	if r.NextIsNil() {
		return nil, nil
	}
	if c, err := r.Peek(); err == nil && msgpack.IsBin(c) {
		return r.Bin()
	}
	return r.Str()
}
