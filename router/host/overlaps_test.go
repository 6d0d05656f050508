package host

import (
	"cmp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/router/index"
	"github.com/kvrouter/kvrouter/router/scheduler"
	"github.com/kvrouter/kvrouter/workerref"
)

// The scheduler gets one entry per index and worker: the event-fed index's
// marked as reported (the engines' events say so), the predicted index's
// not, so the default cost can credit the two differently
// (scheduler.CostParams.ReportedCredit). In approximate mode nothing is
// reported.
func TestOverlapsMarkReportedBlocks(t *testing.T) {
	a, b := workerref.Target{Worker: "a"}, workerref.Target{Worker: "b"}
	prompt := []kvevents.SeqHash{11, 12, 13, 14}
	now := time.Now()
	events := index.New(index.Config{})
	events.ApplyBatch(1, &kvevents.Batch{Worker: "a", Events: []kvevents.Event{{Kind: kvevents.KindStored,
		Blocks: []kvevents.StoredBlock{{Engine: 1, Seq: 11}, {Engine: 2, Seq: 12}}}}})
	pred := index.NewApprox(index.ApproxConfig{TTL: time.Minute})
	pred.Record(a, prompt[:3], now)
	pred.Record(b, prompt, now)

	for _, tc := range []struct {
		name string
		ms   *modelState
		want []scheduler.Overlap
	}{
		{"events only", &modelState{index: events}, []scheduler.Overlap{{Key: a, Blocks: 2, Reported: 2}}},
		{"events and predictions", &modelState{index: events, pred: pred}, []scheduler.Overlap{
			{Key: a, Blocks: 2, Reported: 2}, {Key: a, Blocks: 3}, {Key: b, Blocks: 4}}},
		{"approximate", &modelState{index: index.New(index.Config{}), pred: pred, approx: true}, []scheduler.Overlap{
			{Key: a, Blocks: 3}, {Key: b, Blocks: 4}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ov, pov index.Overlaps
			got := tc.ms.overlaps(prompt, &ov, &pov, nil)
			slices.SortFunc(got, func(x, y scheduler.Overlap) int { // the indexes' order is theirs
				return cmp.Or(strings.Compare(x.Key.Worker, y.Key.Worker), y.Reported-x.Reported)
			})
			if !slices.Equal(got, tc.want) {
				t.Fatalf("overlaps %+v, want %+v", got, tc.want)
			}
		})
	}
}
