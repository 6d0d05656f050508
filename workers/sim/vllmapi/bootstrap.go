package vllmapi

// SGLang's disaggregation mode, simulated: the router sends the same request
// to a prefill and a decode server at once with bootstrap_host,
// bootstrap_port and bootstrap_room; the decode server finds the prefill
// server's blocks through its bootstrap server. The simulator's bootstrap
// server is GET /kvr/bootstrap/{room} on its own HTTP port (register that
// port: the bridge's --disaggregation-bootstrap-port); it answers once the
// prefill of that room has finished.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Disaggregation modes (Config.Disaggregation, SGLang's
// --disaggregation-mode).
const (
	DisaggPrefill = "prefill"
	DisaggDecode  = "decode"
)

// BootstrapTimeout is how long either side waits for the other
// (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT's role; SGLang's default is
// 300 s, shorter here so a lost leg fails a test quickly).
const BootstrapTimeout = 30 * time.Second

// room is one bootstrap room: the prefill's held blocks once it finished.
type room struct {
	done   chan struct{}
	blocks int
	err    string
}

// rooms is the prefill server's table of rooms, each dropped when the
// decode side has read it or after twice BootstrapTimeout.
type rooms struct {
	mu sync.Mutex
	m  map[uint64]*room
}

func (rs *rooms) get(id uint64) *room {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.m == nil {
		rs.m = map[uint64]*room{}
	}
	r, ok := rs.m[id]
	if !ok {
		r = &room{done: make(chan struct{})}
		rs.m[id] = r
		time.AfterFunc(2*BootstrapTimeout, func() { rs.drop(id, r) })
	}
	return r
}

func (rs *rooms) drop(id uint64, r *room) {
	rs.mu.Lock()
	if rs.m[id] == r {
		delete(rs.m, id)
	}
	rs.mu.Unlock()
}

// bootstrapReply is GET /kvr/bootstrap/{room}'s answer.
type bootstrapReply struct {
	Blocks int    `json:"blocks"`
	Error  string `json:"error,omitempty"`
}

// bootstrap serves a decode server's wait for a room.
func (s *Server) bootstrap(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseUint(r.PathValue("room"), 10, 64)
	if err != nil {
		writeError(w, badRequest("bootstrap room %q: %v", r.PathValue("room"), err))
		return
	}
	rm := s.rooms.get(id)
	ctx, cancel := context.WithTimeout(r.Context(), BootstrapTimeout)
	defer cancel()
	select {
	case <-rm.done:
		s.rooms.drop(id, rm)
		writeJSON(w, http.StatusOK, bootstrapReply{Blocks: rm.blocks, Error: rm.err})
	case <-ctx.Done():
		writeError(w, unavailable("bootstrap room %d: the prefill did not finish: %v", id, ctx.Err()))
	}
}

// prepareBootstrap reads an SGLang leg's bootstrap fields: a prefill leg
// computes the prompt and one token and then fills its room
// (finishBootstrap); a decode leg waits for the room and pulls its blocks.
func (s *Server) prepareBootstrap(ctx context.Context, j *job, d *disaggFields) *Error {
	if d.BootstrapRoom == nil || d.BootstrapHost == nil || d.BootstrapPort == nil {
		return badRequest("a %s server in disaggregation mode needs bootstrap_host, bootstrap_port and bootstrap_room", s.cfg.Disaggregation)
	}
	if s.cfg.Disaggregation == DisaggPrefill {
		j.room, j.maxTokens = s.rooms.get(*d.BootstrapRoom), 1
		return nil
	}
	blocks, err := s.waitRoom(ctx, *d.BootstrapHost, *d.BootstrapPort, *d.BootstrapRoom)
	if err != nil {
		return unavailable("bootstrap room %d at %s:%d: %v", *d.BootstrapRoom, *d.BootstrapHost, *d.BootstrapPort, err)
	}
	return s.pullBlocks(ctx, j, blocks)
}

// waitRoom asks the prefill server's bootstrap for a room's blocks.
func (s *Server) waitRoom(ctx context.Context, host string, port int, id uint64) (int, error) {
	url := fmt.Sprintf("http://%s/kvr/bootstrap/%d", hostPort(host, port), id)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var br bootstrapReply
	if err := json.NewDecoder(resp.Body).Decode(&br); err != nil {
		return 0, fmt.Errorf("status %d: %w", resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK || br.Error != "" {
		return 0, fmt.Errorf("status %d: %s", resp.StatusCode, br.Error)
	}
	return br.Blocks, nil
}

// hostPort joins a host (an IPv6 one in brackets) and a port.
func hostPort(host string, port int) string {
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// finishBootstrap fills a prefill leg's room: the blocks it holds, or why
// it failed.
func (s *Server) finishBootstrap(j job, failed error) {
	if j.room == nil {
		return
	}
	select {
	case <-j.room.done:
		return
	default:
	}
	if failed != nil {
		j.room.err = failed.Error()
	} else if ids, err := s.eng.HeldPrefix(j.simRequest()); err != nil {
		j.room.err = err.Error()
	} else {
		j.room.blocks = len(ids)
	}
	close(j.room.done)
}
