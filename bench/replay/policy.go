package replay

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Policy is one routing setup compared in a run.
type Policy struct {
	Name string // label in reports
	// RouterPolicy is the scheduler policy the replicas run ("default",
	// "round-robin", "random", "least-loaded", ...).
	RouterPolicy string
	// RouterParams are the policy's parameters (a YAML mapping; zero =
	// the policy's defaults).
	RouterParams yaml.Node
	// Events: workers publish KV events and the replicas index them.
	Events bool
	// Approximate runs the replicas in approximate mode (host
	// Config.Approximate): no event subscription, an index of routing
	// decisions with the default 120 s TTL (scaled by the speed-up).
	Approximate bool
	// PredictedTTL is how long a replica remembers its own decisions as
	// cached blocks (0 = the replica's default, or for a peer its own
	// predict-on-route: scheduler.Operation.PredictOnRoute; negative = off).
	PredictedTTL time.Duration
	// TrueCache: the client picks the worker by the default cost fed with
	// the engines' true caches and sends it as a Soft preference.
	TrueCache bool
	// Peer marks another router's algorithm (the report sets them apart).
	Peer bool
	// PD runs the policy on the run's prefill/decode fleet (Config.Fleet),
	// every request asking for a pair (pd.go).
	PD bool
	// NoRouterQueue runs the policy without the routers' admission queue
	// (threshold -1, whatever the run's): every request goes to its worker
	// at once and waits there, as in the simple proxies round-robin-pd
	// stands for.
	NoRouterQueue bool
	About         string
}

// Catalog lists the policies a run can compare, by name.
var Catalog = []Policy{
	{Name: "kvrouter", RouterPolicy: "default", Events: true, About: "default cost policy, prefix index fed by KV events"},
	{Name: "kvrouter-approx", RouterPolicy: "default", Events: false, Approximate: true, About: "default cost policy, approximate mode (no events): the routers index their routing decisions for 120 s"},
	{Name: "round-robin", RouterPolicy: "round-robin", Events: true, About: "cycle through the workers"},
	{Name: "random", RouterPolicy: "random", Events: true, About: "uniformly random worker"},
	{Name: "least-loaded", RouterPolicy: "least-loaded", Events: true, About: "fewest active requests"},
	{Name: "true-cache", RouterPolicy: "default", Events: true, TrueCache: true, About: "the default cost fed with the engines' true caches (no event lag), chosen on the client and sent as a Soft preference: what the index's lag costs the default, not a bound"},
	// The peers' algorithms (router/scheduler/peers.go), on the same
	// event-fed index and load view as kvrouter.
	{Name: "llmd", RouterPolicy: "llmd", Events: true, Peer: true, About: "llm-d's default profile: 3 x prefix match + 2 x queue (the engines' waiting requests) + 2 x KV utilisation, plus 1 x its session-affinity scorer with sessions, max score"},
	{Name: "sglang", RouterPolicy: "sglang", Events: true, Peer: true, About: "SGLang cache-aware (sgl-router): shortest queue when imbalanced (> 64 and > 1.5x), else the best prefix's holder above a 0.3 match rate, else the smallest tree (blocks routed there)"},
	{Name: "dynamo", RouterPolicy: "dynamo", Events: true, Peer: true, About: "Dynamo's default cost: the default cost with Dynamo's weights (overlap credit 1, decode-block weight 1), no output blocks booked, ties at random, no predict-on-route index"},
	// Dynamo with its predict-on-route index on, as the replays before
	// stop 40 ran it: a deployment that sets --router-predicted-ttl-secs.
	{Name: "dynamo-predicted", RouterPolicy: "dynamo", Events: true, Peer: true, PredictedTTL: 5 * time.Second, About: "Dynamo's default cost with its predict-on-route index on (--router-predicted-ttl-secs 5): not its default"},
	// An experiment on the default cost (docs/benchmarks.md, "Issue 17"):
	// a cached block credited twice, for the prefill it saves and for the
	// new KV allocation it does not need.
	{Name: "kvrouter-credit2", RouterPolicy: "default", RouterParams: fixedCredit("overlap_credit", "2"), Events: true, About: "default cost policy with overlap_credit 2 (experiment; before the defaults changed, Dynamo's weights with credit 2)"},
	// The default-cost experiments (docs/benchmarks.md, "Default policy
	// experiments"): the default cost as a one-scorer pipeline with the min
	// picker (the default policy's decisions at these weights), Dynamo's
	// weights but for the decode-block weight and overlap credit named.
	{Name: "kvrouter-dbw0.25", RouterPolicy: "pipeline", RouterParams: costPipeline(1, 0.25), Events: true, About: "Dynamo's weights with decode_block_weight 0.25 (experiment)"},
	{Name: "kvrouter-dbw0.1", RouterPolicy: "pipeline", RouterParams: costPipeline(1, 0.1), Events: true, About: "Dynamo's weights with decode_block_weight 0.1 (experiment)"},
	{Name: "kvrouter-dbw0.1-credit2", RouterPolicy: "pipeline", RouterParams: costPipeline(2, 0.1), Events: true, About: "Dynamo's weights with decode_block_weight 0.1 and overlap_credit 2 (experiment)"},
	{Name: "kvrouter-dbw0.25-credit2", RouterPolicy: "pipeline", RouterParams: costPipeline(2, 0.25), Events: true, About: "Dynamo's weights with decode_block_weight 0.25 and overlap_credit 2 (experiment)"},
	{Name: "kvrouter-dbw0.1-credit3", RouterPolicy: "pipeline", RouterParams: costPipeline(3, 0.1), Events: true, About: "Dynamo's weights with decode_block_weight 0.1 and overlap_credit 3 (experiment)"},
	{Name: "kvrouter-dbw0.1-credit4", RouterPolicy: "pipeline", RouterParams: costPipeline(4, 0.1), Events: true, About: "decode_block_weight 0.1 and overlap_credit 4: the default cost's weights from that experiment to issue 24 (as a pipeline)"},
	{Name: "kvrouter-credit4", RouterPolicy: "pipeline", RouterParams: costPipeline(4, 1), Events: true, About: "Dynamo's weights with overlap_credit 4 (experiment)"},
	{Name: "kvrouter-dbw0", RouterPolicy: "pipeline", RouterParams: costPipeline(1, 0), Events: true, About: "Dynamo's weights without the decode-blocks term (experiment)"},
	// Issue 24's experiments on tuning parts: the default cost booking
	// no output blocks (routers see max_tokens only), with other weights;
	// the last became the default.
	{Name: "kvrouter-c4-ob", RouterPolicy: "default", RouterParams: fixedCredit("track_output_blocks", "true", "overlap_credit", "4", "decode_block_weight", "0.1"), Events: true, About: "the default before issue 24: overlap credit 4, decode-block weight 0.1, output blocks booked (max_tokens)"},
	{Name: "kvrouter-nob", RouterPolicy: "default", RouterParams: fixedCredit("track_output_blocks", "false", "overlap_credit", "4", "decode_block_weight", "0.1"), Events: true, About: "overlap credit 4, decode-block weight 0.1, no output blocks booked (experiment)"},
	{Name: "kvrouter-c2-nob", RouterPolicy: "default", RouterParams: fixedCredit("track_output_blocks", "false", "overlap_credit", "2", "decode_block_weight", "0.1"), Events: true, About: "overlap credit 2, decode-block weight 0.1, no output blocks (experiment)"},
	{Name: "kvrouter-c2-dbw1-nob", RouterPolicy: "default", RouterParams: fixedCredit("track_output_blocks", "false", "overlap_credit", "2", "decode_block_weight", "1"), Events: true, About: "overlap credit 2, decode-block weight 1, no output blocks (experiment)"},
	{Name: "kvrouter-c1.5-dbw0.5-nob", RouterPolicy: "default", RouterParams: fixedCredit("track_output_blocks", "false", "overlap_credit", "1.5", "decode_block_weight", "0.5"), Events: true, About: "the default from issue 24's first tuning to stop 36: overlap credit 1.5, decode-block weight 0.5, no output blocks"},
	{Name: "kvrouter-c1.25-dbw0.25-nob", RouterPolicy: "default", RouterParams: fixedCredit("track_output_blocks", "false", "overlap_credit", "1.25", "decode_block_weight", "0.25"), Events: true, About: "the default of stop 36: overlap credit 1.25 fixed (no load-following credit), decode-block weight 0.25, no output blocks"},
	{Name: "kvrouter-sole-reported", RouterPolicy: "default", RouterParams: yamlMap("sole_holder_reported_only", "true", "decode_weight_full_share", "0"), Events: true, About: "the default with the sole-holder credit only for a prefix the engines report, not one in flight (experiment of stop 46)"},
	{Name: "kvrouter-decode-share", RouterPolicy: "default", RouterParams: yamlMap("decode_weight_full_share", "1", "decode_weight_share_until_held", "0"), Events: true, About: "the default with its decode-block weight scaled by the cached share of the prompts the replica routed lately (experiment of stop 50: failed its first tuning round on the p99 geometric mean)"},
	{Name: "kvrouter-decode-share-half", RouterPolicy: "default", RouterParams: yamlMap("decode_weight_full_share", "0.5", "decode_weight_share_until_held", "0"), Events: true, About: "the default with its decode-block weight whole from half the routed prompt blocks cached, proportional below (experiment of stop 50)"},
	// The default from stop 37 to stop 44, before the sole-holder credit
	// and the prefill step term joined it: the evaluation's measure of
	// what that change did out of sample.
	{Name: "kvrouter-stop37", RouterPolicy: "default", RouterParams: yamlMap("prefill_step_tokens", "0", "sole_holder_credit", "0", "decode_weight_full_share", "0"), Events: true, About: "the default of stops 37-44: overlap credit 1.25 rising to 3 with the load, decode-block weight 0.25, no output blocks, no sole-holder credit or prefill step term"},
	// The default of stops 45-52, before its decode-block weight followed
	// the cached share: the evaluation's measure of what that change did.
	{Name: "kvrouter-stop45", RouterPolicy: "default", RouterParams: yamlMap("decode_weight_full_share", "0"), Events: true, About: "the default of stops 45-52: the default's weights with a fixed decode-block weight (0.25), not following the cached share"},
	// Prefill/decode disaggregation (pd.go), on the run's split fleet.
	{Name: "kvrouter-pd", RouterPolicy: "default", Events: true, PD: true, About: "split fleet: the prefill leg by the default cost (cached prefix against prefill queue), the decode leg by the decode cost (held prefix not transferred, decode load), both fed by KV events"},
	{Name: "round-robin-pd", RouterPolicy: "round-robin", Events: true, PD: true, NoRouterQueue: true, About: "split fleet, round-robin pairing as the peers' simple proxies run it (vLLM's disaggregation proxy): the next prefill worker and the next decode worker, each in turn, no router queue"},
	{Name: "round-robin-pd-queued", RouterPolicy: "round-robin", Events: true, PD: true, About: "split fleet, round-robin pairing behind kvrouter's admission queue (a pair waits in the router until a prefill worker has room)"},
	{Name: "chwbl", RouterPolicy: "chwbl", Events: true, Peer: true, About: "KubeAI's consistent hashing with bounded loads (1.25) on the first user message (the conversation's id stands in) or the prompt's opening, no cache index"},
}

// PeerPolicies is the peers' algorithms, in the order of a comparison.
var PeerPolicies = []string{"llmd", "sglang", "dynamo", "chwbl"}

// DefaultPolicies is the order of a full comparison.
var DefaultPolicies = []string{"kvrouter", "kvrouter-approx", "round-robin", "random", "least-loaded"}

// LookupPolicies resolves comma-separated or repeated names ("all" = every
// policy of the catalog, "peers" = PeerPolicies).
func LookupPolicies(names []string) ([]Policy, error) {
	var out []Policy
	seen := map[string]bool{}
	for _, arg := range names {
		for _, n := range splitPolicies(arg) {
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
			if n == "peers" {
				for _, pn := range PeerPolicies {
					if p, _ := policyByName(pn); !seen[p.Name] {
						seen[p.Name] = true
						out = append(out, p)
					}
				}
				continue
			}
			p, ok, err := policyWithParams(n)
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, fmt.Errorf("%w: unknown policy %q (want one of %s, peers or all)", ErrConfig, n, strings.Join(catalogNames(), ", "))
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

// splitPolicies splits a policy list at the commas outside braces, so that
// "kvrouter{overlap_credit=2,decode_block_weight=1},llmd" is two policies.
func splitPolicies(arg string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range arg {
		switch r {
		case '{':
			depth++
		case '}':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, arg[start:i])
				start = i + 1
			}
		}
	}
	return append(out, arg[start:])
}

// policyWithParams resolves "name{key=value,...}": the catalog policy name
// with its router parameters replaced by the mapping given (the keys of the
// policy's YAML parameters, e.g. overlap_credit for kvrouter), so that a
// weight can be tried without a catalog entry. The label keeps the braces,
// so that reports say what ran. A plain name is looked up as it is.
func policyWithParams(n string) (Policy, bool, error) {
	open := strings.IndexByte(n, '{')
	if open < 0 {
		p, ok := policyByName(n)
		return p, ok, nil
	}
	if !strings.HasSuffix(n, "}") {
		return Policy{}, false, fmt.Errorf("%w: policy %q: parameters must end with }", ErrConfig, n)
	}
	p, ok := policyByName(n[:open])
	if !ok {
		return Policy{}, false, nil
	}
	var kv []string
	for _, f := range strings.Split(n[open+1:len(n)-1], ",") {
		k, v, found := strings.Cut(strings.TrimSpace(f), "=")
		if !found || k == "" || v == "" {
			return Policy{}, false, fmt.Errorf("%w: policy %q: parameter %q is not key=value", ErrConfig, n, f)
		}
		kv = append(kv, strings.TrimSpace(k), strings.TrimSpace(v))
	}
	p.Name, p.RouterParams = n, yamlMap(kv...)
	p.About += " (parameters " + n[open:] + ")"
	return p, true, nil
}

// yamlMap is a YAML mapping of the key-value pairs given.
func yamlMap(kv ...string) yaml.Node {
	n := yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	for i := 0; i+1 < len(kv); i += 2 {
		n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: kv[i]},
			&yaml.Node{Kind: yaml.ScalarNode, Value: kv[i+1]})
	}
	return n
}

// fixedCredit is yamlMap(kv...) for the default cost with its overlap
// credit fixed (no load-following credit): the catalog entries that stand
// for configurations from before it.
func fixedCredit(kv ...string) yaml.Node {
	return yamlMap(append(kv, "saturated_credit", "0", "saturation_tokens", "0", "prefill_step_tokens", "0", "sole_holder_credit", "0",
		"decode_weight_full_share", "0")...)
}

// costPipeline is the parameters of a pipeline policy whose one scorer is
// the default cost with overlap credit and decode-block weight given (the
// other weights Dynamo's and the default's: prefill load scale 1, request
// weight 0) and whose picker is the minimum: the default policy at
// temperature 0 with other weights, spelled out so that an experiment stays
// the same when the defaults change. The mapping is built here, so it
// cannot fail to decode.
func costPipeline(credit, decodeBlockWeight float64) yaml.Node {
	num := func(v float64) *yaml.Node {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: strconv.FormatFloat(v, 'g', -1, 64)}
	}
	str := func(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s} }
	mapping := func(kv ...*yaml.Node) *yaml.Node {
		return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: kv}
	}
	cost := mapping(str("prefill_load_scale"), num(1), str("overlap_credit"), num(credit),
		str("decode_block_weight"), num(decodeBlockWeight), str("decode_active_request_weight"), num(0),
		str("saturated_credit"), num(0), str("saturation_tokens"), num(0),
		str("prefill_step_tokens"), num(0), str("sole_holder_credit"), num(0),
		str("decode_weight_full_share"), num(0), str("decode_weight_share_until_held"), num(0))
	scorer := mapping(str("name"), str("default-cost"), str("params"), cost)
	return *mapping(str("scorers"), &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Content: []*yaml.Node{scorer}},
		str("picker"), mapping(str("name"), str("min")))
}

func catalogNames() []string {
	names := make([]string, len(Catalog))
	for i, p := range Catalog {
		names[i] = p.Name
	}
	return names
}

func policyByName(n string) (Policy, bool) {
	for _, p := range Catalog {
		if p.Name == n {
			return p, true
		}
	}
	return Policy{}, false
}
