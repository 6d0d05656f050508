package bridge

import (
	"errors"
	"testing"
)

// TestHealthFailuresInARow: one or two failed /health checks (a busy
// engine) leave the worker healthy; HealthFailures in a row make it
// unhealthy, and one success makes it healthy again.
func TestHealthFailuresInARow(t *testing.T) {
	cfg, err := Config{EngineURL: "http://127.0.0.1:1", Model: testModel, WorkerID: "w", RouterBlockSize: testBlock,
		KVEvents: "tcp://127.0.0.1:1", Topic: "kv"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HealthFailures != DefaultHealthFailures {
		t.Fatalf("default HealthFailures %d, want %d", cfg.HealthFailures, DefaultHealthFailures)
	}
	br := &Bridge{cfg: cfg, met: newMetrics(false), healthy: true}
	fail := errors.New("health: status 503")
	steps := []struct {
		err         error
		wantHealthy bool
		wantLost    bool
	}{
		{fail, true, false},
		{fail, true, false},
		{nil, true, false}, // a success resets the count
		{fail, true, false},
		{fail, true, false},
		{fail, false, true}, // the third in a row
		{fail, false, false},
		{nil, true, false},
	}
	for i, s := range steps {
		lost := br.recordHealth(s.err)
		if br.healthy != s.wantHealthy || lost != s.wantLost {
			t.Fatalf("step %d (err %v): healthy %v lost %v, want %v %v", i, s.err, br.healthy, lost, s.wantHealthy, s.wantLost)
		}
	}
}
