package scheduler

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// PolicyConfig names a policy and carries its parameters as raw YAML, so a
// registered factory decodes its own parameter struct.
//
//	name: default
//	params: {temperature: 0.7, seed: 42}
type PolicyConfig struct {
	Name   string    `yaml:"name"`
	Params yaml.Node `yaml:"params"`
}

// ComponentConfig is one filter, scorer or picker inside a pipeline.
type ComponentConfig struct {
	Name   string    `yaml:"name"`
	Weight *float64  `yaml:"weight"` // scorers only; default 1
	Params yaml.Node `yaml:"params"`
}

// PipelineConfig is the parameters of the "pipeline" policy.
type PipelineConfig struct {
	Name    string            `yaml:"name"`
	Filters []ComponentConfig `yaml:"filters"`
	Scorers []ComponentConfig `yaml:"scorers"`
	Picker  *ComponentConfig  `yaml:"picker"`
}

// Factories build components from their YAML parameters (params may be an
// empty node when none were given).
type (
	PolicyFactory func(reg *Registry, params *yaml.Node) (Policy, error)
	FilterFactory func(params *yaml.Node) (Filter, error)
	ScorerFactory func(params *yaml.Node) (Scorer, error)
	PickerFactory func(params *yaml.Node) (Picker, error)
)

// Registry maps names to policy, filter, scorer and picker factories. It is a
// value, not global state: NewRegistry returns one with the builtins, and a
// host adds its own before building. Not safe for concurrent registration.
type Registry struct {
	policies map[string]PolicyFactory
	filters  map[string]FilterFactory
	scorers  map[string]ScorerFactory
	pickers  map[string]PickerFactory
	ops      map[string]Operation // the peers' own admission and affinity (peers.go)
}

// NewRegistry returns a registry holding the builtins:
// policies default, round-robin, random, least-loaded, power-of-two,
// two-tier, pipeline, and the peers' algorithms llmd, sglang, dynamo (the
// default policy with Dynamo's weights and accounting) and chwbl (peers.go); filters soft-affinity, not-busy;
// scorers default-cost, active-requests, prefill-tokens, decode-blocks,
// overlap, kv-usage, llmd-prefix, llmd-queue, llmd-kv-utilization,
// llmd-session-affinity; pickers min, softmax, random. Operation gives the
// peers' own admission and session affinity.
func NewRegistry() *Registry {
	r := &Registry{
		policies: map[string]PolicyFactory{},
		filters:  map[string]FilterFactory{},
		scorers:  map[string]ScorerFactory{},
		pickers:  map[string]PickerFactory{},
		ops:      map[string]Operation{},
	}
	r.policies["default"] = buildDefault
	r.policies["pipeline"] = buildPipeline
	r.policies["two-tier"] = func(_ *Registry, n *yaml.Node) (Policy, error) {
		p := NewTwoTier()
		if err := decodeParams(n, p); err != nil {
			return nil, err
		}
		if !nonNegative(p.CacheThreshold, p.BalanceAbs, p.BalanceRel) {
			return nil, fmt.Errorf("%w: two-tier thresholds must be finite numbers >= 0: %+v", ErrInvalidConfig, *p)
		}
		return p, nil
	}
	for name, p := range map[string]Policy{
		"round-robin":  RoundRobin{},
		"random":       Random{},
		"least-loaded": LeastLoaded{},
		"power-of-two": PowerOfTwo{},
	} {
		r.policies[name] = func(_ *Registry, n *yaml.Node) (Policy, error) {
			var o struct {
				RespectSoftAffinity bool `yaml:"respect_soft_affinity"`
			}
			if err := decodeParams(n, &o); err != nil {
				return nil, err
			}
			if o.RespectSoftAffinity {
				return softAffinity{inner: p}, nil
			}
			return p, nil
		}
	}
	r.filters["soft-affinity"] = func(n *yaml.Node) (Filter, error) { return SoftAffinityFilter{}, decodeParams(n, &struct{}{}) }
	r.filters["not-busy"] = func(n *yaml.Node) (Filter, error) { return NotBusyFilter{}, decodeParams(n, &struct{}{}) }
	r.scorers["default-cost"] = func(n *yaml.Node) (Scorer, error) {
		s := DefaultCost{Params: DefaultCostParams()}
		if err := decodeParams(n, &s.Params); err != nil {
			return nil, err
		}
		shareOffEndsHeld(n, &s.Params)
		return s, s.Params.validate()
	}
	for name, s := range map[string]Scorer{
		"active-requests": ActiveRequestsScorer{},
		"prefill-tokens":  PrefillTokensScorer{},
		"decode-blocks":   DecodeBlocksScorer{},
		"overlap":         OverlapScorer{},
		"kv-usage":        KVUsageScorer{},
	} {
		r.scorers[name] = func(n *yaml.Node) (Scorer, error) { return s, decodeParams(n, &struct{}{}) }
	}
	r.pickers["min"] = func(n *yaml.Node) (Picker, error) {
		var p MinPicker
		var o struct {
			RespectSoftAffinity bool `yaml:"respect_soft_affinity"`
		}
		err := decodeParams(n, &o)
		p.RespectSoftAffinity = o.RespectSoftAffinity
		return p, err
	}
	r.pickers["softmax"] = func(n *yaml.Node) (Picker, error) {
		var o struct {
			Temperature         float64 `yaml:"temperature"`
			RespectSoftAffinity bool    `yaml:"respect_soft_affinity"`
		}
		if err := decodeParams(n, &o); err != nil {
			return nil, err
		}
		if !nonNegative(o.Temperature) {
			return nil, fmt.Errorf("%w: softmax temperature must be a finite number >= 0, got %v", ErrInvalidConfig, o.Temperature)
		}
		return SoftmaxPicker{Temperature: o.Temperature, RespectSoftAffinity: o.RespectSoftAffinity}, nil
	}
	r.pickers["random"] = func(n *yaml.Node) (Picker, error) { return RandomPicker{}, decodeParams(n, &struct{}{}) }
	registerPeers(r)
	return r
}

func buildDefault(_ *Registry, n *yaml.Node) (Policy, error) {
	var o struct {
		PrefillLoadScale          *float64 `yaml:"prefill_load_scale"`
		OverlapCredit             *float64 `yaml:"overlap_credit"`
		DecodeBlockWeight         *float64 `yaml:"decode_block_weight"`
		DecodeActiveRequestWeight float64  `yaml:"decode_active_request_weight"`
		AdapterLoadBlocks         float64  `yaml:"adapter_load_blocks"`
		SaturatedCredit           *float64 `yaml:"saturated_credit"`
		SaturationTokens          *float64 `yaml:"saturation_tokens"`
		ReportedOverlapCredit     float64  `yaml:"reported_overlap_credit"`
		PrefillStepTokens         *float64 `yaml:"prefill_step_tokens"`
		SoleHolderCredit          *float64 `yaml:"sole_holder_credit"`
		SoleHolderReportedOnly    bool     `yaml:"sole_holder_reported_only"`
		DecodeFullShare           *float64 `yaml:"decode_weight_full_share"`
		DecodeShareUntilTokens    float64  `yaml:"decode_weight_share_until_tokens"`
		DecodeShareUntilHeld      *float64 `yaml:"decode_weight_share_until_held"`
		Temperature               float64  `yaml:"temperature"`
		Seed                      *uint64  `yaml:"seed"`
		TrackOutputBlocks         *bool    `yaml:"track_output_blocks"`
		CountBookedPrefix         *bool    `yaml:"count_booked_prefix"`
		BookedPrefixOnlyNew       bool     `yaml:"booked_prefix_only_new"`
		// DecodeLeg overrides DefaultDecodeCostParams, field by field.
		DecodeLeg yaml.Node `yaml:"decode_leg"`
	}
	if err := decodeParams(n, &o); err != nil {
		return nil, err
	}
	p := NewDefaultPolicy(o.Temperature)
	p.Decode = DefaultDecodeCostParams()
	if err := decodeParams(&o.DecodeLeg, &p.Decode); err != nil {
		return nil, fmt.Errorf("decode_leg: %w", err)
	}
	if d := p.Decode; d.PrefillLoadScale < 0 || d.TransferBlockWeight < 0 || d.DecodeBlockWeight < 0 ||
		d.DecodeActiveRequestWeight < 0 || d.FullPenalty < 0 {
		return nil, fmt.Errorf("%w: decode_leg weights must be >= 0: %+v", ErrInvalidConfig, d)
	}
	if o.TrackOutputBlocks != nil {
		p.NoOutputBlocks = !*o.TrackOutputBlocks
	}
	if o.CountBookedPrefix != nil {
		p.NoBookedPrefix = !*o.CountBookedPrefix
	}
	p.BookedPrefixOnlyNew = o.BookedPrefixOnlyNew
	if o.DecodeBlockWeight != nil {
		p.Cost.DecodeBlockWeight = *o.DecodeBlockWeight
	}
	if o.PrefillLoadScale != nil {
		p.Cost.PrefillLoadScale = *o.PrefillLoadScale
	}
	if o.OverlapCredit != nil {
		p.Cost.OverlapCredit = *o.OverlapCredit
	}
	p.Cost.DecodeActiveRequestWeight = o.DecodeActiveRequestWeight
	p.Cost.AdapterLoadBlocks = o.AdapterLoadBlocks // 0: the default; negative: off
	if o.SaturatedCredit != nil {
		p.Cost.SaturatedCredit = *o.SaturatedCredit
	}
	if o.SaturationTokens != nil {
		p.Cost.SaturationTokens = *o.SaturationTokens
	}
	p.Cost.ReportedCredit = o.ReportedOverlapCredit // 0: the overlap credit for every block
	if o.PrefillStepTokens != nil {
		p.Cost.PrefillStepTokens = *o.PrefillStepTokens // 0: off
	}
	if o.SoleHolderCredit != nil {
		p.Cost.SoleHolderCredit = *o.SoleHolderCredit // 0: off
	}
	p.Cost.SoleHolderReportedOnly = o.SoleHolderReportedOnly
	if o.DecodeFullShare != nil {
		p.Cost.DecodeFullShare = *o.DecodeFullShare // 0: a fixed decode-block weight
	}
	if o.DecodeShareUntilHeld != nil {
		p.Cost.DecodeShareUntilHeld = *o.DecodeShareUntilHeld // 0: not ended by the admission queue
	}
	p.Cost.DecodeShareUntilTokens = o.DecodeShareUntilTokens
	shareOffEndsHeld(n, &p.Cost)
	if o.Seed != nil {
		p.SeedValue, p.HasSeed = *o.Seed, true
	}
	if !nonNegative(p.Temperature) {
		return nil, fmt.Errorf("%w: default policy temperature must be a finite number >= 0, got %v", ErrInvalidConfig, p.Temperature)
	}
	if err := p.Cost.validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// nonNegative reports whether every v is a finite number >= 0: the check
// for a weight or threshold, which "v < 0" is not (NaN passes it).
func nonNegative(vs ...float64) bool {
	for _, v := range vs {
		if !(v >= 0) || math.IsInf(v, 1) {
			return false
		}
	}
	return true
}

// shareOffEndsHeld applies the rule that decode_weight_full_share 0 turns
// off the admission queue's end of the cached-share reduction as well,
// unless n, the params mapping, gives decode_weight_share_until_held: the
// default's 0.004 would otherwise make "off" an invalid configuration.
func shareOffEndsHeld(n *yaml.Node, cp *CostParams) {
	if cp.DecodeFullShare != 0 || n == nil || n.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "decode_weight_share_until_held" {
			return
		}
	}
	cp.DecodeShareUntilHeld = 0
}

func buildPipeline(reg *Registry, n *yaml.Node) (Policy, error) {
	var pc PipelineConfig
	if err := decodeParams(n, &pc); err != nil {
		return nil, err
	}
	p := &Pipeline{PolicyName: pc.Name}
	for _, fc := range pc.Filters {
		ff, ok := reg.filters[fc.Name]
		if !ok {
			return nil, fmt.Errorf("%w: filter %q (known: %s)", ErrUnknownPolicy, fc.Name, keys(reg.filters))
		}
		f, err := ff(&fc.Params)
		if err != nil {
			return nil, fmt.Errorf("filter %q: %w", fc.Name, err)
		}
		p.Filters = append(p.Filters, f)
	}
	for _, sc := range pc.Scorers {
		sf, ok := reg.scorers[sc.Name]
		if !ok {
			return nil, fmt.Errorf("%w: scorer %q (known: %s)", ErrUnknownPolicy, sc.Name, keys(reg.scorers))
		}
		s, err := sf(&sc.Params)
		if err != nil {
			return nil, fmt.Errorf("scorer %q: %w", sc.Name, err)
		}
		w := 1.0
		if sc.Weight != nil {
			w = *sc.Weight
		}
		if math.IsNaN(w) || math.IsInf(w, 0) {
			return nil, fmt.Errorf("%w: scorer %q weight must be a finite number, got %v", ErrInvalidConfig, sc.Name, w)
		}
		p.Scorers = append(p.Scorers, WeightedScorer{Scorer: s, Weight: w})
	}
	if pc.Picker != nil {
		pf, ok := reg.pickers[pc.Picker.Name]
		if !ok {
			return nil, fmt.Errorf("%w: picker %q (known: %s)", ErrUnknownPolicy, pc.Picker.Name, keys(reg.pickers))
		}
		pk, err := pf(&pc.Picker.Params)
		if err != nil {
			return nil, fmt.Errorf("picker %q: %w", pc.Picker.Name, err)
		}
		p.Picker = pk
	}
	return p, nil
}

// RegisterPolicy adds a policy factory; a name may be registered once.
func (r *Registry) RegisterPolicy(name string, f PolicyFactory) error {
	return register(r.policies, "policy", name, f)
}

// RegisterFilter adds a pipeline filter factory.
func (r *Registry) RegisterFilter(name string, f FilterFactory) error {
	return register(r.filters, "filter", name, f)
}

// RegisterScorer adds a pipeline scorer factory.
func (r *Registry) RegisterScorer(name string, f ScorerFactory) error {
	return register(r.scorers, "scorer", name, f)
}

// RegisterPicker adds a pipeline picker factory.
func (r *Registry) RegisterPicker(name string, f PickerFactory) error {
	return register(r.pickers, "picker", name, f)
}

func register[F any](m map[string]F, kind, name string, f F) error {
	if name == "" || reflect.ValueOf(f).IsNil() {
		return fmt.Errorf("%w: %s %q: empty name or nil factory", ErrInvalidConfig, kind, name)
	}
	if _, dup := m[name]; dup {
		return fmt.Errorf("%w: %s %q registered twice", ErrInvalidConfig, kind, name)
	}
	m[name] = f
	return nil
}

// Policies lists the registered policy names, sorted.
func (r *Registry) Policies() []string { return keysSlice(r.policies) }

// Build makes the policy cfg names.
func (r *Registry) Build(cfg PolicyConfig) (Policy, error) {
	name := cfg.Name
	if name == "" {
		name = "default"
	}
	f, ok := r.policies[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q (known: %s)", ErrUnknownPolicy, name, keys(r.policies))
	}
	p, err := f(r, &cfg.Params)
	if err != nil {
		return nil, fmt.Errorf("policy %q: %w", name, err)
	}
	return p, nil
}

// BuildYAML parses a PolicyConfig document and builds it.
func (r *Registry) BuildYAML(data []byte) (Policy, error) {
	var cfg PolicyConfig
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("%w: policy yaml: %v", ErrInvalidConfig, err)
	}
	return r.Build(cfg)
}

// decodeParams decodes a params node into out (a pointer to a struct),
// rejecting keys out does not declare, so a typo is an error rather than a
// silently ignored knob.
func decodeParams(n *yaml.Node, out any) error {
	if n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.Tag == "!!null") {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("%w: params must be a mapping, got %s at line %d", ErrInvalidConfig, kindName(n.Kind), n.Line)
	}
	known := map[string]bool{}
	t := reflect.TypeOf(out).Elem()
	for i := range t.NumField() {
		tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if tag != "" && tag != "-" {
			known[tag] = true
		}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i].Value; !known[k] {
			return fmt.Errorf("%w: unknown parameter %q at line %d (known: %s)", ErrInvalidConfig, k, n.Content[i].Line, keys(known))
		}
	}
	if err := n.Decode(out); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return nil
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.SequenceNode:
		return "a sequence"
	case yaml.ScalarNode:
		return "a scalar"
	case yaml.AliasNode:
		return "an alias"
	}
	return "a document"
}

func keys[V any](m map[string]V) string {
	s := keysSlice(m)
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func keysSlice[V any](m map[string]V) []string {
	s := make([]string, 0, len(m))
	for k := range m {
		s = append(s, k)
	}
	slices.Sort(s)
	return s
}
