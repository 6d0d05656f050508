package api

import "math"

// Hand-written decoders for the two small messages every routed request
// carries besides its route request: the route answer (read by every
// client: the gateway, the replay, Client) and the lifecycle call body
// (read by the replica on every free). encoding/json spent about 15 µs
// and 5 µs of CPU per route on them (BenchmarkRouteNATS profile,
// docs/benchmarks/scheduler.md); these share the route request's decoder
// and its rules: keys match exactly, null means absent, unknown keys of any
// shape are skipped.

// maxReplyString bounds a string of a route answer: the answer is written
// by a replica, whose own limits are far below it.
const maxReplyString = 64 << 10

func (d *decoder) routeResponse(r *RouteResponse) *Error {
	if d.peek() != '{' {
		return d.unexpected("body", "a JSON object")
	}
	e := d.object("body", func(key []byte) *Error {
		if d.isNull() {
			switch string(key) {
			case "binding":
				r.Binding = nil
			case "prefill":
				r.Prefill = nil
			}
			return nil
		}
		var e *Error
		switch string(key) {
		case "v":
			r.V, e = d.int("v", 1<<20)
		case "request_id":
			r.RequestID, e = d.str("request_id", maxReplyString)
		case "model":
			r.Model, e = d.str("model", maxReplyString)
		case "worker":
			r.Worker, e = d.str("worker", maxReplyString)
		case "rank":
			r.Rank, e = d.uint32("rank")
		case "endpoint":
			r.Endpoint, e = d.str("endpoint", maxReplyString)
		case "overlap_blocks":
			r.OverlapBlocks, e = d.int("overlap_blocks", MaxTokens)
		case "prompt_blocks":
			r.PromptBlocks, e = d.int("prompt_blocks", MaxTokens)
		case "attempt":
			r.Attempt, e = d.uint("attempt", math.MaxUint64, false)
		case "fence":
			r.Fence, e = d.str("fence", maxReplyString)
		case "replica":
			r.Replica, e = d.str("replica", maxReplyString)
		case "queue_wait_us":
			var v int
			v, e = d.int("queue_wait_us", math.MaxInt64)
			r.QueueWaitUS = int64(v)
		case "binding":
			if r.Binding == nil {
				r.Binding = new(BindingInfo)
			}
			e = d.bindingInfo(r.Binding)
		case "pd":
			r.PD, e = d.str("pd", maxReplyString)
		case "pd_reason":
			r.PDReason, e = d.str("pd_reason", maxReplyString)
		case "prefill":
			if r.Prefill == nil {
				r.Prefill = new(PrefillRoute)
			}
			e = d.prefillRoute(r.Prefill)
		default:
			e = d.skipValue(string(key))
		}
		return e
	})
	if e != nil {
		return e
	}
	return d.end("body")
}

func (d *decoder) bindingInfo(b *BindingInfo) *Error {
	return d.object("binding", func(key []byte) *Error {
		if d.isNull() {
			return nil
		}
		var e *Error
		switch string(key) {
		case "session_id":
			b.SessionID, e = d.str("binding.session_id", maxReplyString)
		case "outcome":
			b.Outcome, e = d.str("binding.outcome", maxReplyString)
		case "mode":
			b.Mode, e = d.str("binding.mode", maxReplyString)
		case "worker":
			b.Worker, e = d.str("binding.worker", maxReplyString)
		case "rank":
			b.Rank, e = d.uint32("binding.rank")
		case "has_rank":
			b.HasRank, e = d.boolean("binding.has_rank")
		case "version":
			b.Version, e = d.uint("binding.version", math.MaxUint64, false)
		default:
			e = d.skipValue("binding." + string(key))
		}
		return e
	})
}

func (d *decoder) prefillRoute(p *PrefillRoute) *Error {
	return d.object("prefill", func(key []byte) *Error {
		if d.isNull() {
			return nil
		}
		var e *Error
		switch string(key) {
		case "request_id":
			p.RequestID, e = d.str("prefill.request_id", maxReplyString)
		case "worker":
			p.Worker, e = d.str("prefill.worker", maxReplyString)
		case "rank":
			p.Rank, e = d.uint32("prefill.rank")
		case "endpoint":
			p.Endpoint, e = d.str("prefill.endpoint", maxReplyString)
		case "overlap_blocks":
			p.OverlapBlocks, e = d.int("prefill.overlap_blocks", MaxTokens)
		case "attempt":
			p.Attempt, e = d.uint("prefill.attempt", math.MaxUint64, false)
		case "fence":
			p.Fence, e = d.str("prefill.fence", maxReplyString)
		case "bootstrap_port":
			p.BootstrapPort, e = d.int("prefill.bootstrap_port", 1<<31-1)
		default:
			e = d.skipValue("prefill." + string(key))
		}
		return e
	})
}

func (d *decoder) lifecycleRequest(lr *LifecycleRequest) *Error {
	if d.peek() != '{' {
		return d.unexpected("body", "a JSON object")
	}
	e := d.object("body", func(key []byte) *Error {
		if d.isNull() {
			return nil
		}
		var e *Error
		switch string(key) {
		case "v":
			lr.V, e = d.int("v", 1<<20)
		case "request_id":
			lr.RequestID, e = d.str("request_id", MaxLifecycleBodySize)
		case "model":
			lr.Model, e = d.str("model", MaxLifecycleBodySize)
		case "attempt":
			lr.Attempt, e = d.uint("attempt", math.MaxUint64, false)
		case "fence":
			lr.Fence, e = d.str("fence", MaxLifecycleBodySize)
		case "replica":
			lr.Replica, e = d.str("replica", MaxLifecycleBodySize)
		default:
			e = d.skipValue(string(key))
		}
		return e
	})
	if e != nil {
		return e
	}
	return d.end("body")
}

// uint32 reads an integer in [0, 2^32).
func (d *decoder) uint32(field string) (uint32, *Error) {
	v, e := d.uint(field, 1<<32-1, false)
	return uint32(v), e
}
