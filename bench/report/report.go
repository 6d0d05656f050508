package report

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvrouter/kvrouter/bench/metrics"
	"github.com/kvrouter/kvrouter/bench/workload"
)

// Version of the JSON layout; bump on incompatible changes.
const Version = 1

// ErrReport wraps failures to write or read a report.
var ErrReport = errors.New("report")

// Report is one comparison run.
type Report struct {
	Version  int       `json:"version"`
	Title    string    `json:"title"`
	Created  time.Time `json:"created"`
	Workload Workload  `json:"workload"`
	Setup    Setup     `json:"setup"`
	// Unloaded is round-robin's TTFT with one request at a time, the
	// reference the load level is judged against (optional).
	Unloaded *metrics.Dist     `json:"unloaded_ttft,omitempty"`
	Policies []metrics.Summary `json:"policies"`
	Checks   []Check           `json:"checks,omitempty"`
	Notes    []string          `json:"notes,omitempty"`
}

// Workload describes what was replayed.
type Workload struct {
	Name       string          `json:"name"`
	Stats      workload.Stats  `json:"stats"`
	LoadScale  float64         `json:"load_scale"`
	UpperBound workload.Bound  `json:"upper_bound"`           // at the engine block size
	TraceBound *workload.Bound `json:"trace_bound,omitempty"` // in trace blocks, for traces
	// Part is the held-out part replayed; nil when the workload was not a
	// declared part (no held-out rule applied).
	Part *workload.PartInfo `json:"part,omitempty"`
	// MaxTokens is the max_tokens every client sent: all that routers and
	// bookings knew of a reply's length. Truncated counts the requests
	// whose own output was longer and stopped there.
	MaxTokens int `json:"max_tokens,omitempty"`
	Truncated int `json:"truncated,omitempty"`
}

// Setup describes the stack it was replayed on.
type Setup struct {
	Workers int `json:"workers"`
	// Fleet is the PD policies' prefill/decode split ("4p4d"); empty when
	// every policy ran on an aggregated fleet.
	Fleet       string  `json:"fleet,omitempty"`
	Replicas    int     `json:"replicas"`
	KVBlocks    int     `json:"kv_blocks"`
	BlockSize   int     `json:"block_size"`
	Speedup     float64 `json:"speedup"`
	SessionMode string  `json:"session_mode"`
	// Runs is how many times the comparison ran (figures are medians).
	Runs int `json:"runs,omitempty"`
	// Paths are the paths the policies ran over, in order ("nats",
	// "gateway"); empty in reports written before paths existed (nats).
	Paths     []string `json:"paths,omitempty"`
	Seed      uint64   `json:"seed"`
	Machine   string   `json:"machine,omitempty"`
	GoVersion string   `json:"go_version,omitempty"`
}

// Check is one target of the issue evaluated on this run.
type Check struct {
	Name string `json:"name"`
	Want string `json:"want"`
	Got  string `json:"got"`
	Pass bool   `json:"pass"`
}

// Policy returns the summary of the named policy, or nil.
func (r *Report) Policy(name string) *metrics.Summary {
	for i := range r.Policies {
		if r.Policies[i].Policy == name {
			return &r.Policies[i]
		}
	}
	return nil
}

// PolicyOn returns the summary of the named policy over path, or nil.
func (r *Report) PolicyOn(name, path string) *metrics.Summary {
	for i := range r.Policies {
		if p := &r.Policies[i]; p.Policy == name && p.Path == path {
			return p
		}
	}
	return nil
}

// Merge appends the rows of other reports of the same workload and setup
// (for example one run per path) to r: their paths join r's, their notes
// are added once. Checks are left to the caller to recompute.
func (r *Report) Merge(others ...*Report) error {
	for _, o := range others {
		if o.Workload.Name != r.Workload.Name || o.Workload.Stats.Requests != r.Workload.Stats.Requests || o.Workload.LoadScale != r.Workload.LoadScale {
			return fmt.Errorf("%w: merge %s (%d requests at %gx) into %s (%d at %gx): different workloads", ErrReport,
				o.Workload.Name, o.Workload.Stats.Requests, o.Workload.LoadScale, r.Workload.Name, r.Workload.Stats.Requests, r.Workload.LoadScale)
		}
		paths := o.Setup.Paths
		if len(paths) == 0 {
			paths = []string{defaultPath}
		}
		if len(r.Setup.Paths) == 0 {
			r.Setup.Paths = []string{defaultPath}
		}
		for i := range r.Policies {
			r.Policies[i].Path = pathOf(&r.Policies[i])
		}
		for _, p := range paths {
			if !slices.Contains(r.Setup.Paths, p) {
				r.Setup.Paths = append(r.Setup.Paths, p)
			}
		}
		for _, p := range o.Policies {
			p.Path = pathOf(&p)
			r.Policies = append(r.Policies, p)
		}
		for _, n := range o.Notes {
			if !slices.Contains(r.Notes, n) {
				r.Notes = append(r.Notes, n)
			}
		}
	}
	return nil
}

// ReadmeTable writes the short results table of the README: per row the
// hit ratio against the bound and TTFT p50 and p99, with their spread when
// the figures are medians over runs.
func (r *Report) ReadmeTable(w io.Writer) error {
	var b strings.Builder
	b.WriteString("| policy | path | prefix-cache hit ratio | TTFT p50 | TTFT p99 |\n|---|---|---:|---:|---:|\n")
	for _, p := range r.Policies {
		path := p.Path
		if path == "" {
			path = "nats"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", p.Name(), path,
			pctSpread(p.HitRatio, p.Runs, func(s *metrics.RunSpread) [2]float64 { return s.HitRatio }),
			msSpread(p.TTFT.P50, p.Runs, func(s *metrics.RunSpread) [2]float64 { return s.TTFTP50 }),
			msSpread(p.TTFT.P99, p.Runs, func(s *metrics.RunSpread) [2]float64 { return s.TTFTP99 }))
	}
	fmt.Fprintf(&b, "\nInfinite-cache bound: %.1f %%.", 100*r.Workload.UpperBound.Ratio)
	if pt := r.Workload.Part; pt != nil {
		fmt.Fprintf(&b, " Held-out part: %s (%s).", pt.Part, pt.Rule)
	}
	b.WriteString("\n")
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("%w: readme table: %w", ErrReport, err)
	}
	return nil
}

// multiPath reports whether rows of several paths are shown together.
func (r *Report) multiPath() bool { return len(r.Setup.Paths) > 1 }

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("%w: encode json: %w", ErrReport, err)
	}
	return nil
}

// ReadJSON reads a report written by WriteJSON.
func ReadJSON(rd io.Reader) (*Report, error) {
	var r Report
	if err := json.NewDecoder(rd).Decode(&r); err != nil {
		return nil, fmt.Errorf("%w: decode json: %w", ErrReport, err)
	}
	if r.Version != Version {
		return nil, fmt.Errorf("%w: version %d, this build reads %d", ErrReport, r.Version, Version)
	}
	return &r, nil
}

// Files names what WriteAll produced.
type Files struct {
	Markdown string
	JSON     string
	Charts   []string
}

// WriteAll writes report.json, report.md and the PNG charts into dir.
func (r *Report) WriteAll(dir string) (Files, error) {
	var f Files
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return f, fmt.Errorf("%w: create %s: %w", ErrReport, dir, err)
	}
	charts, err := r.Charts(dir)
	if err != nil {
		return f, err
	}
	f.Charts = charts
	f.JSON = filepath.Join(dir, "report.json")
	if err := writeFile(f.JSON, r.WriteJSON); err != nil {
		return f, err
	}
	f.Markdown = filepath.Join(dir, "report.md")
	rel := make([]string, len(charts))
	for i, c := range charts {
		rel[i] = filepath.Base(c)
	}
	if err := writeFile(f.Markdown, func(w io.Writer) error { return r.Markdown(w, rel) }); err != nil {
		return f, err
	}
	return f, nil
}

func writeFile(path string, fill func(io.Writer) error) error {
	tmp := path + ".tmp"
	fh, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("%w: create %s: %w", ErrReport, tmp, err)
	}
	if err := fill(fh); err != nil {
		fh.Close()
		os.Remove(tmp)
		return err
	}
	if err := fh.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("%w: write %s: %w", ErrReport, tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("%w: rename to %s: %w", ErrReport, path, err)
	}
	return nil
}

// Table writes the per-policy comparison as aligned columns.
func (r *Report) Table(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tdone\trejected\thit %\tof bound\tTTFT p50\tp90\tp99 ms\tITL p50\tE2E p50\tp99 ms\treq/s\tload max/mean\tCV\tsessions moved\troute p50\tp99 µs\t")
	for _, s := range r.Policies {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.0f%%\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t%s\t%.0f\t%.0f\t\n",
			s.Label(r.multiPath()), s.Done, s.Rejected+s.Failed, 100*s.HitRatio, 100*s.OfUpperBound,
			num(s.TTFT.P50), num(s.TTFT.P90), num(s.TTFT.P99), num(s.ITL.P50), num(s.E2E.P50), num(s.E2E.P99),
			s.RequestsPerSec, s.RequestSpread.MaxOverMean, s.RequestSpread.CV, moved(s),
			1000*s.Route.P50, 1000*s.Route.P99)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("%w: table: %w", ErrReport, err)
	}
	for _, c := range r.Checks {
		mark := "PASS"
		if !c.Pass {
			mark = "MISS"
		}
		if _, err := fmt.Fprintf(w, "%s  %s: want %s, got %s\n", mark, c.Name, c.Want, c.Got); err != nil {
			return fmt.Errorf("%w: table: %w", ErrReport, err)
		}
	}
	return nil
}

// pathsSection puts kvrouter's figures over each path side by side when
// more than one path ran, so that the real path's cost is visible.
func (r *Report) pathsSection(b *strings.Builder) {
	if !r.multiPath() {
		return
	}
	b.WriteString("\n## kvrouter over each path\n\n| path | hit ratio | TTFT p50 | TTFT p99 | E2E p50 | E2E p99 | router-predicted hit |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, path := range r.Setup.Paths {
		p := r.PolicyOn("kvrouter", path)
		if p == nil {
			continue
		}
		fmt.Fprintf(b, "| %s | %.1f %% | %s ms | %s ms | %s ms | %s ms | %.1f %% |\n", path, 100*p.HitRatio,
			num(p.TTFT.P50), num(p.TTFT.P99), num(p.E2E.P50), num(p.E2E.P99), 100*p.RouterHit)
	}
	b.WriteString("\nOn the nats path latencies are the engines' model time plus the router queue wait, times the speed-up; on the gateway path they are what the OpenAI client measured (wall clock times the speed-up), so transport, gateway, tokenizing and bridge lag are included.\n")
}

func pathsText(paths []string) string {
	var parts []string
	for _, p := range paths {
		switch p {
		case "nats":
			parts = append(parts, "nats (route API and the workers' NATS endpoints; latencies = router queue wait x speed-up + the engine's model time)")
		case "gateway":
			parts = append(parts, "gateway (an OpenAI client per request through the gateway; vLLM-faced engines, ZMQ events, one bridge each; latencies = the client's wall clock x speed-up)")
		default:
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "; ")
}

// pctSpread prints a ratio as a percentage with its run spread.
func pctSpread(v float64, sp *metrics.RunSpread, get func(*metrics.RunSpread) [2]float64) string {
	if sp == nil {
		return fmt.Sprintf("%.1f %%", 100*v)
	}
	r := get(sp)
	return fmt.Sprintf("%.1f %% [%.1f, %.1f]", 100*v, 100*r[0], 100*r[1])
}

// msSpread prints a latency in ms with its run spread.
func msSpread(v float64, sp *metrics.RunSpread, get func(*metrics.RunSpread) [2]float64) string {
	if sp == nil {
		return num(v) + " ms"
	}
	r := get(sp)
	return fmt.Sprintf("%s ms [%s, %s]", num(v), num(r[0]), num(r[1]))
}

func moved(s metrics.Summary) string {
	if s.Sessions == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/%d", s.SessionsMoved, s.Sessions)
}

// num prints a millisecond figure with sensible precision.
func num(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// Markdown writes the report; charts are image paths relative to it.
func (r *Report) Markdown(w io.Writer, charts []string) error {
	var b strings.Builder
	title := r.Title
	if title == "" {
		title = "kvrouter replay: " + r.Workload.Name
	}
	fmt.Fprintf(&b, "# %s\n\n", title)
	fmt.Fprintf(&b, "Generated by `kvrouter bench replay` on %s.\n\n", r.Created.UTC().Format("2006-01-02 15:04 MST"))
	r.setupSection(&b)
	r.resultsSection(&b)
	r.pooledSection(&b)
	r.shareSection(&b)
	r.pdSection(&b)
	r.pathsSection(&b)
	r.targetsSection(&b)
	r.whySection(&b)
	r.notesSection(&b)
	if len(charts) > 0 {
		b.WriteString("\n## Charts\n\n")
		for _, c := range charts {
			fmt.Fprintf(&b, "![%s](%s)\n\n", strings.TrimSuffix(filepath.Base(c), ".png"), c)
		}
	}
	b.WriteString("\nRoute and queued are wall-clock times of the routing call and of its wait in the router's queue; on the gateway path, as the gateway timed them (its Server-Timing header).\n")
	b.WriteString("\nHit ratio = prompt blocks the engine found cached / prompt blocks (full blocks of the served requests), " +
		"as reported by the simulated engines. The upper bound is the same ratio for one infinite cache shared by the whole fleet.\n")
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("%w: markdown: %w", ErrReport, err)
	}
	return nil
}

// setupSection is the table of what ran: workload, part, fleet, clock.
func (r *Report) setupSection(b *strings.Builder) {
	st := r.Workload.Stats
	b.WriteString("## Setup\n\n| | |\n|---|---|\n")
	fmt.Fprintf(b, "| workload | %s: %d requests, %d sessions, %.0f s span (%.2f req/s), mean input %.0f / output %.0f tokens |\n",
		r.Workload.Name, st.Requests, st.Sessions, st.SpanSeconds, st.RatePerSecond, st.MeanInput, st.MeanOutput)
	fmt.Fprintf(b, "| part | %s |\n", partText(r.Workload.Part))
	if r.Workload.MaxTokens > 0 {
		fmt.Fprintf(b, "| max_tokens | %d sent with every request: routers and bookings never saw a reply's true length; engines generated each request's own output length, at most that (%d requests stopped there) |\n",
			r.Workload.MaxTokens, r.Workload.Truncated)
	}
	fmt.Fprintf(b, "| load scale | %gx the workload's arrival rate |\n", r.Workload.LoadScale)
	ub := r.Workload.UpperBound
	fmt.Fprintf(b, "| infinite-cache upper bound | %.1f %% of %d-token blocks (%d of %d)", 100*ub.Ratio, ub.BlockSize, ub.ReusableBlocks, ub.PromptBlocks)
	if tb := r.Workload.TraceBound; tb != nil {
		fmt.Fprintf(b, "; %.1f %% of trace blocks", 100*tb.Ratio)
	}
	b.WriteString(" |\n")
	s := r.Setup
	fmt.Fprintf(b, "| fleet | %d simulated workers, %d KV blocks of %d tokens each |\n", s.Workers, s.KVBlocks, s.BlockSize)
	if s.Fleet != "" {
		fmt.Fprintf(b, "| prefill/decode | the PD policies on a %s split (prefill workers, then decode workers); the others on the same number of whole (`both`) workers |\n", s.Fleet)
	}
	fmt.Fprintf(b, "| routers | %d replica(s), session mode %s |\n", s.Replicas, s.SessionMode)
	fmt.Fprintf(b, "| clock | %gx real time; latencies are in workload time, except routing decisions: wall clock |\n", s.Speedup)
	paths := s.Paths
	if len(paths) == 0 {
		paths = []string{"nats"}
	}
	fmt.Fprintf(b, "| path | %s |\n", pathsText(paths))
	if s.Runs > 1 {
		fmt.Fprintf(b, "| runs | %d; every figure is the median, [lowest, highest] beside the main ones |\n", s.Runs)
	}
	if s.Machine != "" {
		fmt.Fprintf(b, "| machine | %s, %s |\n", s.Machine, s.GoVersion)
	}
	if r.Unloaded != nil {
		fmt.Fprintf(b, "| unloaded TTFT | p50 %s ms, p99 %s ms (one request at a time) |\n", num(r.Unloaded.P50), num(r.Unloaded.P99))
	}
}

// partText says which held-out part ran, and what that makes the figures.
func partText(p *workload.PartInfo) string {
	switch {
	case p == nil:
		return "not a declared held-out part: no held-out rule applied"
	case p.Part == workload.PartTune:
		return "**tuning part** (" + p.Rule + "): figures to tune on, not evaluation figures"
	}
	return "evaluation part (" + p.Rule + "); rows marked IN-SAMPLE ran on it although tuned on it"
}

// resultsSection is the table of every policy's figures.
func (r *Report) resultsSection(b *strings.Builder) {
	b.WriteString("\n## Results\n\n")
	b.WriteString("| policy | path | done | rejected | hit ratio | of upper bound | TTFT p50 | TTFT p90 | TTFT p99 | ITL p50 | E2E p50 | E2E p99 | req/s | out tok/s | load max/mean | load CV | prefill max/mean | sessions moved | route p50 | route p99 | queued p99 |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range r.Policies {
		path := p.Path
		if path == "" {
			path = "nats"
		}
		fmt.Fprintf(b, "| %s | %s | %d | %d | %s | %.0f %% | %s | %s ms | %s | %s ms | %s | %s ms | %.2f | %.0f | %.2f | %.2f | %.2f | %s | %s ms | %s ms | %s ms |\n",
			p.Name(), path, p.Done, p.Rejected+p.Failed, pctSpread(p.HitRatio, p.Runs, func(s *metrics.RunSpread) [2]float64 { return s.HitRatio }), 100*p.OfUpperBound,
			msSpread(p.TTFT.P50, p.Runs, func(s *metrics.RunSpread) [2]float64 { return s.TTFTP50 }), num(p.TTFT.P90),
			msSpread(p.TTFT.P99, p.Runs, func(s *metrics.RunSpread) [2]float64 { return s.TTFTP99 }), num(p.ITL.P50),
			msSpread(p.E2E.P50, p.Runs, func(s *metrics.RunSpread) [2]float64 { return s.E2EP50 }), num(p.E2E.P99),
			p.RequestsPerSec, p.OutputTokPerSec, p.RequestSpread.MaxOverMean, p.RequestSpread.CV, p.PrefillSpread.MaxOverMean,
			moved(p), num(p.Route.P50), num(p.Route.P99), num(p.Queue.P99))
	}
}

// pooledSection gives, over several runs, each policy's TTFT over every
// run's requests together (metrics.RunSpread.PooledTTFT): one percentile
// over all of them, beside the results' medians of each run's.
func (r *Report) pooledSection(b *strings.Builder) {
	head := false
	for _, p := range r.Policies {
		if p.Runs == nil || p.Runs.PooledTTFT.N == 0 {
			continue
		}
		if !head {
			fmt.Fprintf(b, "\n## TTFT pooled over the %d runs\n\n", p.Runs.N)
			b.WriteString("| policy | requests | TTFT p50 | TTFT p90 | TTFT p99 | TTFT max |\n|---|---:|---:|---:|---:|---:|\n")
			head = true
		}
		d := p.Runs.PooledTTFT
		fmt.Fprintf(b, "| %s | %d | %s ms | %s ms | %s ms | %s ms |\n", p.Label(r.multiPath()), d.N, num(d.P50), num(d.P90), num(d.P99), num(d.Max))
	}
}

// shareSection lists the lowest cached-share estimate each policy's
// routers reported: a default cost with decode_weight_full_share s (0.5 by
// default) runs its decode-block weight whole while the estimate is at
// least s.
func (r *Report) shareSection(b *strings.Builder) {
	head := false
	for _, p := range r.Policies {
		if p.CachedShareLow == nil {
			continue
		}
		if !head {
			b.WriteString("\n## The routers' cached-share estimate\n\n")
			b.WriteString("The lowest share of the prompt blocks the replicas routed lately that their chosen worker already held " +
				"(`kvr_scheduler_cached_share`, sampled every 20 ms, the lowest over the runs). The default cost with " +
				"`decode_weight_full_share` s (0.5 by default) runs its decode-block weight whole while the estimate is at least s, " +
				"and below it too while the admission queue held requests lately.\n\n")
			b.WriteString("| policy | lowest estimate |\n|---|---:|\n")
			head = true
		}
		fmt.Fprintf(b, "| %s | %.3f |\n", p.Label(r.multiPath()), *p.CachedShareLow)
	}
}

// pdSection compares the policies of a split-fleet run (Setup.Fleet):
// latencies, hit ratio per side and what the split costs. An aggregated
// row's prefill side is its whole engine; it has no decode side.
func (r *Report) pdSection(b *strings.Builder) {
	if r.Setup.Fleet == "" {
		return
	}
	b.WriteString("\n## Prefill/decode split\n\n")
	b.WriteString("| policy | fleet | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | prefill-side hit | decode-side hit | split / single | blocks pulled per request | transfer p50 | transfer p99 | prefill leg p50 | prefill leg p99 |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range r.Policies {
		if p.PD == nil {
			fmt.Fprintf(b, "| %s | %d both | %s ms | %s ms | %s ms | %s ms | %.1f %% | - | - | - | - | - | - | - |\n", p.Label(r.multiPath()), r.Setup.Workers,
				num(p.TTFT.P50), num(p.TTFT.P99), num(p.ITL.P50), num(p.ITL.P99), 100*p.HitRatio)
			continue
		}
		d := p.PD
		fmt.Fprintf(b, "| %s | %s | %s ms | %s ms | %s ms | %s ms | %.1f %% | %.1f %% | %d / %d | %.1f | %s ms | %s ms | %s ms | %s ms |\n", p.Label(r.multiPath()), r.Setup.Fleet,
			num(p.TTFT.P50), num(p.TTFT.P99), num(p.ITL.P50), num(p.ITL.P99), 100*d.PrefillHit, 100*d.DecodeHit, d.Split, d.Single,
			d.TransferBlocks, num(d.Transfer.P50), num(d.Transfer.P99), num(d.PrefillLeg.P50), num(d.PrefillLeg.P99))
	}
	b.WriteString("\nTPOT is each request's mean time per output token (ITL) on the engine that decoded it. Prefill-side hit = prompt blocks cached on the engine that computed the prompt / prompt blocks; decode-side hit = prompt blocks the decode engine already held and did not pull. A split request's TTFT = router queue + prefill leg (its engine's queue and compute) + transfer + the decode engine's time to first token.\n")
}

// targetsSection is the table of the targets, when checked.
func (r *Report) targetsSection(b *strings.Builder) {
	if len(r.Checks) == 0 {
		return
	}
	b.WriteString("\n## Targets\n\n| target | want | got | |\n|---|---|---|---|\n")
	for _, c := range r.Checks {
		mark := "met"
		if !c.Pass {
			mark = "**missed**"
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", c.Name, c.Want, c.Got, mark)
	}
}

// notesSection is the run's notes and what the stack measured about itself.
func (r *Report) notesSection(b *strings.Builder) {
	if len(r.Notes) > 0 {
		b.WriteString("\n## Notes\n\n")
		for _, n := range r.Notes {
			fmt.Fprintf(b, "- %s\n", n)
		}
	}
	for _, p := range r.Policies {
		if len(p.Diagnostics) == 0 {
			continue
		}
		fmt.Fprintf(b, "\n### Measured in the stack: %s (%s)\n\n", p.Name(), p.Path)
		for _, d := range p.Diagnostics {
			fmt.Fprintf(b, "- %s\n", d)
		}
	}
}
