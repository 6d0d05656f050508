package metrics

// RecordLine is a Record as one JSON line (bench replay --records): one
// request of one run of one policy. Durations are in milliseconds: TTFT,
// ITL and E2E in workload time, Route and QueueWait in wall-clock time (as
// in the report).
type RecordLine struct {
	Path         string  `json:"path"`
	Policy       string  `json:"policy"`
	Seed         uint64  `json:"seed"`
	ID           string  `json:"id"`
	Session      string  `json:"session,omitempty"`
	Worker       string  `json:"worker,omitempty"`
	Outcome      string  `json:"outcome"`
	Code         string  `json:"code,omitempty"`
	ArrivalMS    float64 `json:"arrival_ms"`
	PromptTokens int     `json:"prompt_tokens"`
	PromptBlocks int     `json:"prompt_blocks"`
	CachedBlocks int     `json:"cached_blocks"`
	RouterBlocks int     `json:"router_blocks"`
	OutputTokens int     `json:"output_tokens"`
	TTFTMS       float64 `json:"ttft_ms"`
	ITLMS        float64 `json:"itl_ms"`
	E2EMS        float64 `json:"e2e_ms"`
	RouteMS      float64 `json:"route_ms"`
	QueueWaitMS  float64 `json:"queue_wait_ms"`
	// A split request's prefill worker (docs/pd.md).
	PrefillWorker  string `json:"prefill_worker,omitempty"`
	TransferBlocks int    `json:"transfer_blocks,omitempty"`
}

// Line returns r as a RecordLine of the given path, policy and run seed.
func (r *Record) Line(path, policy string, seed uint64) RecordLine {
	return RecordLine{
		Path: path, Policy: policy, Seed: seed, ID: r.ID, Session: r.Session, Worker: r.Worker,
		Outcome: r.Outcome.String(), Code: r.Code, ArrivalMS: ms(r.Arrival),
		PromptTokens: r.PromptTokens, PromptBlocks: r.PromptBlocks, CachedBlocks: r.CachedBlocks,
		RouterBlocks: r.RouterBlocks, OutputTokens: r.OutputTokens,
		TTFTMS: ms(r.TTFT), ITLMS: ms(r.ITL), E2EMS: ms(r.E2E), RouteMS: ms(r.Route), QueueWaitMS: ms(r.QueueWait),
		PrefillWorker: r.PrefillWorker, TransferBlocks: r.TransferBlocks,
	}
}
