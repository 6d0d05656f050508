package metrics

import (
	"math"
	"sort"
	"sync"
	"time"
)

// Outcome is how a request ended.
type Outcome uint8

const (
	Done     Outcome = iota // served to the last token
	Rejected                // the router refused it (overloaded, no eligible worker, pin conflict...)
	Failed                  // routing or serving failed for another reason
)

func (o Outcome) String() string {
	switch o {
	case Done:
		return "done"
	case Rejected:
		return "rejected"
	case Failed:
		return "failed"
	}
	return "unknown"
}

// Record is what the replay learned about one request.
type Record struct {
	ID      string
	Session string
	Worker  string // "" when never routed
	Replica int    // which router replica answered
	Outcome Outcome
	Code    string // error code for Rejected/Failed

	Arrival      time.Duration // workload time the request was due
	PromptTokens int
	PromptBlocks int // full engine blocks of the prompt
	CachedBlocks int // of which the engine found in its cache (engine truth)
	RouterBlocks int // overlap the router predicted

	OutputTokens int
	TTFT         time.Duration // arrival to first token, workload time
	ITL          time.Duration // mean inter-token latency, workload time
	E2E          time.Duration // arrival to last token, workload time
	Finish       time.Duration // workload time of the last token
	Route        time.Duration // routing decision, wall clock
	QueueWait    time.Duration // part of Route spent waiting in the router's queue, wall clock

	// A request split over a prefill and a decode worker (docs/pd.md):
	// PrefillWorker prefilled it (CachedBlocks and RouterBlocks are that
	// engine's), Worker decoded it. DecodeHeldBlocks are the prompt blocks
	// the decode engine already held (not transferred), TransferBlocks
	// those it pulled, Transfer their time and PrefillLeg the prefill
	// leg's (engine queue and compute), in workload time.
	PrefillWorker    string
	DecodeHeldBlocks int
	TransferBlocks   int
	Transfer         time.Duration
	PrefillLeg       time.Duration
}

// Recorder collects records concurrently.
type Recorder struct {
	mu   sync.Mutex
	recs []Record
}

// NewRecorder returns a recorder with room for n records.
func NewRecorder(n int) *Recorder { return &Recorder{recs: make([]Record, 0, n)} }

// Add stores one record.
func (r *Recorder) Add(rec Record) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
}

// Records returns a copy of what was recorded.
func (r *Recorder) Records() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Record(nil), r.recs...)
}

// Len is the number of records so far.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.recs)
}

// Dist summarises a latency distribution in milliseconds.
type Dist struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
}

// CDFPoints is the number of quantiles kept per distribution for charts.
const CDFPoints = 101

// WorkerTotals is what one worker served under one policy: a row of the
// summary's per-worker table.
type WorkerTotals struct {
	Worker        string `json:"worker"`
	Requests      int    `json:"requests"`
	PrefillTokens int64  `json:"prefill_tokens"` // uncached prompt tokens it computed
	CachedBlocks  int64  `json:"cached_blocks"`
}

// Spread measures imbalance across workers: max over mean and the
// coefficient of variation (stddev / mean); 1 and 0 are perfectly even.
type Spread struct {
	MaxOverMean float64 `json:"max_over_mean"`
	CV          float64 `json:"cv"`
}

// Summary is one policy's result.
type Summary struct {
	Policy string `json:"policy"`
	// Path is how the requests reached the fleet: "nats" (the route API and
	// the workers' NATS endpoints) or "gateway" (OpenAI clients through the
	// gateway, bridges and vLLM-faced engines).
	Path     string `json:"path"`
	Requests int    `json:"requests"`
	Done     int    `json:"done"`
	Rejected int    `json:"rejected"`
	Failed   int    `json:"failed"`
	// Codes counts rejection and failure codes.
	Codes map[string]int `json:"codes,omitempty"`

	PromptBlocks int64   `json:"prompt_blocks"`
	CachedBlocks int64   `json:"cached_blocks"`
	HitRatio     float64 `json:"hit_ratio"`            // cached / prompt blocks, served requests
	UpperBound   float64 `json:"upper_bound"`          // infinite-cache ratio of the workload
	OfUpperBound float64 `json:"hit_of_upper_bound"`   // HitRatio / UpperBound
	RouterHit    float64 `json:"router_predicted_hit"` // router-predicted overlap / prompt blocks

	TTFT  Dist `json:"ttft"`
	ITL   Dist `json:"itl"`
	E2E   Dist `json:"e2e"`
	Route Dist `json:"route_decision"`    // wall clock
	Queue Dist `json:"router_queue_wait"` // wall clock, the part of Route spent queued

	// TTFTCDF holds CDFPoints quantiles (0, 1 %, ..., 100 %) of TTFT in ms.
	TTFTCDF []float64 `json:"ttft_cdf_ms"`
	// TTFTs is every served request's TTFT in ms, sorted: what PooledTTFT
	// pools over runs. Not written to reports.
	TTFTs []float64 `json:"-"`

	MakespanSeconds  float64 `json:"makespan_s"` // workload time from first arrival to last token
	RequestsPerSec   float64 `json:"requests_per_s"`
	OutputTokPerSec  float64 `json:"output_tokens_per_s"`
	PrefillTokPerSec float64 `json:"prefill_tokens_per_s"`

	Workers       []WorkerTotals `json:"workers"`
	RequestSpread Spread         `json:"request_spread"`
	PrefillSpread Spread         `json:"prefill_spread"`

	Sessions      int `json:"sessions"`
	SessionsMoved int `json:"sessions_moved"` // sessions served by more than one worker
	SessionMoves  int `json:"session_moves"`  // consecutive requests of a session on different workers

	WallSeconds float64 `json:"wall_s"` // how long the replay of this policy took

	// LoadOverTime samples, at LoadSamples evenly spaced workload times
	// over the makespan, the busiest worker's in-flight requests over the
	// fleet's mean (1 = even; 0 where nothing was in flight).
	LoadOverTime []float64 `json:"load_over_time,omitempty"`

	// CachedShareLow is the lowest cached-share estimate any router
	// reported while the run lasted (sampled; replay.ShareProber), nil when
	// the stack reports none. Over several runs it is the lowest of them.
	CachedShareLow *float64 `json:"cached_share_low,omitempty"`

	// Runs is set when the figures are medians over several runs.
	Runs *RunSpread `json:"runs,omitempty"`

	// InSample marks a policy run on an evaluation part it was tuned on
	// (replay's --allow-in-sample): its figures are not held out.
	InSample bool `json:"in_sample,omitempty"`

	// Diagnostics are what the stack measured about itself during the
	// run (for example how far two replicas' views drifted apart).
	Diagnostics []string `json:"diagnostics,omitempty"`

	// PD is set for a policy that asked for prefill/decode pairs
	// (Options.PD).
	PD *PDSummary `json:"pd,omitempty"`
}

// PDSummary is what a prefill/decode split did, over the served requests.
// Time per output token is Summary.ITL (each request's mean inter-token
// latency, on its decode engine).
type PDSummary struct {
	Split  int `json:"split"`  // served over a prefill and a decode worker
	Single int `json:"single"` // served whole by one worker (the single-worker rule)
	// PrefillHit is the split requests' prompt blocks cached on their
	// prefill engine over their prompt blocks; DecodeHit the prompt blocks
	// their decode engine already held, not transferred.
	PrefillHit float64 `json:"prefill_hit"`
	DecodeHit  float64 `json:"decode_hit"`
	// TransferBlocks is the mean of blocks pulled per split request.
	TransferBlocks float64 `json:"transfer_blocks_mean"`
	Transfer       Dist    `json:"transfer"`    // transfer time, workload time
	PrefillLeg     Dist    `json:"prefill_leg"` // prefill leg (engine queue and compute), workload time
}

// LoadSamples is the number of points of Summary.LoadOverTime.
const LoadSamples = 60

// RunSpread is how the main figures varied over repeated runs: the
// summary's own figures are the medians, these the lowest and highest.
type RunSpread struct {
	N        int        `json:"n"`
	HitRatio [2]float64 `json:"hit_ratio"`
	TTFTP50  [2]float64 `json:"ttft_p50_ms"`
	TTFTP99  [2]float64 `json:"ttft_p99_ms"`
	E2EP50   [2]float64 `json:"e2e_p50_ms"`
	// PooledTTFT is the TTFT distribution of every run's served requests
	// together (PooledTTFT): one percentile over all N runs' requests,
	// where the median of N runs' p99 rests on each run's few slowest.
	// Runs replay the same requests (bench/replay), so it smooths the runs'
	// timing and tie-breaks, not the workload's own sampling, unless each
	// run replays its own sample (replay.Config.Samples).
	PooledTTFT Dist `json:"pooled_ttft"`
}

// PooledTTFT is the TTFT distribution of the served requests of every
// summary in sums together (Summary.TTFTs).
func PooledTTFT(sums []Summary) Dist {
	n := 0
	for i := range sums {
		n += len(sums[i].TTFTs)
	}
	v := make([]float64, 0, n)
	for i := range sums {
		v = append(v, sums[i].TTFTs...)
	}
	d, _ := dist(v, false)
	return d
}

// Name is the policy's name as reports show it: marked IN-SAMPLE when it
// ran on an evaluation part it was tuned on.
func (s *Summary) Name() string {
	if s.InSample {
		return s.Policy + " IN-SAMPLE"
	}
	return s.Policy
}

// Label names the row in reports: Name, with the path when several paths
// are shown together.
func (s *Summary) Label(withPath bool) string {
	if withPath && s.Path != "" {
		return s.Name() + " (" + s.Path + ")"
	}
	return s.Name()
}

// Options completes a Summary with what records do not carry.
type Options struct {
	Policy     string
	UpperBound float64
	BlockSize  int      // tokens per engine block, for prefill token counts
	Workers    []string // every worker of the fleet, so idle ones show in the spread
	Wall       time.Duration
	PD         bool // the policy asked for prefill/decode pairs: fill Summary.PD
}

// Summarize aggregates records. Latency and hit figures cover the requests
// that were served (Done); counts cover all.
func Summarize(recs []Record, opt Options) Summary {
	s := Summary{Policy: opt.Policy, Requests: len(recs), UpperBound: opt.UpperBound, WallSeconds: opt.Wall.Seconds()}
	sorted := append([]Record(nil), recs...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Arrival < sorted[j].Arrival })
	a := newAccumulator(opt)
	for i := range sorted {
		a.add(&s, &sorted[i])
	}
	a.finish(&s, sorted)
	return s
}

// accumulator is what Summarize gathers in one pass over the records, in
// arrival order.
type accumulator struct {
	opt                              Options
	ttft, itl, e2e, route, queue     []float64
	loads                            map[string]*WorkerTotals
	routerBlocks, outTok, prefillTok int64
	first, last                      time.Duration // served requests' first arrival (-1 = none) and last token
	sessionWorkers                   map[string]map[string]struct{}
	sessionLast                      map[string]string
	pd                               pdAccumulator
}

// pdAccumulator gathers the split requests' figures (PDSummary).
type pdAccumulator struct {
	split, single                     int
	prompt, cached, held, transferred int64
	transfer, prefillLeg              []float64
}

func (p *pdAccumulator) add(r *Record) {
	if r.PrefillWorker == "" {
		p.single++
		return
	}
	p.split++
	p.prompt += int64(r.PromptBlocks)
	p.cached += int64(min(r.CachedBlocks, r.PromptBlocks))
	p.held += int64(min(r.DecodeHeldBlocks, r.PromptBlocks))
	p.transferred += int64(r.TransferBlocks)
	p.transfer = append(p.transfer, ms(r.Transfer))
	p.prefillLeg = append(p.prefillLeg, ms(r.PrefillLeg))
}

func (p *pdAccumulator) summary() *PDSummary {
	out := &PDSummary{Split: p.split, Single: p.single}
	if p.prompt > 0 {
		out.PrefillHit = float64(p.cached) / float64(p.prompt)
		out.DecodeHit = float64(p.held) / float64(p.prompt)
	}
	if p.split > 0 {
		out.TransferBlocks = float64(p.transferred) / float64(p.split)
	}
	out.Transfer, _ = dist(p.transfer, false)
	out.PrefillLeg, _ = dist(p.prefillLeg, false)
	return out
}

func newAccumulator(opt Options) *accumulator {
	a := &accumulator{opt: opt, loads: make(map[string]*WorkerTotals), first: -1,
		sessionWorkers: make(map[string]map[string]struct{}), sessionLast: make(map[string]string)}
	for _, w := range opt.Workers {
		a.loads[w] = &WorkerTotals{Worker: w}
	}
	return a
}

// add counts one record: its routing call and outcome, and, when it was
// served, its blocks, latencies, worker and session.
func (a *accumulator) add(s *Summary, r *Record) {
	if r.Route > 0 {
		a.route = append(a.route, ms(r.Route))
		a.queue = append(a.queue, ms(r.QueueWait))
	}
	switch r.Outcome {
	case Rejected:
		s.Rejected++
	case Failed:
		s.Failed++
	}
	if r.Outcome != Done {
		if s.Codes == nil {
			s.Codes = make(map[string]int)
		}
		code := r.Code
		if code == "" {
			code = r.Outcome.String()
		}
		s.Codes[code]++
		return
	}
	s.Done++
	s.PromptBlocks += int64(r.PromptBlocks)
	s.CachedBlocks += int64(min(r.CachedBlocks, r.PromptBlocks))
	a.routerBlocks += int64(min(r.RouterBlocks, r.PromptBlocks))
	a.outTok += int64(r.OutputTokens)
	prefill := max(int64(r.PromptTokens-r.CachedBlocks*a.opt.BlockSize), 0)
	a.prefillTok += prefill
	a.ttft = append(a.ttft, ms(r.TTFT))
	if r.OutputTokens > 1 {
		a.itl = append(a.itl, ms(r.ITL))
	}
	a.e2e = append(a.e2e, ms(r.E2E))
	if a.first < 0 || r.Arrival < a.first {
		a.first = r.Arrival
	}
	a.last = max(a.last, r.Finish, r.Arrival+r.E2E)
	a.addWorker(r, prefill)
	a.addSession(s, r)
	if a.opt.PD {
		a.pd.add(r)
	}
}

func (a *accumulator) addWorker(r *Record, prefill int64) {
	if r.Worker == "" {
		return
	}
	l := a.worker(r.Worker)
	l.Requests++
	if r.PrefillWorker != "" {
		// a split request served both its workers; its prefill ran on
		// the prefill worker
		l = a.worker(r.PrefillWorker)
		l.Requests++
	}
	l.PrefillTokens += prefill
	l.CachedBlocks += int64(r.CachedBlocks)
}

// worker is w's totals, made on first use.
func (a *accumulator) worker(w string) *WorkerTotals {
	l := a.loads[w]
	if l == nil {
		l = &WorkerTotals{Worker: w}
		a.loads[w] = l
	}
	return l
}

func (a *accumulator) addSession(s *Summary, r *Record) {
	if r.Session == "" || r.Worker == "" {
		return
	}
	ws := a.sessionWorkers[r.Session]
	if ws == nil {
		ws = make(map[string]struct{})
		a.sessionWorkers[r.Session] = ws
	}
	ws[r.Worker] = struct{}{}
	if prev, ok := a.sessionLast[r.Session]; ok && prev != r.Worker {
		s.SessionMoves++
	}
	a.sessionLast[r.Session] = r.Worker
}

// finish turns the sums into the summary's ratios, distributions, rates,
// spreads and session counts.
func (a *accumulator) finish(s *Summary, sorted []Record) {
	if s.PromptBlocks > 0 {
		s.HitRatio = float64(s.CachedBlocks) / float64(s.PromptBlocks)
		s.RouterHit = float64(a.routerBlocks) / float64(s.PromptBlocks)
	}
	if s.UpperBound > 0 {
		s.OfUpperBound = s.HitRatio / s.UpperBound
	}
	s.TTFT, s.TTFTCDF = dist(a.ttft, true)
	s.TTFTs = a.ttft // sorted by dist
	s.ITL, _ = dist(a.itl, false)
	s.E2E, _ = dist(a.e2e, false)
	s.Route, _ = dist(a.route, false)
	s.Queue, _ = dist(a.queue, false)
	if a.first >= 0 && a.last > a.first {
		span := (a.last - a.first).Seconds()
		s.MakespanSeconds = span
		s.RequestsPerSec = float64(s.Done) / span
		s.OutputTokPerSec = float64(a.outTok) / span
		s.PrefillTokPerSec = float64(a.prefillTok) / span
	}
	for _, l := range a.loads {
		s.Workers = append(s.Workers, *l)
	}
	sort.Slice(s.Workers, func(i, j int) bool { return naturalLess(s.Workers[i].Worker, s.Workers[j].Worker) })
	reqs := make([]float64, len(s.Workers))
	pre := make([]float64, len(s.Workers))
	for i, l := range s.Workers {
		reqs[i], pre[i] = float64(l.Requests), float64(l.PrefillTokens)
	}
	s.RequestSpread, s.PrefillSpread = spread(reqs), spread(pre)
	s.LoadOverTime = loadOverTime(sorted, a.opt.Workers, a.first, a.last)
	s.Sessions = len(a.sessionWorkers)
	for _, ws := range a.sessionWorkers {
		if len(ws) > 1 {
			s.SessionsMoved++
		}
	}
	if a.opt.PD {
		s.PD = a.pd.summary()
	}
}

// loadOverTime samples max/mean of the workers' in-flight requests (from
// arrival to last token) at LoadSamples times between first and last.
func loadOverTime(recs []Record, workers []string, first, last time.Duration) []float64 {
	if first < 0 || last <= first || len(workers) == 0 {
		return nil
	}
	idx := make(map[string]int, len(workers))
	for i, w := range workers {
		idx[w] = i
	}
	step := (last - first) / LoadSamples
	counts := make([][]int, LoadSamples)
	for i := range counts {
		counts[i] = make([]int, len(workers))
	}
	for i := range recs {
		r := &recs[i]
		w, ok := idx[r.Worker]
		if r.Outcome != Done || !ok || step <= 0 {
			continue
		}
		lo := int((r.Arrival - first + step - 1) / step) // first sample at or after arrival
		hi := int((r.Arrival + r.E2E - first) / step)
		for k := max(lo, 0); k <= min(hi, LoadSamples-1); k++ {
			counts[k][w]++
		}
	}
	out := make([]float64, LoadSamples)
	for k, c := range counts {
		sum, mx := 0, 0
		for _, v := range c {
			sum += v
			mx = max(mx, v)
		}
		if sum > 0 {
			out[k] = float64(mx) * float64(len(c)) / float64(sum)
		}
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func dist(v []float64, cdf bool) (Dist, []float64) {
	d := Dist{N: len(v)}
	if len(v) == 0 {
		return d, nil
	}
	sort.Float64s(v)
	var sum float64
	for _, x := range v {
		sum += x
	}
	d.Mean = sum / float64(len(v))
	d.P50, d.P90, d.P99 = Quantile(v, 0.50), Quantile(v, 0.90), Quantile(v, 0.99)
	d.Max = v[len(v)-1]
	var pts []float64
	if cdf {
		pts = make([]float64, CDFPoints)
		for i := range pts {
			pts[i] = Quantile(v, float64(i)/float64(CDFPoints-1))
		}
	}
	return d, pts
}

// Quantile of sorted values by linear interpolation between closest ranks.
func Quantile(sorted []float64, q float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	if q <= 0 {
		return sorted[0]
	}
	if q >= 1 {
		return sorted[n-1]
	}
	pos := q * float64(n-1)
	i := int(pos)
	frac := pos - float64(i)
	if i+1 >= n {
		return sorted[n-1]
	}
	return sorted[i] + frac*(sorted[i+1]-sorted[i])
}

func spread(v []float64) Spread {
	if len(v) == 0 {
		return Spread{}
	}
	var sum, mx float64
	for _, x := range v {
		sum += x
		mx = max(mx, x)
	}
	mean := sum / float64(len(v))
	if mean == 0 {
		return Spread{}
	}
	var ss float64
	for _, x := range v {
		ss += (x - mean) * (x - mean)
	}
	return Spread{MaxOverMean: mx / mean, CV: math.Sqrt(ss/float64(len(v))) / mean}
}

// naturalLess orders "w2" before "w10".
func naturalLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := digitPrefix(a), digitPrefix(b)
		if da > 0 && db > 0 {
			na, nb := trimZeros(a[:da]), trimZeros(b[:db])
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func digitPrefix(s string) int {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

func trimZeros(s string) string {
	for len(s) > 1 && s[0] == '0' {
		s = s[1:]
	}
	return s
}
