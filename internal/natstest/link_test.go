package natstest

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// A cut direction holds what it carries until Heal; the other direction
// still flows; a healed link delivers the held bytes in order.
func TestLinkCutAndHeal(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		c, err := echo.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if _, err := c.Write([]byte(line)); err != nil {
				return
			}
		}
	}()
	l, err := NewLink(func() string { return echo.Addr().String() })
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip := func(msg string, wantAnswer bool) {
		t.Helper()
		if _, err := c.Write([]byte(msg + "\n")); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		got, err := r.ReadString('\n')
		if wantAnswer && (err != nil || got != msg+"\n") {
			t.Fatalf("round trip of %q: %q, %v", msg, got, err)
		}
		if !wantAnswer && err == nil {
			t.Fatalf("round trip of %q through a cut link answered %q", msg, got)
		}
	}
	roundTrip("one", true)
	l.Cut(Backward) // the echo arrives but cannot come back
	roundTrip("two", false)
	l.Heal()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "two\n" {
		t.Fatalf("held echo after the heal: %q, %v", got, err)
	}
	l.Cut(Forward)
	roundTrip("three", false)
	l.Heal()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "three\n" {
		t.Fatalf("held message after the heal: %q, %v", got, err)
	}
}
