package doccheck

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/workers"
)

// TestRegistryAsDocumented registers a worker the way docs/protocol.md
// ("Worker side: the lease, as NATS messages") tells a worker in any
// language to: plain NATS requests with the documented subject, headers and
// JSON value, no nats.go KV client. The routers' membership view must see
// each step, and the server must answer with the documented error codes.
func TestRegistryAsDocumented(t *testing.T) {
	s := natstest.Start(t)
	_, js := natstest.JetStream(t, s)
	nc := natstest.Connect(t, s) // the "worker": raw requests only

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A router replica creates the bucket and watches it.
	quiet := slog.New(slog.DiscardHandler)
	// A short departure grace, so that the crash below is confirmed soon.
	m, err := workers.WatchMembership(ctx, js, workers.RegistryConfig{Logger: quiet, DepartureGrace: time.Second}, workers.Callbacks{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Stop()
	if err := m.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	// The protocol's key example, and its subject.
	const id, key = "node-1.gpu/0", "node-1=2Egpu=2F0"
	if got := workers.KeyFor(id); got != key {
		t.Fatalf("KeyFor(%q) = %q, the protocol says %q", id, got, key)
	}
	doc := readDoc(t, "docs/protocol.md")
	if !strings.Contains(doc, "`node-1.gpu/0` → `node-1=2Egpu=2F0`") {
		t.Fatal("docs/protocol.md no longer gives the key example this test checks")
	}
	subject := "$KV.kvr-workers." + key
	value := func(state string) []byte {
		return fmt.Appendf(nil, `{"v":1,"id":%q,"model":"m","endpoint":"kvr.worker.m.w.generate","ranks":[0],`+
			`"block_size":16,"kv_blocks":1024,"max_batched_tokens":8192,"max_seqs":8,"epoch":7,"state":%q}`, id, state)
	}
	live := func(want bool) {
		t.Helper()
		testutil.Eventually(t, 5*time.Second, func() bool { return m.Live(id) == want },
			func() string { return fmt.Sprintf("membership Live(%q) never became %v", id, want) })
	}

	// 1. Create: expected last subject sequence 0, Nats-TTL as a Go duration.
	rev := publishOK(t, nc, subject, value("ready"), "0", "3s", nil)
	live(true)
	// Creating again while the key lives is 10071.
	publishFails(t, nc, subject, value("ready"), "0", "3s", nil, 10071)

	// 4. Renew: expect the revision held; Nats-TTL as bare seconds also works.
	old := rev
	rev = publishOK(t, nc, subject, value("ready"), fmt.Sprint(rev), "3", nil)
	// A renewal on a stale revision is a lost compare-and-set.
	publishFails(t, nc, subject, value("ready"), fmt.Sprint(old), "3s", nil, 10071)
	// A TTL under one second is refused.
	publishFails(t, nc, subject, value("ready"), fmt.Sprint(rev), "500ms", nil, 10165)

	// 6. Draining: the same renewal with the state in the value.
	rev = publishOK(t, nc, subject, value("draining"), fmt.Sprint(rev), "3s", nil)
	testutil.Eventually(t, 5*time.Second, func() bool { return m.Live(id) && !m.Available(id) },
		func() string { return "the draining worker is still available (or gone)" })

	// 7. Deregister: a purge with the documented headers and body, an
	// explicit departure: confirmed at once, without the grace.
	purge := map[string]string{"KV-Operation": "PURGE", "Nats-Rollup": "sub"}
	marker := publishOK(t, nc, subject, []byte(`{"departure":"deregistered"}`), fmt.Sprint(rev), "1m0s", purge)
	if !strings.Contains(doc, "`{\"departure\":\"deregistered\"}`") {
		t.Fatal("docs/protocol.md no longer gives the Deregister body this test sends")
	}
	live(false)
	if m.Stats().Suspected != 0 {
		t.Fatalf("the deregistered worker was suspect first: %+v", m.Stats())
	}

	// 2. Create over the purge marker: expecting 0 fails, the leader read
	// shows the marker, and expecting the marker's sequence succeeds.
	publishFails(t, nc, subject, value("ready"), "0", "1s", nil, 10071)
	seq, hdr := leaderRead(t, nc, subject)
	if seq != marker || hdr.Get("KV-Operation") != "PURGE" {
		t.Fatalf("leader read after deregister: seq %d headers %v, want the purge marker at %d", seq, hdr, marker)
	}
	publishOK(t, nc, subject, value("ready"), fmt.Sprint(marker), "1s", nil)
	live(true)

	// 8. A crash: no renewal. The key expires after its TTL (1 s), routers
	// hold the worker suspect, then depart it once the grace passes; the
	// server's marker says why.
	testutil.Eventually(t, 5*time.Second, func() bool { return m.Suspect(id) },
		func() string { return fmt.Sprintf("the expired worker never became suspect: %+v", m.Stats()) })
	live(false)
	seq, hdr = leaderRead(t, nc, subject)
	if hdr.Get("Nats-Marker-Reason") != "MaxAge" {
		t.Fatalf("leader read after expiry: seq %d headers %v, want an expiry marker (Nats-Marker-Reason: MaxAge)", seq, hdr)
	}
	// 5. Re-create over the expiry marker, expecting its sequence.
	publishOK(t, nc, subject, value("ready"), fmt.Sprint(seq), "3s", nil)
	live(true)

	// The value's "v" is required (unlike the route API's): a value without
	// it is malformed and the worker never joins.
	const other = "w-no-version"
	noV := fmt.Appendf(nil, `{"id":%q,"model":"m","endpoint":"e","ranks":[0],"block_size":16,"kv_blocks":1,`+
		`"max_batched_tokens":1,"max_seqs":1,"epoch":9,"state":"ready"}`, other)
	before := m.Stats().Malformed
	publishOK(t, nc, "$KV.kvr-workers."+workers.KeyFor(other), noV, "0", "3s", nil)
	testutil.Eventually(t, 5*time.Second, func() bool { return m.Stats().Malformed > before },
		func() string { return "a value without \"v\" was not counted as malformed" })
	if m.Live(other) {
		t.Fatalf("worker %q joined with a value without \"v\"", other)
	}
}

// pubAck is the server's answer to a JetStream publish.
type pubAck struct {
	Stream string `json:"stream"`
	Seq    uint64 `json:"seq"`
	Error  *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// publish sends one JetStream publish as a plain NATS request with the
// protocol's two headers (and extra ones) and decodes the ack.
func publish(t *testing.T, nc *nats.Conn, subject string, data []byte, expect, ttl string, extra map[string]string) pubAck {
	t.Helper()
	msg := nats.NewMsg(subject)
	msg.Data = data
	msg.Header.Set("Nats-Expected-Last-Subject-Sequence", expect)
	msg.Header.Set("Nats-TTL", ttl)
	for k, v := range extra {
		msg.Header.Set(k, v)
	}
	reply, err := nc.RequestMsg(msg, 5*time.Second)
	if err != nil {
		t.Fatalf("publish to %s: %v", subject, err)
	}
	var ack pubAck
	if err := json.Unmarshal(reply.Data, &ack); err != nil {
		t.Fatalf("publish to %s: ack %q: %v", subject, reply.Data, err)
	}
	return ack
}

func publishOK(t *testing.T, nc *nats.Conn, subject string, data []byte, expect, ttl string, extra map[string]string) uint64 {
	t.Helper()
	ack := publish(t, nc, subject, data, expect, ttl, extra)
	if ack.Error != nil || ack.Seq == 0 || ack.Stream != "KV_kvr-workers" {
		t.Fatalf("publish expecting %s with TTL %s: %+v (error %+v), want a revision in KV_kvr-workers", expect, ttl, ack, ack.Error)
	}
	return ack.Seq
}

func publishFails(t *testing.T, nc *nats.Conn, subject string, data []byte, expect, ttl string, extra map[string]string, code int) {
	t.Helper()
	ack := publish(t, nc, subject, data, expect, ttl, extra)
	if ack.Error == nil || ack.Error.ErrCode != code {
		t.Fatalf("publish expecting %s with TTL %s: %+v (error %+v), want error code %d", expect, ttl, ack, ack.Error, code)
	}
}

// leaderRead is the documented read after a conflict: STREAM.MSG.GET with
// last_by_subj, answered by the stream leader.
func leaderRead(t *testing.T, nc *nats.Conn, subject string) (uint64, nats.Header) {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"last_by_subj": subject})
	reply, err := nc.Request("$JS.API.STREAM.MSG.GET.KV_kvr-workers", body, 5*time.Second)
	if err != nil {
		t.Fatalf("leader read of %s: %v", subject, err)
	}
	var resp struct {
		Message *struct {
			Seq  uint64 `json:"seq"`
			Hdrs []byte `json:"hdrs"`
		} `json:"message"`
		Error *struct {
			ErrCode int `json:"err_code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil || resp.Message == nil {
		t.Fatalf("leader read of %s: %q (%v)", subject, reply.Data, err)
	}
	hdr := nats.Header{}
	if len(resp.Message.Hdrs) > 0 {
		if hdr, err = nats.DecodeHeadersMsg(resp.Message.Hdrs); err != nil {
			t.Fatalf("leader read of %s: headers: %v", subject, err)
		}
	}
	return resp.Message.Seq, hdr
}
