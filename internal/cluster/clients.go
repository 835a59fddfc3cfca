package cluster

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Clients get addresses of their own in the hub, so that one client's link
// can be cut while the others, the harness's probes and the nodes' links
// to each other stay up: client k (1 to 100) dials from 10.201.0.(100+k).
// A cut is a blackhole route to that address in every node's namespace,
// as a partition is: the client's packets still arrive and nothing comes
// back, so it sees silence, as behind a dead switch, not a reset.

// ClientIP is the hub address of client k (1 to 100) of the three-node
// cluster.
func ClientIP(k int) (string, error) { return three.clientIP(k) }

func (l *layout) clientIP(k int) (string, error) {
	if k < 1 || k > 100 {
		return "", fmt.Errorf("cluster: client %d: want 1 to 100", k)
	}
	return l.subnet + strconv.Itoa(100+k), nil
}

// isClientIP reports whether dst (an address, or an address/32) is a
// client's: Heal leaves the cuts of client links to [Cluster.RestoreClient].
func (l *layout) isClientIP(dst string) bool {
	host, ok := strings.CutPrefix(strings.TrimSuffix(dst, "/32"), l.subnet)
	k, err := strconv.Atoi(host)
	return ok && err == nil && k > 100 && k <= 200
}

// AddClient gives client k its address in the hub (idempotent), and
// returns it. Dial from it with [Cluster.DialFrom].
func (c *Cluster) AddClient(ctx context.Context, k int) (string, error) {
	addr, err := c.layout().clientIP(k)
	if err != nil {
		return "", err
	}
	_, err = ip(ctx, "-n", c.layout().hub, "addr", "replace", addr+"/32", "dev", bridge)
	return addr, err
}

// DialFrom returns a dial function, in the shape of [Cluster.DialContext],
// whose sockets are bound to local, an address from [Cluster.AddClient].
func (c *Cluster) DialFrom(local string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dialInFrom(ctx, nsPath(c.layout().hub), local, network, addr)
	}
}

// CutClient cuts the link of the client at addr to every node, silently.
// [Cluster.RestoreClient] undoes it; [Cluster.Heal] does not, so that a
// node fault healed meanwhile leaves an overlapping client cut in place.
func (c *Cluster) CutClient(addr string) error {
	if !c.layout().isClientIP(addr) {
		return fmt.Errorf("cluster: %s is not a client address", addr)
	}
	for _, n := range c.layout().nodes {
		if _, err := ip(context.Background(), "-n", nodeNS(n), "route", "replace", "blackhole", addr+"/32"); err != nil {
			return err
		}
	}
	c.log.Info("client cut", "addr", addr)
	return nil
}

// RestoreClient undoes [Cluster.CutClient].
func (c *Cluster) RestoreClient(addr string) error {
	for _, n := range c.layout().nodes {
		out, err := ip(context.Background(), "-n", nodeNS(n), "route", "show", "type", "blackhole", addr+"/32")
		if err != nil {
			return err
		}
		if out == "" {
			continue
		}
		if _, err := ip(context.Background(), "-n", nodeNS(n), "route", "del", "blackhole", addr+"/32"); err != nil {
			return err
		}
	}
	c.log.Info("client restored", "addr", addr)
	return nil
}
