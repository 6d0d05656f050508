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

// splitEnvelope returns the raw ts, each raw event and the raw dp_rank
// (msgpack nil when absent) of a batch. Every declared length is checked
// against the bytes left before anything is allocated for it (each element
// takes at least one byte).
func splitEnvelope(payload []byte) (ts []byte, events [][]byte, rank []byte, err error) {
	dec := msgpack.NewDecoder(bytes.NewReader(payload))
	code, err := dec.PeekCode()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("batch envelope: %w", err)
	}
	var tsRaw, evRaw, rankRaw []byte
	if msgpackIsMap(code) {
		n, err := dec.DecodeMapLen()
		if err != nil || n < 0 || n > len(payload) {
			return nil, nil, nil, fmt.Errorf("batch envelope map of %d entries: %v", n, err)
		}
		for range n {
			k, err := dec.DecodeString()
			if err != nil {
				return nil, nil, nil, fmt.Errorf("batch envelope key: %w", err)
			}
			v, err := dec.DecodeRaw()
			if err != nil {
				return nil, nil, nil, fmt.Errorf("batch envelope %q: %w", k, err)
			}
			switch k {
			case "ts":
				tsRaw = v
			case "events":
				evRaw = v
			case "data_parallel_rank":
				rankRaw = v
			}
		}
	} else {
		n, err := dec.DecodeArrayLen()
		if err != nil || n < 2 || n > len(payload) {
			return nil, nil, nil, fmt.Errorf("batch envelope of %d elements, want at least 2: %v", n, err)
		}
		for i := range n {
			v, err := dec.DecodeRaw()
			if err != nil {
				return nil, nil, nil, fmt.Errorf("batch envelope element %d: %w", i, err)
			}
			switch i {
			case 0:
				tsRaw = v
			case 1:
				evRaw = v
			case 2:
				rankRaw = v
			}
		}
	}
	if tsRaw == nil || evRaw == nil {
		return nil, nil, nil, errors.New("batch envelope without ts or events")
	}
	evDec := msgpack.NewDecoder(bytes.NewReader(evRaw))
	n, err := evDec.DecodeArrayLen()
	if err != nil || n < 0 || n > len(evRaw) {
		return nil, nil, nil, fmt.Errorf("batch events: array of %d: %v", n, err)
	}
	for i := range n {
		v, err := evDec.DecodeRaw()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("batch event %d: %w", i, err)
		}
		events = append(events, v)
	}
	if rankRaw == nil {
		rankRaw = msgpackNil
	}
	return tsRaw, events, rankRaw, nil
}

func msgpackIsMap(c byte) bool { return (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf }
