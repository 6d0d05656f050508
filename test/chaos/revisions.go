package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/bindings"
)

// Revision is one binding revision as a test-side watch of the bindings
// stream saw it: what the majority committed, for reading a rejected
// session's history against the bucket. The watch may miss a revision that
// a later one of its key replaced while the watch was cut off (History 1).
type Revision struct {
	Seq     uint64        `json:"seq"`
	Key     string        `json:"key"`
	Op      string        `json:"op,omitempty"` // a delete, purge or expiry marker's KV-Operation
	Worker  string        `json:"worker,omitempty"`
	Version uint64        `json:"version,omitempty"`
	Writer  string        `json:"writer,omitempty"`
	Nonce   string        `json:"nonce,omitempty"`
	Stored  time.Time     `json:"stored"`            // the stream's timestamp (server clock)
	At      time.Duration `json:"at"`                // the same on the recorder's clock (one machine, one clock)
	Seen    time.Duration `json:"seen"`              // when the watch delivered it, on the recorder's clock
	Session string        `json:"session,omitempty"` // the session part of the key
}

// revisions records every binding revision of the model's keys.
type revisions struct {
	mu   sync.Mutex
	revs []Revision
	stop context.CancelFunc
	done chan struct{}
}

// watchRevisions starts an ordered consumer of the bindings stream, filtered
// to the model's binding keys (not the quorum key), on a connection of its
// own; times are put on rec's clock.
func (f *Fleet) watchRevisions(rec *Recorder) *revisions {
	f.t.Helper()
	js, err := jetstream.New(f.Connect(2, nil))
	if err != nil {
		f.t.Fatalf("chaos: revisions watch: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rv := &revisions{stop: cancel, done: make(chan struct{})}
	// Stopped before the fleet closes its connections (cleanups run last
	// in, first out), also when the test ends early.
	f.t.Cleanup(func() { rv.Stop() })
	prefix := "$KV." + BindingsStream[len("KV_"):] + "."
	cons, err := js.OrderedConsumer(ctx, BindingsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{prefix + f.cfg.Model + ".>"}})
	if err != nil {
		cancel()
		f.t.Fatalf("chaos: revisions consumer: %v", err)
	}
	go func() {
		defer close(rv.done)
		for ctx.Err() == nil {
			m, err := cons.Next(jetstream.FetchMaxWait(time.Second))
			if err != nil {
				continue // the cut, a reset of the ordered consumer, or the end
			}
			rv.add(m, prefix, rec)
		}
	}()
	return rv
}

func (rv *revisions) add(m jetstream.Msg, prefix string, rec *Recorder) {
	r := Revision{Key: strings.TrimPrefix(m.Subject(), prefix), Seen: rec.Now(), Op: m.Headers().Get("KV-Operation")}
	if md, err := m.Metadata(); err == nil {
		r.Seq, r.Stored, r.At = md.Sequence.Stream, md.Timestamp, rec.At(md.Timestamp)
	}
	if _, s, err := bindings.ParseKey(r.Key); err == nil {
		r.Session = s
	}
	var v struct {
		Worker  string `json:"worker"`
		Version uint64 `json:"version"`
		Writer  string `json:"writer"`
		Nonce   string `json:"nonce"`
	}
	if json.Unmarshal(m.Data(), &v) == nil {
		r.Worker, r.Version, r.Writer, r.Nonce = v.Worker, v.Version, v.Writer, v.Nonce
	}
	rv.mu.Lock()
	rv.revs = append(rv.revs, r)
	rv.mu.Unlock()
}

// Stop ends the watch and returns what it saw, by session. It may be
// called more than once.
func (rv *revisions) Stop() map[string][]Revision {
	rv.stop()
	<-rv.done
	rv.mu.Lock()
	defer rv.mu.Unlock()
	out := map[string][]Revision{}
	for _, r := range rv.revs {
		out[r.Session] = append(out[r.Session], r)
	}
	return out
}

// WriteRejected writes the whole history of every session porcupine
// rejected (each request with its invoke and return on the recorder's
// clock), interleaved with the revisions of its key that the test's watch
// saw (at the time the watch delivered them), into dir/rejected.txt.
func (r *Report) WriteRejected(dir string, revs map[string][]Revision) (string, error) {
	var b strings.Builder
	for _, s := range r.NonLinear {
		ops := r.ops[s]
		fmt.Fprintf(&b, "=== session %s: %d requests, %d revisions seen\n", s, len(ops), len(revs[s]))
		rs := revs[s]
		for i := range ops {
			for len(rs) > 0 && rs[0].Seen <= ops[i].Invoke {
				fmt.Fprintf(&b, "    %s\n", revLine(&rs[0]))
				rs = rs[1:]
			}
			fmt.Fprintf(&b, "[%8.3fs %8.3fs] %s\n", ops[i].Invoke.Seconds(), ops[i].Return.Seconds(), describe(&ops[i]))
		}
		for i := range rs {
			fmt.Fprintf(&b, "    %s\n", revLine(&rs[i]))
		}
	}
	path := filepath.Join(dir, "rejected.txt")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return "", fmt.Errorf("chaos: write %s: %w", path, err)
	}
	return path, nil
}

func revLine(r *Revision) string {
	if r.Op != "" {
		return fmt.Sprintf("{rev %d stored %8.3fs seen %8.3fs: %s}", r.Seq, r.At.Seconds(), r.Seen.Seconds(), r.Op)
	}
	return fmt.Sprintf("{rev %d stored %8.3fs seen %8.3fs: %s v%d by %s nonce %s}", r.Seq, r.At.Seconds(), r.Seen.Seconds(),
		r.Worker, r.Version, r.Writer, r.Nonce)
}

// WriteHistory writes every request of the run, one JSON object a line,
// into dir/history.jsonl, and the revisions the watch saw into
// dir/revisions.jsonl.
func WriteHistory(dir string, ops []Op, revs map[string][]Revision) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for i := range ops {
		if err := enc.Encode(&ops[i]); err != nil {
			return fmt.Errorf("chaos: encode request %d: %w", i, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "history.jsonl"), b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("chaos: write history: %w", err)
	}
	b.Reset()
	for _, s := range slices.Sorted(maps.Keys(revs)) {
		for i := range revs[s] {
			if err := enc.Encode(&revs[s][i]); err != nil {
				return fmt.Errorf("chaos: encode revision of %s: %w", s, err)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "revisions.jsonl"), b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("chaos: write revisions: %w", err)
	}
	return nil
}
