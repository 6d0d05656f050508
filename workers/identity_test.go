package workers

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testutil"
)

// A registration under one key whose value names another worker (a worker
// allowed to write only its own key, claiming a live worker's id) is
// rejected and counted as mismatched, with one log line per episode; the
// real worker's entry is untouched.
func TestRegistrationIdentityMismatch(t *testing.T) {
	t.Parallel()
	_, js := setup(t)
	cfg := testCfg()
	logs := &countingHandler{}
	vcfg := cfg
	vcfg.Logger = slog.New(logs)
	m, rec := watch(t, js, vcfg)
	register(t, js, cfg, validInfo("w1"))
	rec.wait(t, "join", "w1", 2*time.Second)
	kv, err := js.KeyValue(ctxT(t), DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		forged := validInfo("w1")
		forged.Endpoint = fmt.Sprintf("kvr.worker.evil.%d", i)
		val, err := EncodeInfo(forged)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctxT(t), KeyFor("w-evil"), val); err != nil {
			t.Fatal(err)
		}
		// The view follows the latest value per key: wait for each one, so
		// that none is replaced before the watch delivers it.
		testutil.Eventually(t, 2*time.Second, func() bool { return m.Stats().Mismatched == uint64(i+1) },
			func() string { return fmt.Sprintf("forged value %d not counted: stats %+v", i, m.Stats()) })
	}
	if i, _ := m.Get("w1"); i.Endpoint != validInfo("w1").Endpoint || m.Len() != 1 || m.Live("w-evil") {
		t.Fatalf("forged entry changed the view: w1 %+v, len %d", i, m.Len())
	}
	if st := m.Stats(); st.Malformed != 0 || st.Joins != 1 || st.Updates != 0 {
		t.Fatalf("stats %+v", st)
	}
	if n := logs.warnings.Load(); n != 1 {
		t.Fatalf("%d warnings for one episode, want 1", n)
	}
	for _, e := range rec.all() {
		if e.kind != "join" {
			t.Fatalf("callback for a forged entry: %v", e)
		}
	}
}
