package jskv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/kvrouter/kvrouter/internal/natstest"
	"github.com/kvrouter/kvrouter/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.IgnoreNATSAsyncReply())
}

func TestAsConflict(t *testing.T) {
	other := &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "unavailable"}
	plain := errors.New("nats: timeout")
	tests := []struct {
		name     string
		err      error
		conflict bool
		code     jetstream.ErrorCode
	}{
		{"nil", nil, false, 0},
		{"10071", &jetstream.APIError{Code: 400, ErrorCode: 10071, Description: "wrong last sequence: 7"}, true, 10071},
		{"10164", &jetstream.APIError{Code: 400, ErrorCode: 10164, Description: "wrong last sequence"}, true, 10164},
		{"10071 wrapped", fmt.Errorf("publish: %w", &jetstream.APIError{Code: 400, ErrorCode: 10071}), true, 10071},
		{"kv key exists", jetstream.ErrKeyExists, true, 10071},
		{"kv revision mismatch", fmt.Errorf("update: %w", jetstream.ErrKeyRevisionMismatch), true, 0},
		{"other api code", other, false, 0},
		{"no answer", plain, false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := AsConflict(tc.err)
			if got := errors.Is(err, ErrConflict); got != tc.conflict {
				t.Fatalf("AsConflict(%v) = %v: conflict %v, want %v", tc.err, err, got, tc.conflict)
			}
			if !tc.conflict {
				if err != tc.err {
					t.Fatalf("AsConflict(%v) = %v, want it unchanged", tc.err, err)
				}
				return
			}
			var ce *ConflictError
			if !errors.As(err, &ce) || !errors.Is(err, tc.err) || err.Error() != tc.err.Error() {
				t.Fatalf("AsConflict(%v) = %#v: want a *ConflictError wrapping it with its text", tc.err, err)
			}
			if tc.code != 0 && ce.Code != tc.code {
				t.Fatalf("code %d, want %d", ce.Code, tc.code)
			}
			if again := AsConflict(err); again != err {
				t.Fatalf("mapping twice wrapped again: %v", again)
			}
		})
	}
}

func TestMsgGetSubject(t *testing.T) {
	tests := []struct{ prefix, want string }{
		{"", "$JS.API.STREAM.MSG.GET.KV_b"},
		{"$JS.API", "$JS.API.STREAM.MSG.GET.KV_b"},
		{"$JS.hub.API", "$JS.hub.API.STREAM.MSG.GET.KV_b"},
		{"$JS.hub.API.", "$JS.hub.API.STREAM.MSG.GET.KV_b"},
	}
	for _, tc := range tests {
		if got := MsgGetSubject(tc.prefix, "b"); got != tc.want {
			t.Errorf("MsgGetSubject(%q) = %q, want %q", tc.prefix, got, tc.want)
		}
	}
}

func TestLastBySubjRequest(t *testing.T) {
	tests := []struct{ subject, want string }{
		{"$KV.b.k", `{"last_by_subj":"$KV.b.k"}`},
		{`$KV.b."q"`, `{"last_by_subj":"$KV.b.\"q\""}`},
		{"$KV.b.é", `{"last_by_subj":"$KV.b.é"}`},
	}
	for _, tc := range tests {
		if got := string(lastBySubjRequest(tc.subject)); got != tc.want {
			t.Errorf("lastBySubjRequest(%q) = %s, want %s", tc.subject, got, tc.want)
		}
	}
}

func TestDecodeMsgGet(t *testing.T) {
	tests := []struct {
		name    string
		reply   string
		wantErr func(error) bool
		seq     uint64
		tomb    bool
	}{
		{"value", `{"message":{"subject":"$KV.b.k","seq":3,"data":"aGk=","time":"2026-01-01T00:00:00Z"}}`, nil, 3, false},
		{"purge marker", `{"message":{"subject":"$KV.b.k","seq":4,"hdrs":"TkFUUy8xLjANCktWLU9wZXJhdGlvbjogUFVSR0UNCg0K"}}`, nil, 4, true},
		{"no message", `{"error":{"code":404,"err_code":10037,"description":"no message found"}}`,
			func(err error) bool { return errors.Is(err, ErrNoMessage) }, 0, false},
		{"other api error", `{"error":{"code":503,"err_code":10008,"description":"unavailable"}}`,
			func(err error) bool {
				var api *jetstream.APIError
				return errors.As(err, &api) && api.ErrorCode == 10008 && !errors.Is(err, ErrNoMessage)
			}, 0, false},
		{"bad json", `{"message":`, func(err error) bool { return err != nil }, 0, false},
		{"empty", `{}`, func(err error) bool { return err != nil }, 0, false},
		{"bad headers", `{"message":{"seq":1,"hdrs":"eHh4"}}`, func(err error) bool { return err != nil }, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := decodeMsgGet([]byte(tc.reply))
			if tc.wantErr != nil {
				if !tc.wantErr(err) {
					t.Fatalf("err = %v", err)
				}
				return
			}
			if err != nil || m.Seq != tc.seq || m.Tombstone() != tc.tomb {
				t.Fatalf("got %+v, %v; want seq %d tombstone %v", m, err, tc.seq, tc.tomb)
			}
		})
	}
}

func FuzzDecodeMsgGet(f *testing.F) {
	f.Add([]byte(`{"message":{"seq":3,"hdrs":"TkFUUy8xLjANCg0K","data":"aGk="}}`))
	f.Add([]byte(`{"error":{"code":404,"err_code":10037}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = decodeMsgGet(data) // must not panic
	})
}

func TestEnsureBucket(t *testing.T) {
	s := natstest.Start(t)
	_, js := natstest.JetStream(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "plain"}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "hist", History: 5, LimitMarkerTTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		bucket string
		ok     bool
		noTTL  bool
	}{
		{"fresh", true, false},
		{"fresh", true, false}, // exists now, with the right config
		{"plain", false, true},
		{"hist", false, false},
	}
	for _, tc := range tests {
		kv, err := EnsureBucket(ctx, js, BucketConfig{Bucket: tc.bucket, Replicas: 1, MarkerTTL: time.Minute, WaitForPeers: true})
		if tc.ok {
			if err != nil || kv == nil {
				t.Fatalf("%s: %v", tc.bucket, err)
			}
			continue
		}
		var bc *BucketConfigError
		if !errors.Is(err, ErrBucketConfig) || !errors.As(err, &bc) || bc.Bucket != tc.bucket || (bc.MarkerTTL <= 0) != tc.noTTL {
			t.Fatalf("%s: %v, want a *BucketConfigError (no TTL %v)", tc.bucket, err, tc.noTTL)
		}
	}
}

// bucketB starts a server with bucket "b" (one replica, 1 s marker TTL)
// and returns a connection, its JetStream context, the bucket and a
// context that ends with the test (10 s at most).
func bucketB(t *testing.T) (*nats.Conn, jetstream.JetStream, jetstream.KeyValue, context.Context) {
	t.Helper()
	s := natstest.Start(t)
	nc, js := natstest.JetStream(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	kv, err := EnsureBucket(ctx, js, BucketConfig{Bucket: "b", Replicas: 1, MarkerTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, kv, ctx
}

// TestPublishAndLastMsg runs the conditional write and the leader read
// against a server: create, stale write (10071), renew, missing key,
// delete marker.
func TestPublishAndLastMsg(t *testing.T) {
	nc, js, kv, ctx := bucketB(t)
	get := MsgGetSubject("", "b")
	msg := func(key, val string) *nats.Msg { return &nats.Msg{Subject: "$KV.b." + key, Data: []byte(val)} }

	if _, err := LastMsg(ctx, nc, get, "$KV.b.missing"); !errors.Is(err, ErrNoMessage) {
		t.Fatalf("missing key: %v, want ErrNoMessage", err)
	}
	rev, err := Publish(ctx, js, msg("k", "v1"), 0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name     string
		expect   uint64
		val      string
		conflict bool
	}{
		{"create again", 0, "x", true},
		{"stale revision", rev + 5, "x", true},
		{"renew", rev, "v2", false},
	}
	for _, st := range steps {
		got, err := Publish(ctx, js, msg("k", st.val), st.expect, time.Minute)
		if errors.Is(err, ErrConflict) != st.conflict || (!st.conflict && err != nil) {
			t.Fatalf("%s: %d, %v (conflict want %v)", st.name, got, err, st.conflict)
		}
		if !st.conflict {
			rev = got
		}
	}
	m, err := LastMsg(ctx, nc, get, "$KV.b.k")
	if err != nil || m.Seq != rev || string(m.Data) != "v2" || m.Tombstone() || m.Time.IsZero() {
		t.Fatalf("LastMsg = %+v, %v; want revision %d value v2", m, err, rev)
	}
	if e, err := kv.Get(ctx, "k"); err != nil || e.Revision() != rev {
		t.Fatalf("kv.Get = %v, %v", e, err)
	}
	if err := kv.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if m, err := LastMsg(ctx, nc, get, "$KV.b.k"); err != nil || !m.Tombstone() {
		t.Fatalf("after delete: %+v, %v; want a tombstone", m, err)
	}
	// A wrong API prefix gets no responder: the connection's error, as is.
	if _, err := LastMsg(ctx, nc, MsgGetSubject("$JS.nowhere.API", "b"), "$KV.b.k"); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("wrong prefix: %v, want nats.ErrNoResponders", err)
	}
	// A publisher's own error passes through Publish unchanged.
	boom := errors.New("boom")
	fail := PublishFunc(func(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error) { return nil, boom })
	if _, err := Publish(ctx, fail, msg("k", "x"), 1, time.Minute); err != boom {
		t.Fatalf("injected error: %v", err)
	}
}

func TestDecodeDirectGet(t *testing.T) {
	const stream = "KV_b"
	ok := func() nats.Header {
		return nats.Header{
			"Nats-Stream": {stream}, "Nats-Subject": {"$KV.b.k"}, "Nats-Sequence": {"7"},
			"Nats-Time-Stamp": {"2026-01-01T00:00:00.5Z"},
		}
	}
	with := func(k, v string) nats.Header { h := ok(); h[k] = []string{v}; return h }
	without := func(k string) nats.Header { h := ok(); delete(h, k); return h }
	tests := []struct {
		name    string
		h       nats.Header
		wantErr func(error) bool
		tomb    bool
	}{
		{"value", ok(), nil, false},
		{"delete marker", with("KV-Operation", "DEL"), nil, true},
		{"expiry marker", with(jetstream.MarkerReasonHeader, "MaxAge"), nil, true},
		{"not found", nats.Header{"Status": {"404"}, "Description": {"Message Not Found"}},
			func(err error) bool { return errors.Is(err, ErrNoMessage) }, false},
		{"bad request", nats.Header{"Status": {"408"}, "Description": {"Bad Request"}},
			func(err error) bool {
				var api *jetstream.APIError
				return errors.As(err, &api) && api.Code == 408 && !errors.Is(err, ErrNoMessage)
			}, false},
		{"a mirror's answer", with("Nats-Stream", "MIRROR"), func(err error) bool { return errors.Is(err, ErrNotOrigin) }, false},
		{"no stream", without("Nats-Stream"), func(err error) bool { return errors.Is(err, ErrNotOrigin) }, false},
		{"no headers", nil, func(err error) bool { return err != nil }, false},
		{"bad sequence", with("Nats-Sequence", "x"), func(err error) bool { return err != nil }, false},
		{"zero sequence", with("Nats-Sequence", "0"), func(err error) bool { return err != nil }, false},
		{"bad time", with("Nats-Time-Stamp", "yesterday"), func(err error) bool { return err != nil }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := decodeDirectGet(tc.h, []byte("v"), stream)
			if tc.wantErr != nil {
				if !tc.wantErr(err) {
					t.Fatalf("err = %v", err)
				}
				return
			}
			if err != nil || m.Seq != 7 || m.Subject != "$KV.b.k" || string(m.Data) != "v" || m.Tombstone() != tc.tomb ||
				!m.Time.Equal(time.Date(2026, 1, 1, 0, 0, 0, 5e8, time.UTC)) {
				t.Fatalf("got %+v, %v; want seq 7 tombstone %v", m, err, tc.tomb)
			}
			if m.Header.Get("Nats-Sequence") != "" {
				t.Fatalf("metadata headers left in %v", m.Header)
			}
		})
	}
}

func FuzzDecodeDirectGet(f *testing.F) {
	f.Add("KV_b", "7", "2026-01-01T00:00:00Z", "", "")
	f.Add("KV_b", "", "", "404", "")
	f.Add("X", "1", "", "", "DEL")
	f.Fuzz(func(t *testing.T, stream, seq, ts, status, op string) {
		h := nats.Header{"Nats-Stream": {stream}, "Nats-Sequence": {seq}, "Nats-Time-Stamp": {ts}}
		if status != "" {
			h["Status"] = []string{status}
		}
		if op != "" {
			h["KV-Operation"] = []string{op}
		}
		m, err := decodeDirectGet(h, nil, "KV_b")
		if err == nil && (m.Seq == 0 || stream != "KV_b") {
			t.Fatalf("accepted %v as %+v", h, m)
		}
	})
}

// TestDirectLastMsg runs the direct read against a server: a value, a
// missing key, a delete marker, an answer from another stream than the one
// expected, a wrong API prefix.
func TestDirectLastMsg(t *testing.T) {
	nc, _, kv, ctx := bucketB(t)
	pre := DirectGetPrefix("", "b")
	if pre != "$JS.API.DIRECT.GET.KV_b." {
		t.Fatalf("prefix %q", pre)
	}
	if _, err := DirectLastMsg(ctx, nc, pre, "KV_b", "$KV.b.missing"); !errors.Is(err, ErrNoMessage) {
		t.Fatalf("missing key: %v, want ErrNoMessage", err)
	}
	rev, err := kv.Put(ctx, "k", []byte("v1"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := DirectLastMsg(ctx, nc, pre, "KV_b", "$KV.b.k")
	want, lerr := LastMsg(ctx, nc, MsgGetSubject("", "b"), "$KV.b.k")
	if err != nil || lerr != nil || m.Seq != rev || string(m.Data) != "v1" || m.Tombstone() ||
		m.Subject != want.Subject || !m.Time.Equal(want.Time) {
		t.Fatalf("DirectLastMsg = %+v, %v; LastMsg = %+v, %v", m, err, want, lerr)
	}
	if _, err := DirectLastMsg(ctx, nc, pre, "KV_mirror", "$KV.b.k"); !errors.Is(err, ErrNotOrigin) {
		t.Fatalf("answer of another stream: %v, want ErrNotOrigin", err)
	}
	if err := kv.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if m, err := DirectLastMsg(ctx, nc, pre, "KV_b", "$KV.b.k"); err != nil || !m.Tombstone() || m.Seq != rev+1 {
		t.Fatalf("after delete: %+v, %v; want a tombstone at %d", m, err, rev+1)
	}
	if _, err := DirectLastMsg(ctx, nc, DirectGetPrefix("$JS.nowhere.API", "b"), "KV_b", "$KV.b.k"); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("wrong prefix: %v, want nats.ErrNoResponders", err)
	}
}
