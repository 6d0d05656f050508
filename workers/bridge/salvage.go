package bridge

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// salvage re-reads a KVEventBatch that did not decode as a whole, one event
// at a time, so that one bad event does not lose the others: it splits the
// envelope ([ts, events, dp_rank...] or {"ts", "events",
// "data_parallel_rank"}) with a generic msgpack reader, wraps each event in a
// batch of its own, [ts, [event], dp_rank], and hands that to try. It
// returns how many events try refused, and an error when the envelope
// itself cannot be read (nothing of the batch is usable). This path runs
// only for bad input, so it favours a well-kept library over speed.
func salvage(payload []byte, buf *[]byte, try func(single []byte) bool) (bad int, err error) {
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
		if !try(b) {
			bad++
		}
	}
	return bad, nil
}

var msgpackNil = []byte{0xc0}

// splitEnvelope returns the raw ts, each raw event and the raw dp_rank (nil
// when absent) of a batch.
func splitEnvelope(payload []byte) (ts []byte, events []msgpack.RawMessage, rank []byte, err error) {
	dec := msgpack.NewDecoder(bytes.NewReader(payload))
	code, err := dec.PeekCode()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("batch envelope: %w", err)
	}
	var tsRaw, evRaw, rankRaw msgpack.RawMessage
	if msgpackIsMap(code) {
		var m map[string]msgpack.RawMessage
		if err := dec.Decode(&m); err != nil {
			return nil, nil, nil, fmt.Errorf("batch envelope: %w", err)
		}
		tsRaw, evRaw, rankRaw = m["ts"], m["events"], m["data_parallel_rank"]
	} else {
		var a []msgpack.RawMessage
		if err := dec.Decode(&a); err != nil {
			return nil, nil, nil, fmt.Errorf("batch envelope: %w", err)
		}
		if len(a) < 2 {
			return nil, nil, nil, fmt.Errorf("batch envelope of %d elements, want at least 2", len(a))
		}
		tsRaw, evRaw = a[0], a[1]
		if len(a) > 2 {
			rankRaw = a[2]
		}
	}
	if tsRaw == nil || evRaw == nil {
		return nil, nil, nil, errors.New("batch envelope without ts or events")
	}
	if err := msgpack.Unmarshal(evRaw, &events); err != nil {
		return nil, nil, nil, fmt.Errorf("batch events: %w", err)
	}
	if rankRaw == nil {
		rankRaw = msgpackNil
	}
	return tsRaw, events, rankRaw, nil
}

func msgpackIsMap(c byte) bool { return (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf }
