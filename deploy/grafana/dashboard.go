package grafana

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// UID is the dashboard's uid: importing a newer version replaces the old.
const UID = "kvrouter-overview"

// ds is the Prometheus data source chosen in the dashboard's variable.
var ds = common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}

// rate is the range of every rate(): Grafana's own choice from the scrape
// interval and the panel's resolution.
const rate = "[$__rate_interval]"

// query is one line of a panel: a PromQL expression and its legend.
type query struct{ expr, legend string }

// panel is one time series panel.
type panel struct {
	title, unit, desc string
	queries           []query
}

// row is a titled group of panels, laid out two or three a line.
type row struct {
	title  string
	panels []panel
}

// quantiles are the p50 and p99 of histogram metric (its _bucket series),
// summed over every label but le.
func quantiles(metric, what string) []query {
	return []query{
		{fmt.Sprintf("histogram_quantile(0.5, sum by (le) (rate(%s_bucket%s)))", metric, rate), what + " p50"},
		{fmt.Sprintf("histogram_quantile(0.99, sum by (le) (rate(%s_bucket%s)))", metric, rate), what + " p99"},
	}
}

// rows are the dashboard's content, in the order of the issue that asked
// for it: routing, hit ratios, latency, workers, bindings, events, NATS.
func rows() []row {
	return []row{
		{"Routing", []panel{
			{"Routes by result", "reqps", "Route requests answered by the replicas, by result code (ok or the API error code).",
				[]query{{"sum by (code) (rate(kvr_route_requests_total" + rate + "))", "{{code}}"}}},
			{"Gateway requests by status", "reqps", "OpenAI requests answered by the gateways, by HTTP status (499: the client went away).",
				[]query{{"sum by (status) (rate(kvr_gateway_requests_total" + rate + "))", "{{status}}"}}},
			{"Route latency", "s", "Time a replica takes to answer a route request, queue wait included; and the route call as a gateway waits for it, the NATS round trip included (the figure its Server-Timing header reports).",
				append(quantiles("kvr_route_duration_seconds", "route"), quantiles("kvr_gateway_route_seconds", "gateway route call")...)},
		}},
		{"Cache hits: predicted and engine-reported", []panel{
			{"Hit ratio: predicted vs engine", "percentunit", "Predicted: the mean share of a routed prompt's blocks the router found cached on the chosen worker. Engine: vLLM's prefix cache hits over queries (tokens), summed over the engines. Scheduler estimate: each replica's running share of prompt blocks cached, weighted by prompt blocks over about its last 256 selections (the one the default cost's decode-block weight can follow), the lowest replica's per model.",
				[]query{
					{"sum(rate(kvr_route_overlap_ratio_sum" + rate + ")) / sum(rate(kvr_route_overlap_ratio_count" + rate + "))", "predicted (router)"},
					{"min by (model) (kvr_scheduler_cached_share)", "scheduler estimate {{model}}"},
					{"sum(rate(vllm:prefix_cache_hits_total" + rate + ")) / sum(rate(vllm:prefix_cache_queries_total" + rate + "))", "engine-reported (vLLM)"},
				}},
			{"Predicted overlap per request", "percentunit", "Distribution of the per-request overlap ratio (overlap blocks / prompt blocks).",
				quantiles("kvr_route_overlap_ratio", "overlap")},
		}},
		{"Latency", []panel{
			{"Time to first token", "s", "Gateway: request arrival to the first token sent back (or the whole reply). Engine: vLLM's own TTFT.",
				append(quantiles("kvr_gateway_ttft_seconds", "gateway"),
					query{"histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket" + rate + ")))", "engine p99"})},
			{"Router queue wait and depth", "s", "Time a route waits in the scheduler queue; the queue depth (right axis in requests) per model.",
				append(quantiles("kvr_queue_wait_seconds", "queue wait"),
					query{"sum by (model) (kvr_queue_depth)", "depth {{model}}"})},
			{"Tokenize and inter-token latency", "s", "The gateway's tokenize (or render) call and the gap between streamed token events.",
				append(quantiles("kvr_gateway_tokenize_seconds", "tokenize"), quantiles("kvr_gateway_itl_seconds", "inter-token")...)},
		}},
		{"Workers: load and cache", []panel{
			{"Predicted active requests per worker", "short", "Requests the replicas have booked on each worker rank (own and synced bookings).",
				[]query{{"max by (worker, rank) (kvr_worker_predicted_active_requests)", "{{worker}}#{{rank}}"}}},
			{"Predicted prefill tokens per worker", "short", "Prefill tokens the replicas predict in flight on each worker rank.",
				[]query{{"max by (worker, rank) (kvr_worker_predicted_prefill_tokens)", "{{worker}}#{{rank}}"}}},
			{"Engine queues", "short", "vLLM's running and waiting requests, per engine.",
				[]query{{"sum by (instance) (vllm:num_requests_running)", "running {{instance}}"}, {"sum by (instance) (vllm:num_requests_waiting)", "waiting {{instance}}"}}},
			{"Engine KV cache usage", "percentunit", "vLLM's KV cache usage, per engine.",
				[]query{{"max by (instance) (vllm:kv_cache_usage_perc)", "{{instance}}"}}},
			{"Indexed blocks", "short", "Blocks in each replica's prefix index, per model.",
				[]query{{"max by (model) (kvr_index_blocks)", "{{model}}"}}},
			{"Workers by state", "short", "Workers in the registry per model and state, and those suspect (key vanished, within the departure grace).",
				[]query{{"max by (model, state) (kvr_workers)", "{{model}} {{state}}"}, {"max(kvr_workers_suspect)", "suspect"}}},
		}},
		{"Session bindings", []panel{
			{"Binding outcomes", "ops", "Session routes by binding outcome (created, fresh, renewed, rebound, kept_other, rejected, conflict).",
				[]query{{"sum by (outcome) (rate(kvr_binding_outcomes_total" + rate + "))", "{{outcome}}"}}},
			{"Staleness fallbacks and leader reads", "ops", "Binding reads sent to the stream leader: because the local cache could not show it was fresh (fallbacks), and all of them.",
				[]query{{"sum(rate(kvr_bindings_stale_fallbacks_total" + rate + "))", "staleness fallbacks"},
					{"sum(rate(kvr_bindings_leader_reads_total" + rate + "))", "leader reads"}}},
			{"Bindings cache fresh", "short", "1 when a replica's bindings cache may answer Soft reads; 0 sends every read to the leader.",
				[]query{{"min by (instance) (kvr_bindings_cache_fresh)", "{{instance}}"}}},
		}},
		{"KV events", []panel{
			{"Event lag", "short", "Stream messages a replica has not consumed yet.",
				[]query{{"max by (instance) (kvr_events_lag)", "{{instance}}"}}},
			{"Resyncs and gaps", "ops", "Replicas' index resyncs by kind (gap, new_epoch) and event-id gaps. A bridge's own gaps and resyncs (kvr_bridge_gaps_total, kvr_bridge_resyncs_total) have series only once one happened.",
				[]query{{"sum by (kind) (rate(kvr_events_resyncs_total" + rate + "))", "{{kind}}"},
					{"sum(rate(kvr_events_gaps_total" + rate + "))", "gaps"}}},
			{"Events applied and rejected", "ops", "Event batches applied to the index, and messages rejected by cause.",
				[]query{{"sum(rate(kvr_events_batches_total" + rate + "))", "applied"},
					{"sum by (cause) (rate(kvr_events_rejected_total" + rate + "))", "rejected {{cause}}"}}},
		}},
		{"NATS", []panel{
			{"Connections and readiness", "short", "Replicas connected to NATS and ready; bridges registered.",
				[]query{{"sum(kvr_nats_connected)", "replicas connected"}, {"sum(kvr_ready)", "replicas ready"}, {"sum(kvr_bridge_ready)", "bridges ready"}}},
			{"Reconnects", "short", "NATS reconnections per replica.",
				[]query{{"sum by (instance) (increase(kvr_nats_reconnects_total" + rate + "))", "{{instance}}"}}},
			{"Sync drops and publish backlog", "short", "Booking and decision sync changes dropped (a slow NATS), and the bridges' events not yet acknowledged by the stream.",
				[]query{{"sum(rate(kvr_booking_sync_dropped_total" + rate + "))", "booking sync dropped/s"},
					{"sum(rate(kvr_decision_sync_dropped_total" + rate + "))", "decision sync dropped/s"},
					{"sum(kvr_bridge_publish_buffer_events)", "bridge publish backlog"}}},
		}},
	}
}

// Dashboard builds the dashboard.
func Dashboard() (dashboard.Dashboard, error) {
	b := dashboard.NewDashboardBuilder("kvrouter").
		Uid(UID).
		Description("KV-cache-aware routing: routes, hit ratios, latency, worker load, session bindings, KV events and NATS. Generated by deploy/grafana; edit the Go code, not the JSON.").
		Tags([]string{"kvrouter", "llm"}).
		Refresh("30s").
		Time("now-1h", "now").
		Timezone(common.TimeZoneBrowser).
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Prometheus").Type("prometheus"))
	id := uint32(0) // Grafana wants every panel and row's id unique
	for _, r := range rows() {
		id++
		b = b.WithRow(dashboard.NewRowBuilder(r.title).Id(id))
		width := uint32(8)
		if len(r.panels)%3 != 0 {
			width = 12
		}
		for _, p := range r.panels {
			id++
			tb := timeseries.NewPanelBuilder().Id(id).Title(p.title).Description(p.desc).Unit(p.unit).
				Datasource(ds).Height(8).Span(width).Min(0).
				Legend(common.NewVizLegendOptionsBuilder().DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom).ShowLegend(true))
			for i, q := range p.queries {
				tb = tb.WithTarget(prometheus.NewDataqueryBuilder().RefId(string(rune('A' + i))).Expr(q.expr).LegendFormat(q.legend).Datasource(ds))
			}
			b = b.WithPanel(tb)
		}
	}
	return b.Build()
}

// JSON is the dashboard as committed in kvrouter.json: indented, with a
// final newline.
func JSON() ([]byte, error) {
	d, err := Dashboard()
	if err != nil {
		return nil, fmt.Errorf("grafana: build the dashboard: %w", err)
	}
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("grafana: encode the dashboard: %w", err)
	}
	return append(out, '\n'), nil
}

// Expressions lists every panel query's PromQL expression.
func Expressions() []string {
	var out []string
	for _, r := range rows() {
		for _, p := range r.panels {
			for _, q := range p.queries {
				out = append(out, q.expr)
			}
		}
	}
	return out
}

// metricName matches a metric name in a PromQL expression: a name followed
// by '{', '[' or ')' , never a function (followed by '(') or a label
// (inside by (...)).
var metricName = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(?:[\[{)])`)

// MetricNames is every metric name the queries read, sorted.
func MetricNames() []string {
	set := map[string]bool{}
	for _, e := range Expressions() {
		for _, m := range metricName.FindAllString(stripGrouping(e), -1) {
			set[m[:len(m)-1]] = true
		}
	}
	out := make([]string, 0, len(set))
	for m := range set {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// grouping is a "by (labels)" clause, whose labels are not metrics.
var grouping = regexp.MustCompile(`\b(?:by|without)\s*\([^)]*\)`)

func stripGrouping(expr string) string { return grouping.ReplaceAllString(expr, "") }
