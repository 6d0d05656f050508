package vllmzmq

import (
	"errors"
	"strings"
	"testing"
)

func TestParseKVEventsConfig(t *testing.T) {
	def := DefaultConfig()
	for _, tc := range []struct {
		name    string
		json    string
		want    Config
		enabled bool
		err     string // substring of the error; "" = success
	}{
		{name: "empty object is vLLM's defaults, disabled", json: `{}`, want: def},
		{
			name: "vLLM docs example", enabled: true,
			json: `{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv@pod-1@m"}`,
			want: Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://*:5557", ReplayEndpoint: "tcp://*:5558",
				BufferSteps: DefaultBufferSteps, HWM: DefaultHWM, MaxQueueSize: DefaultMaxQueueSize, Topic: "kv@pod-1@m"},
		},
		{
			name: "publisher defaults to zmq when enabled", enabled: true,
			json: `{"enable_kv_cache_events": true, "buffer_steps": 5, "hwm": 0, "max_queue_size": 7, "replay_endpoint": null}`,
			want: Config{EnableKVCacheEvents: true, Endpoint: DefaultEndpoint, BufferSteps: 5, HWM: 0, MaxQueueSize: 7},
		},
		{
			name: "zmq publisher without enable stays off",
			json: `{"publisher": "zmq", "endpoint": "tcp://*:6000"}`,
			want: Config{Publisher: "zmq", Endpoint: "tcp://*:6000", BufferSteps: DefaultBufferSteps, HWM: DefaultHWM, MaxQueueSize: DefaultMaxQueueSize},
		},
		{
			name: "unknown fields of later vLLM releases are ignored", enabled: true,
			json: `{"enable_kv_cache_events": true, "snapshot_endpoint": "tcp://*:5559", "future": {"x": [1]}}`,
			want: Config{EnableKVCacheEvents: true, Endpoint: DefaultEndpoint, BufferSteps: DefaultBufferSteps, HWM: DefaultHWM, MaxQueueSize: DefaultMaxQueueSize},
		},
		{name: "unknown publisher", json: `{"enable_kv_cache_events": true, "publisher": "kafka"}`, err: `publisher "kafka"`},
		{name: "unknown publisher even when disabled", json: `{"publisher": "nats"}`, err: `publisher "nats"`},
		{name: "not JSON", json: `enable_kv_cache_events=true`, err: "want a JSON object"},
		{name: "JSON null", json: `null`, err: "want a JSON object"},
		{name: "empty", json: ``, err: "want a JSON object"},
		{name: "truncated", json: `{"enable_kv_cache_events": tr`, err: "bad kv-events config"},
		{name: "wrong type", json: `{"hwm": "many"}`, err: "hwm"},
		{name: "bad transport", json: `{"enable_kv_cache_events": true, "endpoint": "udp://*:5557"}`, err: `transport "udp"`},
		{name: "no port", json: `{"enable_kv_cache_events": true, "endpoint": "tcp://localhost"}`, err: "no port"},
		{name: "port out of range", json: `{"enable_kv_cache_events": true, "replay_endpoint": "tcp://*:70000"}`, err: `port "70000"`},
		{name: "zero buffer", json: `{"enable_kv_cache_events": true, "buffer_steps": 0}`, err: "buffer_steps 0"},
		{name: "connect to port 0", json: `{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:0"}`, err: "connects (only a wildcard host"},
		{name: "negative hwm", json: `{"enable_kv_cache_events": true, "hwm": -1}`, err: "hwm -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseKVEventsConfig([]byte(tc.json))
			if tc.err != "" {
				if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want ErrBadConfig mentioning %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
			if got.Enabled() != tc.enabled {
				t.Fatalf("Enabled() = %v", got.Enabled())
			}
		})
	}
}

func TestOffsetEndpoint(t *testing.T) {
	for _, tc := range []struct {
		ep   string
		rank int
		want string
		err  string
	}{
		{"tcp://*:5557", 0, "tcp://*:5557", ""},
		{"tcp://*:5557", 3, "tcp://*:5560", ""},
		{"tcp://10.0.0.7:5558", 1, "tcp://10.0.0.7:5559", ""},
		{"tcp://[::]:5557", 2, "tcp://[::]:5559", ""},
		{"tcp://*:0", 5, "tcp://*:0", ""}, // ephemeral ports are not offset
		{"inproc://cache", 2, "inproc://cache_dp2", ""},
		{"ipc:///tmp/kv", 1, "ipc:///tmp/kv_dp1", ""},
		{"", 4, "", ""},
		{"tcp://*:65535", 1, "", "above 65535"},
		{"tcp://*:5557", -1, "", "negative rank"},
		{"5557", 1, "", "not transport://address"},
	} {
		got, err := OffsetEndpoint(tc.ep, tc.rank)
		if tc.err != "" {
			if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("OffsetEndpoint(%q, %d) error %v, want %q", tc.ep, tc.rank, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("OffsetEndpoint(%q, %d) = %q, %v; want %q", tc.ep, tc.rank, got, err, tc.want)
		}
	}
	cfg := Config{EnableKVCacheEvents: true, Endpoint: "tcp://*:5557", ReplayEndpoint: "tcp://*:5558"}
	r2, err := cfg.ForRank(2)
	if err != nil || r2.Endpoint != "tcp://*:5559" || r2.ReplayEndpoint != "tcp://*:5560" {
		t.Fatalf("ForRank(2) = %+v, %v", r2, err)
	}
}

func TestBinds(t *testing.T) {
	for ep, want := range map[string]bool{
		"tcp://*:5557":          true,
		"tcp://0.0.0.0:5557":    true,
		"tcp://[::]:5557":       true,
		"ipc:///tmp/kv-events":  true,
		"inproc://kv":           true,
		"tcp://127.0.0.1:5557":  false,
		"tcp://scheduler:5557":  false,
		"tcp://[fe80::1]:5557":  true, // "::" appears: vLLM's substring rule binds it
		"tcp://10.1.2.3:5557":   false,
		"tcp://localhost:0":     false,
		"tcp://kv.example:5557": false,
	} {
		if got := Binds(ep); got != want {
			t.Errorf("Binds(%q) = %v, want %v", ep, got, want)
		}
	}
}
