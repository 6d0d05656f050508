package testutil

import (
	"net"
	"strconv"
	"testing"
)

// FreePorts returns the first of n consecutive TCP ports free on 127.0.0.1,
// for servers that derive one port from another (an engine's data-parallel
// ranks listen on port + rank). Another process may take one before the
// caller binds it; the window is short.
func FreePorts(t testing.TB, n int) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if base+n > 65535 {
			continue
		}
		ok := true
		var open []net.Listener
		for p := base; p < base+n && ok; p++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if ok = err == nil; ok {
				open = append(open, l)
			}
		}
		for _, l := range open {
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}
