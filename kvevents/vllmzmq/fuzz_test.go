package vllmzmq

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzParseKVEventsConfig: any input gives a config that validates or an
// error wrapping ErrBadConfig, never a panic.
func FuzzParseKVEventsConfig(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}`,
		`{"enable_kv_cache_events": true, "endpoint": "ipc:///tmp/x", "buffer_steps": 1, "hwm": 0, "topic": "kv@p@m"}`,
		`{"publisher": "kafka"}`, `null`, `[1]`, `{"hwm": 1e99}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseKVEventsConfig(data)
		if err != nil {
			if !errors.Is(err, ErrBadConfig) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("parsed config does not validate: %v", err)
		}
		if cfg.Enabled() {
			if _, err := cfg.ForRank(3); err != nil && !errors.Is(err, ErrBadConfig) {
				t.Fatalf("ForRank: untyped error %v", err)
			}
		}
	})
}

// FuzzParseFrames: the live-message and replay-reply frame parsers accept
// or reject any frames without panicking, and what they accept keeps the
// payload it was given. Frames are data cut at each 0x00 0xff pair.
func FuzzParseFrames(f *testing.F) {
	f.Add([]byte("kv\x00\xff\x00\x00\x00\x00\x00\x00\x00\x07\x00\xffpayload"))
	f.Add([]byte("\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\x00\xff"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		frames := bytes.Split(data, []byte{0x00, 0xff})
		if m, err := parseMessage(frames); err == nil && !bytes.Equal(m.Payload, frames[2]) {
			t.Fatalf("message payload %q, frame %q", m.Payload, frames[2])
		}
		if m, end, err := parseReply(frames); err == nil && !end && len(m.Payload) == 0 {
			t.Fatalf("a batch with an empty payload is the end marker: %+v", m)
		}
	})
}
