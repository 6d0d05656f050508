package api

import (
	"encoding/binary"
	"slices"
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// Hand-written JSON for the route hot path: encoding/json reflects and
// allocates per element, which costs tens of microseconds on a 2,048-token
// prompt. The encoder below writes exactly what encoding/json would for the
// same struct (tested), the decoder in jsondec.go accepts what encoding/json
// produces.

const hexDigits = "0123456789abcdef"

// AppendJSONString appends s as a JSON string, escaping like encoding/json
// (HTML-safe escapes included, invalid UTF-8 replaced by U+FFFD), for the
// hand-written encoders of the route path and of replica booking sync.
func AppendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// AppendRouteResponse appends r as JSON to dst; the output equals
// json.Marshal(r).
func AppendRouteResponse(dst []byte, r *RouteResponse) []byte {
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, int64(r.V), 10)
	dst = append(dst, `,"request_id":`...)
	dst = AppendJSONString(dst, r.RequestID)
	dst = append(dst, `,"model":`...)
	dst = AppendJSONString(dst, r.Model)
	dst = append(dst, `,"worker":`...)
	dst = AppendJSONString(dst, r.Worker)
	dst = append(dst, `,"rank":`...)
	dst = strconv.AppendUint(dst, uint64(r.Rank), 10)
	dst = append(dst, `,"endpoint":`...)
	dst = AppendJSONString(dst, r.Endpoint)
	dst = append(dst, `,"overlap_blocks":`...)
	dst = strconv.AppendInt(dst, int64(r.OverlapBlocks), 10)
	dst = append(dst, `,"prompt_blocks":`...)
	dst = strconv.AppendInt(dst, int64(r.PromptBlocks), 10)
	dst = append(dst, `,"attempt":`...)
	dst = strconv.AppendUint(dst, r.Attempt, 10)
	dst = append(dst, `,"fence":`...)
	dst = AppendJSONString(dst, r.Fence)
	dst = append(dst, `,"replica":`...)
	dst = AppendJSONString(dst, r.Replica)
	dst = append(dst, `,"queue_wait_us":`...)
	dst = strconv.AppendInt(dst, r.QueueWaitUS, 10)
	if b := r.Binding; b != nil {
		dst = append(dst, `,"binding":{"session_id":`...)
		dst = AppendJSONString(dst, b.SessionID)
		dst = append(dst, `,"outcome":`...)
		dst = AppendJSONString(dst, b.Outcome)
		if b.Mode != "" {
			dst = append(dst, `,"mode":`...)
			dst = AppendJSONString(dst, b.Mode)
		}
		if b.Worker != "" {
			dst = append(dst, `,"worker":`...)
			dst = AppendJSONString(dst, b.Worker)
		}
		dst = append(dst, `,"rank":`...)
		dst = strconv.AppendUint(dst, uint64(b.Rank), 10)
		if b.HasRank {
			dst = append(dst, `,"has_rank":true`...)
		}
		if b.Version != 0 {
			dst = append(dst, `,"version":`...)
			dst = strconv.AppendUint(dst, b.Version, 10)
		}
		dst = append(dst, '}')
	}
	return append(appendPD(dst, r), '}')
}

// appendPD appends the prefill/decode fields of r, as json.Marshal would.
func appendPD(dst []byte, r *RouteResponse) []byte {
	if r.PD != "" {
		dst = append(dst, `,"pd":`...)
		dst = AppendJSONString(dst, r.PD)
	}
	if r.PDReason != "" {
		dst = append(dst, `,"pd_reason":`...)
		dst = AppendJSONString(dst, r.PDReason)
	}
	p := r.Prefill
	if p == nil {
		return dst
	}
	dst = append(dst, `,"prefill":{"request_id":`...)
	dst = AppendJSONString(dst, p.RequestID)
	dst = append(dst, `,"worker":`...)
	dst = AppendJSONString(dst, p.Worker)
	dst = append(dst, `,"rank":`...)
	dst = strconv.AppendUint(dst, uint64(p.Rank), 10)
	dst = append(dst, `,"endpoint":`...)
	dst = AppendJSONString(dst, p.Endpoint)
	dst = append(dst, `,"overlap_blocks":`...)
	dst = strconv.AppendInt(dst, int64(p.OverlapBlocks), 10)
	dst = append(dst, `,"attempt":`...)
	dst = strconv.AppendUint(dst, p.Attempt, 10)
	dst = append(dst, `,"fence":`...)
	dst = AppendJSONString(dst, p.Fence)
	if p.BootstrapPort != 0 {
		dst = append(dst, `,"bootstrap_port":`...)
		dst = strconv.AppendInt(dst, int64(p.BootstrapPort), 10)
	}
	return append(dst, '}')
}

// AppendRouteRequest appends r as JSON to dst, in the form the decoder reads
// fastest (token ids and hashes as plain numbers): what an HTTP client
// sends; json.Marshal(r) is equivalent. Client sends AppendRouteBody.
func AppendRouteRequest(dst []byte, r *RouteRequest) []byte {
	return appendRouteJSON(dst, r, true, true)
}

// AppendRouteBody appends r in the form Client sends over NATS: the JSON of
// AppendRouteRequest, except that r's token ids, or when it has none its
// block hashes, follow it in a binary trailer (docs/protocol.md "The binary
// trailers"): a TokenTrailerMark byte, then each id as a little-endian
// uint32, or a HashTrailerMark, then each hash as a little-endian uint64.
// Four bytes an id instead of about seven digits and a comma, eight a hash
// instead of about twenty-one, and no digits to write or parse: reading
// 2,048 ids as JSON was the replica's largest cost per route after the
// socket calls, 128 hashes about 6 % of a route's CPU over NATS
// (docs/benchmarks.md, issue 29).
func AppendRouteBody(dst []byte, r *RouteRequest) []byte {
	switch {
	case len(r.TokenIDs) > 0:
		return appendTrailer(appendRouteJSON(dst, r, false, true), TokenTrailerMark, r.TokenIDs)
	case len(r.BlockHashes) > 0:
		return appendTrailer(appendRouteJSON(dst, r, true, false), HashTrailerMark, r.BlockHashes)
	default:
		return appendRouteJSON(dst, r, true, true)
	}
}

// appendTrailer appends a binary trailer: mark, then each value in
// little-endian, readTrailer's input.
func appendTrailer[T uint32 | uint64](dst []byte, mark byte, vals []T) []byte {
	size := int(unsafe.Sizeof(T(0)))
	dst = slices.Grow(dst, 1+size*len(vals))
	dst = append(dst, mark)
	for _, v := range vals {
		if size == 4 {
			dst = binary.LittleEndian.AppendUint32(dst, uint32(v))
		} else {
			dst = binary.LittleEndian.AppendUint64(dst, uint64(v))
		}
	}
	return dst
}

// appendRouteJSON is AppendRouteRequest, with r's token ids left out
// unless withTokens and its block hashes unless withHashes. It reads best
// whole: one guarded append per optional field of RouteRequest, in the
// message's field order, on the route path with no allocation beyond dst's
// growth.
func appendRouteJSON(dst []byte, r *RouteRequest, withTokens, withHashes bool) []byte {
	dst = append(dst, '{')
	first := true
	key := func(k string) {
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, '"')
		dst = append(dst, k...)
		dst = append(dst, '"', ':')
	}
	if r.V != 0 {
		key("v")
		dst = strconv.AppendInt(dst, int64(r.V), 10)
	}
	if r.RequestID != "" {
		key("request_id")
		dst = AppendJSONString(dst, r.RequestID)
	}
	key("model")
	dst = AppendJSONString(dst, r.Model)
	if withTokens && len(r.TokenIDs) > 0 {
		key("token_ids")
		dst = appendUints(dst, r.TokenIDs)
	}
	if withHashes && len(r.BlockHashes) > 0 {
		key("block_hashes")
		dst = appendUints(dst, r.BlockHashes)
	}
	if len(r.Media) > 0 {
		key("media")
		dst = appendMedia(dst, r.Media)
	}
	ints := []struct {
		k string
		v int
	}{{"block_size", r.BlockSize}, {"input_tokens", r.InputTokens}}
	for _, kv := range ints {
		if kv.v != 0 {
			key(kv.k)
			dst = strconv.AppendInt(dst, int64(kv.v), 10)
		}
	}
	strs := []struct{ k, v string }{{"lora_name", r.LoraName}, {"cache_salt", r.CacheSalt}, {"session_id", r.SessionID}, {"session_mode", r.SessionMode}, {"routing_key", r.RoutingKey}}
	for _, kv := range strs {
		if kv.v != "" {
			key(kv.k)
			dst = AppendJSONString(dst, kv.v)
		}
	}
	if r.Pin != nil {
		key("pin")
		dst = r.Pin.appendJSON(dst)
	}
	if r.Prefer != nil {
		key("prefer")
		dst = r.Prefer.appendJSON(dst)
	}
	if len(r.AllowedWorkers) > 0 {
		key("allowed_workers")
		dst = append(dst, '[')
		for i, w := range r.AllowedWorkers {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendJSONString(dst, w)
		}
		dst = append(dst, ']')
	}
	ints = []struct {
		k string
		v int
	}{{"priority", r.Priority}, {"expected_output_tokens", r.ExpectedOutputTokens}, {"deadline_ms", r.DeadlineMS}}
	for _, kv := range ints {
		if kv.v != 0 {
			key(kv.k)
			dst = strconv.AppendInt(dst, int64(kv.v), 10)
		}
	}
	if r.PD {
		key("pd")
		dst = append(dst, "true"...)
	}
	return append(dst, '}')
}

// appendUints appends xs as a JSON array of plain numbers.
func appendUints[T uint32 | uint64](dst []byte, xs []T) []byte {
	dst = append(dst, '[')
	for i, x := range xs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(x), 10)
	}
	return append(dst, ']')
}

func (w *WorkerRef) appendJSON(dst []byte) []byte {
	dst = append(dst, `{"worker":`...)
	dst = AppendJSONString(dst, w.Worker)
	if w.HasRank {
		dst = append(dst, `,"rank":`...)
		dst = strconv.AppendUint(dst, uint64(w.Rank), 10)
	}
	return append(dst, '}')
}

// MarshalJSON writes {"worker": ..., "rank": ...}, leaving rank out when the
// reference names any rank.
func (w WorkerRef) MarshalJSON() ([]byte, error) { return w.appendJSON(nil), nil }

// UnmarshalJSON reads {"worker": ..., "rank": ...}; HasRank records whether
// rank was present.
func (w *WorkerRef) UnmarshalJSON(data []byte) error {
	d := decoder{buf: data}
	d.skipWS()
	var ref WorkerRef
	if e := d.workerRef("worker_ref", &ref); e != nil {
		return e
	}
	d.skipWS()
	if d.pos != len(d.buf) {
		return BadField("worker_ref", "trailing data at offset %d", d.pos)
	}
	*w = ref
	return nil
}

// AppendLifecycleResponse appends r as JSON: what json.Marshal writes
// (tested), without its reflection and allocations, for the
// acknowledgement of every prefill_done and free a caller waits for.
func AppendLifecycleResponse(dst []byte, r *LifecycleResponse) []byte {
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, int64(r.V), 10)
	dst = append(dst, `,"request_id":`...)
	dst = AppendJSONString(dst, r.RequestID)
	dst = append(dst, `,"op":`...)
	dst = AppendJSONString(dst, r.Op)
	dst = append(dst, `,"replica":`...)
	dst = AppendJSONString(dst, r.Replica)
	return append(dst, '}')
}
