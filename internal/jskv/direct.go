package jskv

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DirectGetPrefix is the subject prefix of direct gets on the stream behind
// KV bucket: <apiPrefix>.DIRECT.GET.KV_<bucket>. (followed by the
// message subject: the last message stored under it).
func DirectGetPrefix(apiPrefix, bucket string) string {
	return apiBase(apiPrefix) + ".DIRECT.GET.KV_" + bucket + "."
}

// DirectLastMsg reads the last message stored under subject by a direct get
// (prefix from DirectGetPrefix). The server answers it in the connection's
// read loop, with the message and its metadata in headers: no API worker
// queue and no JSON, which is why it is about half the cost of LastMsg.
//
// Any server holding the stream (a replica, or a mirror with MirrorDirect)
// may answer, from its own state. So an answer counts only when it names
// stream (the one-replica stream asked, "KV_<bucket>") as its source: a
// mirror's answer is ErrNotOrigin. It is a read of the latest committed
// value only where one server holds the stream: a one-replica stream.
// Elsewhere use LastMsg and confirm it. ErrNoMessage (nothing stored) may
// also come from a mirror that lags; callers that must know ask LastMsg.
//
// Other errors as LastMsg's: the connection's error unchanged, any other
// answer as a *jetstream.APIError.
func DirectLastMsg(ctx context.Context, nc *nats.Conn, prefix, stream, subject string) (Msg, error) {
	msg, err := nc.RequestWithContext(ctx, prefix+subject, nil)
	if err != nil {
		return Msg{}, err
	}
	return decodeDirectGet(msg.Header, msg.Data, stream)
}

// ErrNotOrigin: a direct get was answered by a server whose copy of the
// stream is not the one asked (a mirror).
var ErrNotOrigin = errors.New("jskv: direct get answered by another stream")

// decodeDirectGet reads a direct get's reply: a status header for an error
// ("404" nothing stored), else Nats-Subject, Nats-Sequence and
// Nats-Time-Stamp beside the stored message's own headers.
func decodeDirectGet(h nats.Header, data []byte, stream string) (Msg, error) {
	if len(h) == 0 {
		return Msg{}, errors.New("bad direct get reply: no headers")
	}
	if st := h.Get("Status"); st != "" {
		desc := h.Get("Description")
		if st == "404" {
			return Msg{}, fmt.Errorf("%w: %s", ErrNoMessage, desc)
		}
		code, _ := strconv.Atoi(st)
		return Msg{}, &jetstream.APIError{Code: code, Description: "direct get: " + st + " " + desc}
	}
	if src := h.Get(jetstream.StreamHeader); src != stream {
		return Msg{}, fmt.Errorf("%w: %q, want %q", ErrNotOrigin, src, stream)
	}
	seq, err := strconv.ParseUint(h.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil || seq == 0 {
		return Msg{}, fmt.Errorf("bad direct get reply: sequence %q", h.Get(jetstream.SequenceHeader))
	}
	ts, err := time.Parse(time.RFC3339Nano, h.Get(jetstream.TimeStampHeaer))
	if err != nil {
		return Msg{}, fmt.Errorf("bad direct get reply: time stamp: %w", err)
	}
	subj := h.Get(jetstream.SubjectHeader)
	for _, k := range []string{jetstream.StreamHeader, jetstream.SequenceHeader, jetstream.TimeStampHeaer, jetstream.SubjectHeader} {
		delete(h, k)
	}
	return Msg{Subject: subj, Seq: seq, Header: h, Data: data, Time: ts}, nil
}
