package replay

import (
	"context"
	"math"
	"testing"
)

// The search brackets and bisects each target on a monotone response, and
// says so when a target is out of reach.
func TestSearchLoads(t *testing.T) {
	var probed []float64
	curve := func(load float64) (LoadPoint, error) {
		probed = append(probed, load)
		return LoadPoint{Load: load, Ratio: math.Pow(load, 1.5)}, nil
	}
	pts, levels, err := searchLoads(curve, Calibration{})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []float64{3, 10} {
		l := levels[i]
		exact := math.Pow(want, 1/1.5)
		if !l.Found || l.Ratio < want || l.Load < exact || l.Load > exact*1.1 {
			t.Errorf("target %gx: %+v, exact load %.3f", want, l, exact)
		}
	}
	for i := 1; i < len(pts); i++ {
		if pts[i].Load <= pts[i-1].Load {
			t.Fatalf("points not sorted by load: %+v", pts)
		}
	}
	if len(probed) > 12 {
		t.Errorf("%d probes: %v", len(probed), probed)
	}

	// Already past the lowest target at the start: the search goes down.
	_, levels, _ = searchLoads(curve, Calibration{Start: 8})
	if !levels[0].Found || levels[0].Load > 2.3 {
		t.Errorf("from load 8: %+v", levels)
	}

	// A response that never reaches a target stops at MaxLoad.
	probed = nil
	_, levels, err = searchLoads(func(load float64) (LoadPoint, error) {
		probed = append(probed, load)
		return LoadPoint{Load: load, Ratio: math.Min(5, load)}, nil
	}, Calibration{MaxLoad: 16})
	if err != nil || !levels[0].Found || levels[1].Found || probed[len(probed)-1] > 16 {
		t.Errorf("unreachable target: %+v, probed %v, %v", levels, probed, err)
	}
}

// Calibrate replays round-robin at each probed load; the fake stack has no
// queueing, so no load reaches 10x.
func TestCalibrateRuns(t *testing.T) {
	var stacks []*fakeStack
	res, err := Calibrate(context.Background(), Config{Workload: smallWorkload(), NewStack: newFakeFactory(&stacks, 0), Workers: 2, Speedup: 1e4},
		Calibration{MaxLoad: 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Points) != 3 || len(stacks) != 3 || res.UnloadedP99 <= 0 || res.Levels[1].Found {
		t.Fatalf("%+v over %d stacks", res, len(stacks))
	}
	for _, s := range stacks {
		if s.cfg.Policy.Name != "round-robin" {
			t.Fatalf("calibration ran %s", s.cfg.Policy.Name)
		}
	}
}
