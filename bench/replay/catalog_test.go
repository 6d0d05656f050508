package replay

import (
	"testing"

	"github.com/kvrouter/kvrouter/router/scheduler"
)

// Every catalog entry builds in the scheduler's registry, and the
// default-cost experiments carry the weights their names say: the winner
// of the experiments is the default's weights, the others differ from it.
func TestCatalogBuilds(t *testing.T) {
	reg := scheduler.NewRegistry()
	for _, p := range Catalog {
		pol, err := reg.Build(scheduler.PolicyConfig{Name: p.RouterPolicy, Params: p.RouterParams})
		if err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		if p.RouterPolicy != "pipeline" {
			continue
		}
		pipe := pol.(*scheduler.Pipeline)
		if len(pipe.Scorers) != 1 || pipe.Picker != (scheduler.MinPicker{}) {
			t.Fatalf("%s: built %+v, want one scorer and the min picker", p.Name, pipe)
		}
		got := pipe.Scorers[0].Scorer.(scheduler.DefaultCost).Params
		// No pipeline experiment runs the default's weights since issue
		// 24 changed them (the pipeline also books output blocks).
		if got == scheduler.DefaultCostParams() {
			t.Errorf("%s: weights %+v, the default's", p.Name, got)
		}
	}
	want := map[string]scheduler.CostParams{
		"kvrouter-dbw0.25": {PrefillLoadScale: 1, OverlapCredit: 1, DecodeBlockWeight: 0.25},
		"kvrouter-credit4": {PrefillLoadScale: 1, OverlapCredit: 4, DecodeBlockWeight: 1},
		"kvrouter-dbw0":    {PrefillLoadScale: 1, OverlapCredit: 1},
	}
	for name, w := range want {
		p, _ := policyByName(name)
		pol, err := reg.Build(scheduler.PolicyConfig{Name: p.RouterPolicy, Params: p.RouterParams})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := pol.(*scheduler.Pipeline).Scorers[0].Scorer.(scheduler.DefaultCost).Params; got != w {
			t.Errorf("%s: weights %+v, want %+v", name, got, w)
		}
	}
}
