package workers

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func validLoad() LoadReport {
	return LoadReport{Model: "meta-llama/Llama-3.1-8B", Worker: "w.1", Rank: 1, ActiveRequests: 4, WaitingRequests: 2,
		KVUsedBlocks: 100, KVTotalBlocks: 16384, PrefillTokens: 2048, At: time.Unix(1700000000, 5).UTC()}
}

func TestLoadSubject(t *testing.T) {
	tests := []struct{ prefix, model, worker, want string }{
		{"kvr", "m", "w1", "kvr.load.m.w1"},
		{"", "m", "w1", "kvr.load.m.w1"},
		{"acme.kvr", "meta-llama/Llama-3.1-8B", "w.1", "acme.kvr.load.meta-llama/Llama-3%2E1-8B.w%2E1"},
		{"kvr", "a b", "*>", "kvr.load.a%20b.%2A%3E"},
	}
	for _, tc := range tests {
		if got := LoadSubject(tc.prefix, tc.model, tc.worker); got != tc.want {
			t.Errorf("LoadSubject(%q,%q,%q) = %q, want %q", tc.prefix, tc.model, tc.worker, got, tc.want)
		}
	}
	if got := LoadFilter("kvr", ""); got != "kvr.load.*.*" {
		t.Errorf("LoadFilter all = %q", got)
	}
	if got := LoadFilter("kvr", "a.b"); got != "kvr.load.a%2Eb.*" {
		t.Errorf("LoadFilter model = %q", got)
	}
}

func TestLoadValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*LoadReport)
		ok   bool
	}{
		{"valid", func(*LoadReport) {}, true},
		{"unknown total", func(r *LoadReport) { r.KVTotalBlocks = 0 }, true},
		{"no model", func(r *LoadReport) { r.Model = "" }, false},
		{"no worker", func(r *LoadReport) { r.Worker = "" }, false},
		{"negative active", func(r *LoadReport) { r.ActiveRequests = -1 }, false},
		{"negative prefill", func(r *LoadReport) { r.PrefillTokens = -5 }, false},
		{"used > total", func(r *LoadReport) { r.KVUsedBlocks = r.KVTotalBlocks + 1 }, false},
		{"no time", func(r *LoadReport) { r.At = time.Time{} }, false},
	}
	for _, tc := range tests {
		r := validLoad()
		tc.mod(&r)
		err := r.Validate()
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalidLoad)) {
			t.Errorf("%s: Validate = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func FuzzDecodeLoad(f *testing.F) {
	good, _ := EncodeLoad(validLoad())
	f.Add(good)
	f.Add([]byte(`{"model":"m","worker":"w","at":"2024-01-01T00:00:00Z","kv_used_blocks":5}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeLoad(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidLoad) {
				t.Fatalf("error does not wrap ErrInvalidLoad: %v", err)
			}
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("decoded report invalid: %v", err)
		}
	})
}

// loadSink collects delivered reports.
type loadSink struct {
	mu   sync.Mutex
	got  []LoadReport
	cond chan struct{}
}

func newLoadSink() *loadSink { return &loadSink{cond: make(chan struct{}, 1024)} }

func (s *loadSink) handle(r LoadReport) {
	s.mu.Lock()
	s.got = append(s.got, r)
	s.mu.Unlock()
	s.cond <- struct{}{}
}

func (s *loadSink) waitN(t *testing.T, n int, d time.Duration) []LoadReport {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		s.mu.Lock()
		if len(s.got) >= n {
			out := append([]LoadReport(nil), s.got...)
			s.mu.Unlock()
			return out
		}
		have := len(s.got)
		s.mu.Unlock()
		select {
		case <-s.cond:
		case <-timer.C:
			t.Fatalf("got %d load reports within %v, want %d", have, d, n)
		}
	}
}

func TestLoadRoundTrip(t *testing.T) {
	nc, _ := setup(t)
	sink := newLoadSink()
	sub, err := SubscribeLoad(nc, "kvr", "meta-llama/Llama-3.1-8B", sink.handle, WithLoadLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	other := newLoadSink()
	subAll, err := SubscribeLoad(nc, "", "", other.handle, WithLoadLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer subAll.Stop()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	want := validLoad()
	if err := PublishLoad(nc, "kvr", want); err != nil {
		t.Fatal(err)
	}
	m2 := validLoad()
	m2.Model = "other-model"
	if err := PublishLoad(nc, "kvr", m2); err != nil {
		t.Fatal(err)
	}
	got := sink.waitN(t, 1, 2*time.Second)
	if !got[0].At.Equal(want.At) {
		t.Fatalf("At = %v, want %v", got[0].At, want.At)
	}
	got[0].At = want.At
	if got[0] != want {
		t.Fatalf("got %+v, want %+v", got[0], want)
	}
	other.waitN(t, 2, 2*time.Second) // the unfiltered subscription sees both models

	bad := validLoad()
	bad.ActiveRequests = -1
	if err := PublishLoad(nc, "kvr", bad); !errors.Is(err, ErrInvalidLoad) {
		t.Fatalf("PublishLoad(invalid) = %v", err)
	}
	noTime := validLoad()
	noTime.At = time.Time{}
	if err := PublishLoad(nc, "kvr", noTime); err != nil {
		t.Fatalf("PublishLoad fills a zero At: %v", err)
	}
	sink.waitN(t, 2, 2*time.Second)
}

// Bad messages on load subjects are counted and skipped; good ones after
// them still arrive.
func TestSubscribeLoadSkipsBadMessages(t *testing.T) {
	nc, _ := setup(t)
	sink := newLoadSink()
	sub, err := SubscribeLoad(nc, "kvr", "", sink.handle, WithLoadLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	good, _ := EncodeLoad(validLoad())
	subj := LoadSubject("kvr", validLoad().Model, validLoad().Worker)
	negative := strings.Replace(string(good), `"active_requests":4`, `"active_requests":-4`, 1)
	for _, m := range []struct{ subj, data string }{
		{subj, "garbage"},
		{subj, negative},
		{subj, `{"model":"m"}`},
		{"kvr.load.x.y", string(good)}, // subject does not name the report's worker
		{subj, strings.Repeat(" ", MaxLoadReportBytes+1)},
	} {
		if err := nc.Publish(m.subj, []byte(m.data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Publish(subj, good); err != nil {
		t.Fatal(err)
	}
	sink.waitN(t, 1, 2*time.Second)
	received, invalid := sub.Stats()
	if received != 1 || invalid != 4 || sub.Mismatched() != 1 {
		t.Fatalf("received %d invalid %d mismatched %d, want 1, 4 and 1", received, invalid, sub.Mismatched())
	}
}

// A worker allowed to publish on its own load subject cannot report for
// another: the report is rejected, counted as mismatched, and logged once
// for the episode, however many follow.
func TestSubscribeLoadRejectsForeignWorker(t *testing.T) {
	nc, _ := setup(t)
	sink := newLoadSink()
	logs := &countingHandler{}
	sub, err := SubscribeLoad(nc, "kvr", "", sink.handle, WithLoadLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	victim := validLoad()
	forged, _ := EncodeLoad(victim) // says it is the victim's load...
	evil := LoadSubject("kvr", victim.Model, "w-evil")
	for range 3 {
		if err := nc.Publish(evil, forged); err != nil { // ...on the attacker's own subject
			t.Fatal(err)
		}
	}
	good, _ := EncodeLoad(victim)
	if err := nc.Publish(LoadSubject("kvr", victim.Model, victim.Worker), good); err != nil {
		t.Fatal(err)
	}
	got := sink.waitN(t, 1, 2*time.Second)
	if received, invalid := sub.Stats(); received != 1 || invalid != 0 || sub.Mismatched() != 3 {
		t.Fatalf("received %d invalid %d mismatched %d, want 1, 0 and 3", received, invalid, sub.Mismatched())
	}
	if got[0].Worker != victim.Worker {
		t.Fatalf("delivered %+v", got[0])
	}
	if n := logs.warnings.Load(); n != 1 {
		t.Fatalf("%d warnings for one episode of forged reports, want 1", n)
	}
}

// countingHandler counts warnings.
type countingHandler struct{ warnings atomic.Int32 }

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn {
		h.warnings.Add(1)
	}
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

func TestLoadReporter(t *testing.T) {
	nc, _ := setup(t)
	sink := newLoadSink()
	sub, err := SubscribeLoad(nc, "kvr", "", sink.handle, WithLoadLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	active := 0
	src := func() []LoadReport {
		mu.Lock()
		defer mu.Unlock()
		active++
		r0, r1 := validLoad(), validLoad()
		r0.Rank, r1.Rank = 0, 1
		r0.ActiveRequests, r1.ActiveRequests = active, active
		r0.At, r1.At = time.Time{}, time.Time{} // the reporter stamps them
		bad := validLoad()
		bad.KVUsedBlocks = -1 // counted as failed, not published
		return []LoadReport{r0, r1, bad}
	}
	lr, err := StartLoadReporter(nc, LoadReporterConfig{Prefix: "kvr", Interval: 50 * time.Millisecond, Source: src,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	got := sink.waitN(t, 6, 2*time.Second) // three rounds
	lr.Stop()
	lr.Stop()
	ranks := map[uint32]int{}
	for _, r := range got {
		ranks[r.Rank]++
		if r.At.IsZero() || r.ActiveRequests < 1 {
			t.Fatalf("report %+v", r)
		}
	}
	if ranks[0] < 3 || ranks[1] < 3 {
		t.Fatalf("per-rank counts %v", ranks)
	}
	sent, failed := lr.Published()
	if sent < 6 || failed < 3 {
		t.Fatalf("sent %d failed %d", sent, failed)
	}
	if _, err := StartLoadReporter(nc, LoadReporterConfig{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("reporter without Source: %v", err)
	}
}
