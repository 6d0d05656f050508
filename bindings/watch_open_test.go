package bindings

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvrouter/kvrouter/internal/natstest"
)

// markFailingJS fails the first n quorum marks (the probe write each watch
// starts with), as a slow or briefly unreachable server does.
type markFailingJS struct {
	jetstream.JetStream
	n atomic.Int32
}

func (j *markFailingJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if strings.HasSuffix(m.Subject, "."+quorumKey) && j.n.Add(-1) >= 0 {
		return nil, errors.New("injected: quorum mark lost")
	}
	return j.JetStream.PublishMsg(ctx, m, opts...)
}

// Open returns once any watch has delivered the existing bindings, not only
// the first: when the first attempt failed (its quorum mark was lost), the
// watch that recovered never told Open, which waited out its context (CI:
// "initial watch of bucket ... context deadline exceeded").
func TestOpenSurvivesAFailedFirstWatch(t *testing.T) {
	e := newEnv(t)
	nc, js := natstest.JetStream(t, e.s)
	seed := openOn(t, js, nc, Config{})
	mustRoute(t, seed, "m", "s1", always("w1"))

	nc2, js2 := natstest.JetStream(t, e.s)
	// Open's own mark, then the first watch's: both lost.
	fj := &markFailingJS{JetStream: js2}
	fj.n.Store(2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tb, err := Open(ctx, fj, nc2, Config{})
	if err != nil {
		t.Fatalf("Open after a failed first watch: %v", err)
	}
	defer tb.Close()
	if st := tb.Stats(); st.WatchRestarts == 0 {
		t.Fatalf("the first watch did not fail: %+v", st)
	}
	b, err := tb.Get(ctx, "m", "s1")
	if err != nil || b.Worker != "w1" {
		t.Fatalf("Get: %+v, %v", b, err)
	}
}
