package epp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// envoyRequest is one HTTP request as the proxy hands it to the picker:
// headers, the body in chunks split at random points, trailers or not,
// the candidate subset hint or not.
type envoyRequest struct {
	method, path string
	header       map[string]string
	body         []byte
	chunks       int // the body is sent in this many chunks (at least 1)
	trailers     bool
	subset       []string
	hinted       bool
	seed         uint64
	// resetAfter resets the stream (as Envoy does when the client goes
	// away): n > 0 after n response body chunks, -1 right after the
	// request body, before the picker's answer, -2 halfway through the
	// request body.
	resetAfter int
	// serveFrom is the index in the destination list of the endpoint the
	// request is sent to (a retry on a fallback when > 0).
	serveFrom int
	// fakeReply answers without calling the engine: three SSE chunks.
	fakeReply bool
	// down, when set, receives the reply as the proxy relays it (status,
	// headers with the picker's mutations, body chunk by chunk).
	down http.ResponseWriter
}

// envoyResult is what the proxy saw.
type envoyResult struct {
	imm       *extprocv3.ImmediateResponse
	dest      []string          // the destination list, pick first
	set       map[string]string // request header mutations
	served    string
	status    int
	respSet   map[string]string // response header mutations
	reply     []byte            // the response body as the picker streamed it back
	pick      time.Duration     // end of the request sent -> destination received
	bodyEchos int               // request body responses
}

// envoy plays the proxy for one request: it drives the ext_proc stream in
// the protocol's order, checks the picker's answers, sends the request to
// the chosen engine over HTTP (or fakes a reply), and reports the served
// endpoint and each response chunk back.
func (f *fleet) envoy(ctx context.Context, q envoyRequest) (envoyResult, error) {
	var res envoyResult
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := f.client.Process(ctx)
	if err != nil {
		return res, err
	}
	if err := sendRequest(st, q, cancel); err != nil || q.resetAfter < 0 {
		return res, err
	}
	t0 := time.Now()
	m, err := st.Recv()
	if err != nil {
		return res, fmt.Errorf("first answer: %w", err)
	}
	if imm := m.GetImmediateResponse(); imm != nil {
		res.imm, res.status = imm, int(imm.GetStatus().GetCode())
		err := expectEOF(st) // before the client has its answer and goes
		if q.down != nil {
			q.down.Header().Set("Content-Type", "application/json")
			q.down.WriteHeader(res.status)
			_, _ = q.down.Write(imm.GetBody())
		}
		return res, err
	}
	if err := readDestination(m, &res); err != nil {
		return res, err
	}
	res.pick = time.Since(t0)
	if err := readBodyEcho(st, q, &res); err != nil {
		return res, err
	}
	if q.serveFrom >= len(res.dest) {
		return res, fmt.Errorf("serveFrom %d: only %d destinations", q.serveFrom, len(res.dest))
	}
	res.served = res.dest[q.serveFrom]
	up, err := f.upstream(ctx, q, res)
	if err != nil {
		return res, err
	}
	defer up.Body.Close()
	res.status = up.StatusCode
	return res, relayResponse(st, q, up, &res, cancel)
}

// sendRequest sends the request side as Envoy does in FULL_DUPLEX_STREAMED
// mode: headers, then the body without waiting for answers, then trailers.
func sendRequest(st extprocv3.ExternalProcessor_ProcessClient, q envoyRequest, reset context.CancelFunc) error {
	hs := []*corev3.HeaderValue{{Key: ":method", RawValue: []byte(q.method)}, {Key: ":path", RawValue: []byte(q.path)},
		{Key: ":authority", RawValue: []byte("gw.example")}, {Key: "content-type", RawValue: []byte("application/json")}}
	for k, v := range q.header {
		hs = append(hs, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
	}
	first := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: len(q.body) == 0 && !q.trailers}}}
	if q.hinted {
		vals := make([]*structpb.Value, len(q.subset))
		for i, a := range q.subset {
			vals[i] = structpb.NewStringValue(a)
		}
		first.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: {Fields: map[string]*structpb.Value{
			SubsetKey: structpb.NewListValue(&structpb.ListValue{Values: vals})}}}}
	}
	if err := st.Send(first); err != nil {
		return err
	}
	chunks := splitBody(q.body, q.chunks, q.seed)
	for i, c := range chunks {
		if q.resetAfter == -2 && i == len(chunks)/2 {
			reset()
			return nil
		}
		last := i == len(chunks)-1
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
			Body: c, EndOfStream: last && !q.trailers}}}); err != nil {
			return err
		}
	}
	if q.trailers {
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{
			Trailers: &corev3.HeaderMap{}}}}); err != nil {
			return err
		}
	}
	if q.resetAfter == -1 {
		reset()
	}
	return nil
}

// splitBody cuts body into n chunks at random points (some may be empty,
// as Envoy can send).
func splitBody(body []byte, n int, seed uint64) [][]byte {
	if len(body) == 0 {
		return nil
	}
	n = max(n, 1)
	r := rand.New(rand.NewPCG(seed, 27))
	cuts := []int{0, len(body)}
	for range n - 1 {
		cuts = append(cuts, r.IntN(len(body)+1))
	}
	slices.Sort(cuts)
	out := make([][]byte, 0, n)
	for i := 1; i < len(cuts); i++ {
		out = append(out, body[cuts[i-1]:cuts[i]])
	}
	return out
}

// readDestination checks the request headers' answer: the destination
// header and the same value in envoy.lb dynamic metadata, route cache
// cleared.
func readDestination(m *extprocv3.ProcessingResponse, res *envoyResult) error {
	hr := m.GetRequestHeaders()
	if hr == nil {
		return fmt.Errorf("first answer is %T, want request headers", m.GetResponse())
	}
	if !hr.GetResponse().GetClearRouteCache() {
		return errors.New("route cache not cleared")
	}
	res.set = map[string]string{}
	for _, h := range hr.GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
			return fmt.Errorf("header %s appends (%v): a client value would stay", h.GetHeader().GetKey(), h.GetAppendAction())
		}
		res.set[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
	}
	dest := res.set[DestinationHeader]
	md := m.GetDynamicMetadata().GetFields()[DestinationNamespace].GetStructValue().GetFields()[DestinationHeader].GetStringValue()
	if dest == "" || md != dest {
		return fmt.Errorf("destination header %q, metadata %q: want both, equal", dest, md)
	}
	res.dest = strings.Split(dest, ",")
	return nil
}

// readBodyEcho reads the request body as the picker streams it back (and
// the trailers' answer), and checks it is the body sent.
func readBodyEcho(st extprocv3.ExternalProcessor_ProcessClient, q envoyRequest, res *envoyResult) error {
	var got []byte
	bodySent := len(q.body) > 0
	for bodySent {
		m, err := st.Recv()
		if err != nil {
			return fmt.Errorf("request body answer: %w", err)
		}
		sr := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			return fmt.Errorf("got %T, want a streamed request body", m.GetResponse())
		}
		res.bodyEchos++
		got = append(got, sr.GetBody()...)
		if sr.GetEndOfStream() == q.trailers && sr.GetEndOfStream() {
			return errors.New("end_of_stream on the body although trailers follow")
		}
		if sr.GetEndOfStream() || (q.trailers && len(got) == len(q.body)) {
			break
		}
	}
	if !bytes.Equal(got, q.body) {
		return fmt.Errorf("body streamed back differs: %d bytes, sent %d", len(got), len(q.body))
	}
	if q.trailers {
		m, err := st.Recv()
		if err != nil || m.GetRequestTrailers() == nil {
			return fmt.Errorf("want the trailers' answer, got %T (%v)", m.GetResponse(), err)
		}
	}
	return nil
}

// upstream sends the request to the served endpoint with the picker's
// header mutations, or fakes a reply.
func (f *fleet) upstream(ctx context.Context, q envoyRequest, res envoyResult) (*http.Response, error) {
	if q.fakeReply {
		body := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n"
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: io.NopCloser(strings.NewReader(body))}, nil
	}
	req, err := http.NewRequestWithContext(ctx, q.method, "http://"+res.served+q.path, bytes.NewReader(q.body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range res.set {
		if k != DestinationHeader && k != "content-length" {
			req.Header.Set(k, v)
		}
	}
	return f.http.Do(req)
}

// relayResponse reports the response to the picker as Envoy does: headers
// with the served endpoint in metadata, then each body chunk as it comes,
// reading back each answer, then the end of the body; with resetAfter it
// resets the stream midway instead.
func relayResponse(st extprocv3.ExternalProcessor_ProcessClient, q envoyRequest, up *http.Response, res *envoyResult, reset context.CancelFunc) error {
	served := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{DestinationNamespace: {Fields: map[string]*structpb.Value{
		ServedKey: structpb.NewStringValue(res.served)}}}}
	if err := st.Send(&extprocv3.ProcessingRequest{MetadataContext: served, Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(strconv.Itoa(up.StatusCode))},
			{Key: "content-type", RawValue: []byte(up.Header.Get("Content-Type"))}}}}}}); err != nil {
		return err
	}
	m, err := st.Recv()
	if err != nil || m.GetResponseHeaders() == nil {
		return fmt.Errorf("want the response headers' answer, got %T (%v)", m.GetResponse(), err)
	}
	res.respSet = map[string]string{}
	for _, h := range m.GetResponseHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		res.respSet[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
	}
	if q.down != nil {
		q.down.Header().Set("Content-Type", up.Header.Get("Content-Type"))
		for k, v := range res.respSet {
			q.down.Header().Set(k, v)
		}
		q.down.WriteHeader(up.StatusCode)
	}
	buf := make([]byte, 512)
	for n := 1; ; n++ {
		k, rerr := up.Body.Read(buf)
		eos := errors.Is(rerr, io.EOF)
		if rerr != nil && !eos {
			return fmt.Errorf("upstream body: %w", rerr)
		}
		if k == 0 && !eos {
			continue
		}
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: buf[:k], EndOfStream: eos}}}); err != nil {
			return err
		}
		if err := readResponseEcho(st, q, res, eos); err != nil {
			return err
		}
		if eos {
			return expectEOF(st)
		}
		if q.resetAfter > 0 && n == q.resetAfter {
			reset()
			return nil
		}
	}
}

// readResponseEcho reads the picker's answer to one response body chunk
// (chunks under 62,000 bytes come back whole) and relays it downstream.
func readResponseEcho(st extprocv3.ExternalProcessor_ProcessClient, q envoyRequest, res *envoyResult, eos bool) error {
	m, err := st.Recv()
	if err != nil {
		return fmt.Errorf("response body answer: %w", err)
	}
	sr := m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if sr == nil {
		return fmt.Errorf("got %T, want a streamed response body", m.GetResponse())
	}
	res.reply = append(res.reply, sr.GetBody()...)
	if q.down != nil {
		_, _ = q.down.Write(sr.GetBody())
		_ = http.NewResponseController(q.down).Flush()
	}
	if sr.GetEndOfStream() != eos {
		return fmt.Errorf("response end_of_stream %v, sent %v", sr.GetEndOfStream(), eos)
	}
	return nil
}

// expectEOF half-closes the stream and expects the picker to end it.
func expectEOF(st extprocv3.ExternalProcessor_ProcessClient) error {
	_ = st.CloseSend()
	if m, err := st.Recv(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("want the end of the stream, got %T (%v)", m.GetResponse(), err)
	}
	return nil
}
