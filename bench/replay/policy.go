package replay

import (
	"fmt"
	"strings"
	"time"
)

// Policy is one routing setup compared in a run.
type Policy struct {
	Name string // label in reports
	// RouterPolicy is the scheduler policy the replicas run ("default",
	// "round-robin", "random", "least-loaded", ...).
	RouterPolicy string
	// Events: workers publish KV events and the replicas index them.
	Events bool
	// Approximate runs the replicas in approximate mode (host
	// Config.Approximate): no event subscription, an index of routing
	// decisions with the default 120 s TTL (scaled by the speed-up).
	Approximate bool
	// PredictedTTL is how long a replica remembers its own decisions as
	// cached blocks (0 = the replica's default).
	PredictedTTL time.Duration
	// Oracle: the client picks the worker by the true cached prefix plus the
	// default cost's load term and sends it as a Soft preference.
	Oracle bool
	About  string
}

// Catalog lists the policies a run can compare, by name.
var Catalog = []Policy{
	{Name: "kvrouter", RouterPolicy: "default", Events: true, About: "default cost policy, prefix index fed by KV events"},
	{Name: "kvrouter-approx", RouterPolicy: "default", Events: false, Approximate: true, About: "default cost policy, approximate mode (no events): the routers index their routing decisions for 120 s"},
	{Name: "round-robin", RouterPolicy: "round-robin", Events: true, About: "cycle through the workers"},
	{Name: "random", RouterPolicy: "random", Events: true, About: "uniformly random worker"},
	{Name: "least-loaded", RouterPolicy: "least-loaded", Events: true, About: "fewest active requests"},
	{Name: "oracle", RouterPolicy: "default", Events: true, Oracle: true, About: "true cached prefix read from the simulated workers + default cost load term, sent as a Soft preference"},
}

// DefaultPolicies is the order of a full comparison.
var DefaultPolicies = []string{"kvrouter", "kvrouter-approx", "round-robin", "random", "least-loaded", "oracle"}

// LookupPolicies resolves comma-separated or repeated names ("all" = every
// policy of the catalog).
func LookupPolicies(names []string) ([]Policy, error) {
	var out []Policy
	seen := map[string]bool{}
	for _, arg := range names {
		for _, n := range strings.Split(arg, ",") {
			n = strings.TrimSpace(n)
			if n == "" {
				continue
			}
			if n == "all" {
				for _, p := range Catalog {
					if !seen[p.Name] {
						seen[p.Name] = true
						out = append(out, p)
					}
				}
				continue
			}
			p, ok := policyByName(n)
			if !ok {
				return nil, fmt.Errorf("%w: unknown policy %q (want one of %s or all)", ErrConfig, n, strings.Join(DefaultPolicies, ", "))
			}
			if !seen[p.Name] {
				seen[p.Name] = true
				out = append(out, p)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no policy selected", ErrConfig)
	}
	return out, nil
}

func policyByName(n string) (Policy, bool) {
	for _, p := range Catalog {
		if p.Name == n {
			return p, true
		}
	}
	return Policy{}, false
}
