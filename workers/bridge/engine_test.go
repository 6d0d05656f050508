package bridge

import (
	"strings"
	"testing"
	"time"
)

func TestParseMetrics(t *testing.T) {
	const vllmPage = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3
vllm:num_requests_running{engine="1",model_name="m"} 1
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} NaN
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",engine="0",model_name="m",num_gpu_blocks="1000"} 1
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1"} 4
vllm:time_to_first_token_seconds_sum 0.3
vllm:time_to_first_token_seconds_count 4
`
	const sglangPage = `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",model_name="m"} 5
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",model_name="m"} 7
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",model_name="m"} 0.5
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{dp_rank="0",model_name="m"} 16384
`
	at := time.Unix(1700000000, 0)
	for _, tc := range []struct {
		name, format, page string
		wantErr            string
		check              func(t *testing.T, s scrape)
	}{
		{name: "vllm", format: FormatVLLM, page: vllmPage, check: func(t *testing.T, s scrape) {
			if s.blockSize != 32 || s.kvBlocks != 1000 {
				t.Fatalf("cache config %d/%d", s.blockSize, s.kvBlocks)
			}
			r := s.loadReports("m", "w", 2, 1000)
			if r[0].ActiveRequests != 3 || r[0].WaitingRequests != 2 || r[0].KVUsedBlocks != 250 || r[1].ActiveRequests != 1 ||
				r[1].KVUsedBlocks != 0 || !r[0].At.Equal(at) || r[1].Rank != 1 {
				t.Fatalf("reports %+v", r)
			}
		}},
		{name: "sglang", format: FormatSGLang, page: sglangPage, check: func(t *testing.T, s scrape) {
			r := s.loadReports("m", "w", 1, s.capTokens/16)
			if s.capTokens != 16384 || r[0].ActiveRequests != 5 || r[0].WaitingRequests != 7 || r[0].KVUsedBlocks != 512 {
				t.Fatalf("capacity %d, reports %+v", s.capTokens, r)
			}
		}},
		{name: "wrong format", format: FormatSGLang, page: vllmPage, wantErr: "none of sglang:num_running_reqs"},
		{name: "not prometheus", format: FormatVLLM, page: "vllm:num_requests_running{engine=\"0\" 3\n", wantErr: "engine metrics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := parseMetrics(strings.NewReader(tc.page), formats[tc.format], at)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, s)
		})
	}
}
