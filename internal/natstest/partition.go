package natstest

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// Partitionable makes every route connection between the cluster's nodes,
// and every client connection made through ClientURL, pass through a Link,
// so that a test can partition the network (CutRoute, Isolate, CutClient)
// and heal it (Heal) while every node keeps running. Gossip of the nodes'
// direct route ports is off (NoAdvertise), so no route bypasses a link.
func Partitionable() ClusterOption { return func(c *Cluster) { c.partitionable = true } }

// makeLinks makes links[i][j] to node j's route port for every i != j.
func (c *Cluster) makeLinks(cports []int) error {
	if !c.partitionable {
		return nil
	}
	c.closeLinks()
	c.links = make([][]*Link, len(cports))
	for i := range cports {
		c.links[i] = make([]*Link, len(cports))
		for j, p := range cports {
			if i == j {
				continue
			}
			addr := fmt.Sprintf("127.0.0.1:%d", p)
			l, err := NewLink(func() string { return addr })
			if err != nil {
				return fmt.Errorf("natstest: route link n%d->n%d: %w", i, j, err)
			}
			c.links[i][j] = l
		}
	}
	return nil
}

// routesVia lists node i's routes to every other node through its links.
func (c *Cluster) routesVia(i int) []string {
	var routes []string
	for j, l := range c.links[i] {
		if j != i {
			routes = append(routes, "nats-route://"+l.Addr())
		}
	}
	return routes
}

func (c *Cluster) closeLinks() {
	for _, row := range c.links {
		for _, l := range row {
			if l != nil {
				l.Close()
			}
		}
	}
	c.addrMu.Lock()
	clients := c.clients
	c.clients = nil
	c.addrMu.Unlock()
	for _, l := range clients {
		l.Close()
	}
	c.links = nil
}

// CutRoute stalls everything node from sends to node to, on both route
// links between them (either may carry their traffic). The other way still
// flows: a one-way partition.
func (c *Cluster) CutRoute(from, to int) {
	c.mustPartitionable()
	c.links[from][to].Cut(Forward)
	c.links[to][from].Cut(Backward)
}

// Isolate cuts node i from every other node, both ways. Its clients stay
// connected to it.
func (c *Cluster) Isolate(i int) {
	for j := range c.Servers {
		if j != i {
			c.CutRoute(i, j)
			c.CutRoute(j, i)
		}
	}
}

// Heal heals every route and client link.
func (c *Cluster) Heal() {
	c.mustPartitionable()
	for _, row := range c.links {
		for _, l := range row {
			if l != nil {
				l.Heal()
			}
		}
	}
	c.addrMu.Lock()
	clients := append([]*Link(nil), c.clients...)
	c.addrMu.Unlock()
	for _, l := range clients {
		l.Heal()
	}
}

// ClientLink returns a new link to node i's client port (its current one:
// a node restarts on a new port), for a client the test may cut off with
// the link's Cut. Its URL is "nats://" + Addr().
func (c *Cluster) ClientLink(i int) *Link {
	c.t.Helper()
	c.mustPartitionable()
	l, err := NewLink(func() string {
		c.addrMu.Lock()
		defer c.addrMu.Unlock()
		return c.clientAddrs[i]
	})
	if err != nil {
		c.t.Fatalf("natstest: client link to n%d: %v", i, err)
	}
	c.addrMu.Lock()
	c.clients = append(c.clients, l)
	c.addrMu.Unlock()
	return l
}

func (c *Cluster) mustPartitionable() {
	if !c.partitionable {
		c.t.Fatalf("natstest: the cluster was not started Partitionable")
	}
}

// setClientAddr notes node i's client address (read by client links'
// goroutines, hence not c.Servers).
func (c *Cluster) setClientAddr(i int, s *server.Server) {
	c.addrMu.Lock()
	defer c.addrMu.Unlock()
	for len(c.clientAddrs) <= i {
		c.clientAddrs = append(c.clientAddrs, "")
	}
	c.clientAddrs[i] = strings.TrimPrefix(s.ClientURL(), "nats://")
}
