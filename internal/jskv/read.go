package jskv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultAPIPrefix is the JetStream API prefix without a domain.
const DefaultAPIPrefix = "$JS.API"

// ErrNoMessage: nothing is stored under the subject (API code 10037). A
// key whose last message is a delete, purge or expiry marker is not this:
// LastMsg returns that message and Msg.Tombstone reports it.
var ErrNoMessage = errors.New("jskv: no message")

// Msg is the last message stored under a subject.
type Msg struct {
	Subject string
	Seq     uint64 // the key's revision
	Header  nats.Header
	Data    []byte
	Time    time.Time // when the server stored it
}

// Tombstone reports whether m is a KV delete or purge (KV-Operation) or a
// server marker left by an expired key (Nats-Marker-Reason).
func (m *Msg) Tombstone() bool {
	return m.Header.Get("KV-Operation") != "" || m.Header.Get(jetstream.MarkerReasonHeader) != ""
}

// MsgGetSubject is the API subject that asks the leader of the stream
// behind KV bucket for a message: <apiPrefix>.STREAM.MSG.GET.KV_<bucket>
// ("" = DefaultAPIPrefix; a domain's prefix is "$JS.<domain>.API").
func MsgGetSubject(apiPrefix, bucket string) string {
	return apiBase(apiPrefix) + ".STREAM.MSG.GET.KV_" + bucket
}

// apiBase is apiPrefix without a trailing dot ("" = DefaultAPIPrefix).
func apiBase(apiPrefix string) string {
	if apiPrefix == "" {
		return DefaultAPIPrefix
	}
	return strings.TrimSuffix(apiPrefix, ".")
}

type msgGetResponse struct {
	Error   *jetstream.APIError `json:"error,omitempty"`
	Message *struct {
		Subject string    `json:"subject"`
		Seq     uint64    `json:"seq"`
		Hdrs    []byte    `json:"hdrs,omitempty"`
		Data    []byte    `json:"data,omitempty"`
		Time    time.Time `json:"time"`
	} `json:"message,omitempty"`
}

// LastMsg reads the last message stored under subject from the stream
// leader: a request on getSubj (see MsgGetSubject) with last_by_subj. A
// direct get (kv.Get) may be answered by any replica from a lagging state;
// this one may not. Nothing stored is ErrNoMessage; another answer of the
// server is its *jetstream.APIError; a failed request is the connection's
// error, unchanged (ctx bounds the wait).
func LastMsg(ctx context.Context, nc *nats.Conn, getSubj, subject string) (Msg, error) {
	msg, err := nc.RequestWithContext(ctx, getSubj, lastBySubjRequest(subject))
	if err != nil {
		return Msg{}, err
	}
	return decodeMsgGet(msg.Data)
}

// lastBySubjRequest builds {"last_by_subj":"<subject>"} without
// reflection; a subject that would need JSON escaping goes through
// encoding/json.
func lastBySubjRequest(subject string) []byte {
	if strings.ContainsAny(subject, "\"\\") || strings.IndexFunc(subject, func(r rune) bool { return r < 0x20 || r >= 0x7f }) >= 0 {
		b, _ := json.Marshal(struct {
			LastBySubj string `json:"last_by_subj"`
		}{subject}) // cannot fail: one string field
		return b
	}
	req := make([]byte, 0, len(subject)+18)
	req = append(req, `{"last_by_subj":"`...)
	req = append(req, subject...)
	return append(req, `"}`...)
}

func decodeMsgGet(data []byte) (Msg, error) {
	var resp msgGetResponse
	if err := json.Unmarshal(data, &resp); err != nil {
		return Msg{}, fmt.Errorf("bad reply: %w", err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == CodeNoMessage {
			return Msg{}, fmt.Errorf("%w: %w", ErrNoMessage, resp.Error)
		}
		return Msg{}, resp.Error
	}
	if resp.Message == nil {
		return Msg{}, errors.New("empty reply")
	}
	r := resp.Message
	m := Msg{Subject: r.Subject, Seq: r.Seq, Data: r.Data, Time: r.Time}
	if len(r.Hdrs) > 0 {
		h, err := nats.DecodeHeadersMsg(r.Hdrs)
		if err != nil {
			return Msg{}, fmt.Errorf("bad headers: %w", err)
		}
		m.Header = h
	}
	return m, nil
}
