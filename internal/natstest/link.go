package natstest

import (
	"net"
	"sync"
)

// Link is a TCP proxy a test can cut and heal, each direction on its own:
// the partition nemesis of the fault tests. A cut direction stalls: the
// proxy stops copying that way and holds what it has read, as a network
// that drops every packet would, until Heal (TCP's flow control then
// stalls the sender; no connection is closed, so neither end learns of
// the cut except by its own timeouts). Every connection the link accepts
// is dialled to target() at that moment, so a node restarted on a new
// port is still reached.
type Link struct {
	ln     net.Listener
	target func() string

	mu    sync.Mutex
	cond  *sync.Cond
	cut   [2]bool // [Forward], [Backward]
	conns map[net.Conn]struct{}
	done  bool
	wg    sync.WaitGroup
}

// Direction is one way through a Link: Forward carries what the dialling
// side sends, Backward what the target sends back.
type Direction int

const (
	Forward Direction = iota
	Backward
)

// NewLink listens on a free loopback port and forwards every connection to
// target(). Close it when done (the Cluster closes its own).
func NewLink(target func() string) (*Link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &Link{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	l.cond = sync.NewCond(&l.mu)
	l.wg.Add(1)
	go l.accept()
	return l, nil
}

// Addr is the host:port to dial instead of the target.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// Cut stalls the given directions (both when none is given).
func (l *Link) Cut(dirs ...Direction) {
	if len(dirs) == 0 {
		dirs = []Direction{Forward, Backward}
	}
	l.mu.Lock()
	for _, d := range dirs {
		l.cut[d] = true
	}
	l.mu.Unlock()
}

// Heal lets both directions flow again, held bytes first.
func (l *Link) Heal() {
	l.mu.Lock()
	l.cut = [2]bool{}
	l.cond.Broadcast()
	l.mu.Unlock()
}

// IsCut reports whether d is cut.
func (l *Link) IsCut(d Direction) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cut[d]
}

// Close stops accepting, closes every connection and waits for the
// copying goroutines.
func (l *Link) Close() {
	l.mu.Lock()
	if l.done {
		l.mu.Unlock()
		return
	}
	l.done = true
	for c := range l.conns {
		_ = c.Close()
	}
	l.cond.Broadcast()
	l.mu.Unlock()
	_ = l.ln.Close()
	l.wg.Wait()
}

func (l *Link) accept() {
	defer l.wg.Done()
	for {
		in, err := l.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", l.target())
		if err != nil {
			_ = in.Close() // the target is down: as a refused connection
			continue
		}
		if !l.track(in, out) {
			return
		}
		l.wg.Add(2)
		go l.pipe(in, out, Forward)
		go l.pipe(out, in, Backward)
	}
}

// track registers a connection pair; false once the link is closed.
func (l *Link) track(a, b net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		_ = a.Close()
		_ = b.Close()
		return false
	}
	l.conns[a], l.conns[b] = struct{}{}, struct{}{}
	return true
}

// pipe copies src to dst, waiting before each write while d is cut. When
// either side ends, both are closed.
func (l *Link) pipe(src, dst net.Conn, d Direction) {
	defer l.wg.Done()
	defer func() {
		_ = src.Close()
		_ = dst.Close()
		l.mu.Lock()
		delete(l.conns, src)
		delete(l.conns, dst)
		l.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !l.wait(d) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed connection alike
		}
	}
}

// wait blocks while d is cut; false once the link is closed.
func (l *Link) wait(d Direction) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.cut[d] && !l.done {
		l.cond.Wait()
	}
	return !l.done
}
