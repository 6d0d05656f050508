package epp

import (
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvrouter/kvrouter/gateway"
)

// The endpoint picker protocol's names (Gateway API Inference Extension
// proposal 004; ../shared/reference/protocols-engines-gateways.md, section
// 6).
const (
	// DestinationHeader carries the pick to the proxy: "ip:port", or an
	// ordered fallback list "ip:port,ip:port".
	DestinationHeader = "x-gateway-destination-endpoint"
	// DestinationNamespace is the dynamic metadata namespace of the same
	// value (key DestinationHeader), and the metadata namespace in which
	// the proxy reports the endpoint that served (key ServedKey).
	DestinationNamespace = "envoy.lb"
	// ServedKey is the endpoint that served the request, on the response
	// path.
	ServedKey = "x-gateway-destination-endpoint-served"
	// SubsetNamespace and SubsetKey hold the proxy's candidate subset: a
	// list of "ip:port" the pick must come from.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
)

// bodyChunk bounds one streamed body response: Envoy recommends at most
// 64 KiB per chunk; 62,000 bytes keeps a margin for the message around it.
const bodyChunk = 62000

// readHeaders turns Envoy's header map into the request's path, method and
// the other headers (pseudo-headers left out). Envoy sends raw_value;
// value is read too, for proxies that still fill it.
func readHeaders(hm *corev3.HeaderMap) (path, method string, h http.Header) {
	h = http.Header{}
	for _, hv := range hm.GetHeaders() {
		v := hv.GetValue()
		if len(hv.GetRawValue()) > 0 {
			v = string(hv.GetRawValue())
		}
		switch k := hv.GetKey(); {
		case k == ":path":
			path = v
		case k == ":method":
			method = v
		case strings.HasPrefix(k, ":"):
		default:
			h.Add(k, v)
		}
	}
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	return path, method, h
}

// subsetHint reads the proxy's candidate subset from the request's
// metadata: ok is false without the key (pick from the whole pool); an
// empty list is ok with no entry (nothing is eligible).
func subsetHint(md *corev3.Metadata) (addrs []string, ok bool) {
	ns := md.GetFilterMetadata()[SubsetNamespace]
	v, found := ns.GetFields()[SubsetKey]
	if !found {
		return nil, false
	}
	for _, e := range v.GetListValue().GetValues() {
		if s := e.GetStringValue(); s != "" {
			addrs = append(addrs, s)
		}
	}
	return addrs, true
}

// servedEndpoint reads the endpoint the proxy reports as having served
// ("" when absent).
func servedEndpoint(md *corev3.Metadata) string {
	return md.GetFilterMetadata()[DestinationNamespace].GetFields()[ServedKey].GetStringValue()
}

// hostPort is the "ip:port" of a worker's registered endpoint
// ("http://10.0.0.5:8000/v1" gives "10.0.0.5:8000"; the scheme's port when
// none is given): the address the proxy dials, and the form of the
// proxy's subset hint.
func hostPort(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return endpoint // already host:port, or unusable: compared as is
	}
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// setHeader is a header mutation that replaces any value the client sent.
func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
}

// destinationResponse is the request headers' answer: the destination
// header (and the rank, the body length, what the caller adds), the same
// destination in dynamic metadata, and route-cache clearing so that the
// proxy routes on the new header.
func destinationResponse(dest string, set ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	md := &structpb.Struct{Fields: map[string]*structpb.Value{
		DestinationNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			DestinationHeader: structpb.NewStringValue(dest),
		}}),
	}}
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{
				ClearRouteCache: true,
				HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: append([]*corev3.HeaderValueOption{setHeader(DestinationHeader, dest)}, set...)},
			},
		}},
		DynamicMetadata: md,
	}
}

// bodyResponses streams body back in chunks of at most bodyChunk bytes
// (FULL_DUPLEX_STREAMED: the proxy forwards what the processor streams
// back), the last one with eos; an empty body is one empty chunk. request
// chooses the request or the response direction.
func bodyResponses(body []byte, eos, request bool) []*extprocv3.ProcessingResponse {
	var out []*extprocv3.ProcessingResponse
	for first := true; first || len(body) > 0; first = false {
		n := min(len(body), bodyChunk)
		chunk := body[:n:n]
		body = body[n:]
		br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
			Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
				Body: chunk, EndOfStream: eos && len(body) == 0}},
		}}}
		if request {
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}})
		} else {
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}})
		}
	}
	return out
}

// immediate is the proxy's local reply for a request the picker refuses:
// the gateway's status and OpenAI-shaped error body, with Retry-After where
// the gateway sends it.
func immediate(e *gateway.RequestError) *extprocv3.ProcessingResponse {
	set := []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}
	if ra := e.RetryAfter(); ra > 0 {
		set = append(set, setHeader("retry-after", strconv.Itoa(ra)))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(e.Status)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: set},
			Body:    e.JSON(),
			Details: "kvrouter_epp_" + e.Code,
		},
	}}
}
