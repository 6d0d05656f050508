package host

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/api"
)

// metricValue is the value of one series in a replica's /metrics (0 when
// the series is absent).
func metricValue(t testing.TB, r *Replica, series string) float64 {
	t.Helper()
	code, b := httpDo(t, "GET", "http://"+r.HTTPAddr()+"/metrics", nil)
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			return v
		}
	}
	return 0
}

// Every bad request a client is answered, on HTTP and NATS, moves
// kvr_bad_requests_total{field}: an oversized body, invalid JSON, an empty
// allowed_workers list, a bad lifecycle body.
func TestBadRequestsCounted(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 1})
	r := st.replicas[0]
	base := "http://" + r.HTTPAddr()
	series := func(field string) string { return `kvr_bad_requests_total{field="` + field + `"}` }
	natsReq := func(subject, body string) *api.Error {
		t.Helper()
		reply, err := st.nc.Request(subject, []byte(body), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return api.DecodeError(reply.Data)
	}
	cases := []struct {
		name, field string
		send        func() (status int, e *api.Error)
	}{
		{"http body over the limit", "body", func() (int, *api.Error) {
			body := append([]byte(`{"model":"m","token_ids":[`), bytes.Repeat([]byte("1,"), api.MaxRouteBodySize/2)...)
			code, b := httpDo(t, "POST", base+"/v1/route", append(body, "1]}"...))
			return code, api.DecodeError(b)
		}},
		{"http invalid JSON", "body", func() (int, *api.Error) {
			code, b := httpDo(t, "POST", base+"/v1/route", []byte(`not json`))
			return code, api.DecodeError(b)
		}},
		{"http empty allowed_workers", "allowed_workers", func() (int, *api.Error) {
			code, b := httpDo(t, "POST", base+"/v1/route", []byte(`{"model":"m","token_ids":[1],"allowed_workers":[]}`))
			return code, api.DecodeError(b)
		}},
		{"http unknown model", "model", func() (int, *api.Error) {
			code, b := httpDo(t, "POST", base+"/v1/route", []byte(`{"model":"nope","token_ids":[1]}`))
			return code, api.DecodeError(b)
		}},
		{"http lifecycle attempt", "attempt", func() (int, *api.Error) {
			code, b := httpDo(t, "POST", base+"/v1/requests/x/prefill_done", []byte(`{"attempt":-1}`))
			return code, api.DecodeError(b)
		}},
		{"nats invalid JSON", "body", func() (int, *api.Error) {
			return 400, natsReq(api.RouteSubject("", testModel), `not json`)
		}},
		{"nats empty allowed_workers", "allowed_workers", func() (int, *api.Error) {
			return 400, natsReq(api.RouteSubject("", testModel), `{"model":"m","token_ids":[1],"allowed_workers":[]}`)
		}},
		{"nats lifecycle body", "body", func() (int, *api.Error) {
			return 400, natsReq(api.LifecycleSubject("", api.OpFree, testModel), `[1]`)
		}},
		{"nats lifecycle without request id", "request_id", func() (int, *api.Error) {
			return 400, natsReq(api.LifecycleSubject("", api.OpFree, testModel), `{}`)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := metricValue(t, r, series(c.field))
			status, e := c.send()
			if status != 400 || e == nil || e.Code != api.CodeBadRequest || e.Field != c.field {
				t.Fatalf("answer %d %+v, want 400 bad_request on %s", status, e, c.field)
			}
			if c.field == "allowed_workers" && !strings.Contains(e.Message, "omit it to allow every worker") {
				t.Fatalf("message %q does not say how to allow every worker", e.Message)
			}
			if after := metricValue(t, r, series(c.field)); after != before+1 {
				t.Fatalf("%s went %v -> %v, want +1", series(c.field), before, after)
			}
		})
	}
}

// A bad event message last in the stream is consumed (skipped): the lag
// reaches 0, and kvr_events_rejected_total counts it by cause.
func TestEventsLagAndRejectedWithBadLastMessage(t *testing.T) {
	st := startStack(t, stackOpts{replicas: 1})
	r := st.replicas[0]
	if _, err := st.js.Publish(context.Background(), kvevents.EventSubject("", testModel, "w-bad"), []byte("not an event batch")); err != nil {
		t.Fatal(err)
	}
	rejected := func() float64 {
		var sum float64
		for _, c := range []string{"truncated", "malformed", "oversized", "mismatched"} {
			sum += metricValue(t, r, `kvr_events_rejected_total{cause="`+c+`"}`)
		}
		return sum
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return rejected() == 1 },
		func() string {
			return "kvr_events_rejected_total did not count the bad message: " + strconv.FormatFloat(rejected(), 'f', -1, 64)
		})
	// The lag loop runs every second: wait for a measurement after the
	// message was skipped.
	testutil.Eventually(t, 10*time.Second, func() bool { return r.intake.streamLast.Load() >= 1 && r.intake.lag.Load() == 0 },
		func() string {
			return "kvr_events_lag " + strconv.FormatUint(r.intake.lag.Load(), 10) + " with stream last seq " + strconv.FormatUint(r.intake.streamLast.Load(), 10)
		})
	if v := metricValue(t, r, "kvr_events_lag"); v != 0 {
		t.Fatalf("kvr_events_lag %v, want 0", v)
	}
}
