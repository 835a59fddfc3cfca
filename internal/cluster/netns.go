package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ipCmd is the iproute2 binary; Usable has checked it exists.
func ipCmd() string {
	if p, err := exec.LookPath("ip"); err == nil {
		return p
	}
	return "ip"
}

func nsPath(ns string) string { return "/var/run/netns/" + ns }

// ip runs `ip args...`, bounded, and includes its output in the error.
func ip(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, ipCmd(), args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("cluster: ip %s: %w: %s", strings.Join(args, " "), err,
			strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// hubVeth is the hub end of n's veth; the node's end is eth0 in its own
// namespace.
func hubVeth(n Node) string { return "vh-" + string(n) }

// netUp creates l's hub with its bridge, and one namespace per node
// joined to it by a veth.
func (l *layout) netUp(ctx context.Context) error {
	hub := l.hub
	steps := [][]string{
		{"netns", "add", hub},
		{"-n", hub, "link", "set", "lo", "up"},
		{"-n", hub, "link", "add", bridge, "type", "bridge"},
		{"-n", hub, "addr", "add", l.hubIP() + "/24", "dev", bridge},
		{"-n", hub, "link", "set", bridge, "up"},
	}
	for _, n := range l.nodes {
		ns := nodeNS(n)
		steps = append(steps,
			[]string{"netns", "add", ns},
			[]string{"-n", ns, "link", "set", "lo", "up"},
			[]string{"link", "add", hubVeth(n), "netns", hub, "type", "veth",
				"peer", "name", "eth0", "netns", ns},
			[]string{"-n", hub, "link", "set", hubVeth(n), "master", bridge, "up"},
			[]string{"-n", ns, "addr", "add", l.nodeIP(n) + "/24", "dev", "eth0"},
			[]string{"-n", ns, "link", "set", "eth0", "up"},
		)
	}
	for _, s := range steps {
		if _, err := ip(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}

// netDown deletes l's namespaces, first killing whatever still runs in
// them: by construction only l's nodes' processes (each namespace's epmd,
// a VM that would not stop). Namespaces of anyone else, other layouts'
// included, are left alone.
func (l *layout) netDown() error {
	var errs []error
	for _, ns := range l.namespaces() {
		if _, err := os.Stat(nsPath(ns)); err != nil {
			continue
		}
		out, _ := ip(context.Background(), "netns", "pids", ns)
		var pids []int
		for f := range strings.FieldsSeq(out) {
			if p, err := strconv.Atoi(f); err == nil {
				pids = append(pids, p)
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for _, p := range pids {
			if !waitGone(ctx, p) {
				errs = append(errs, fmt.Errorf("cluster: pid %d in namespace %s survived kill -9", p, ns))
			}
		}
		cancel()
		if _, err := ip(context.Background(), "netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Partition cuts node n off, as how says. Cuts add up; [Cluster.Heal]
// undoes them all.
func (c *Cluster) Partition(n Node, how Cut) error {
	if err := c.layout().check(n); err != nil {
		return err
	}
	ctx := context.Background()
	switch how {
	case CutFull:
		if _, err := ip(ctx, "-n", c.layout().hub, "link", "set", hubVeth(n), "down"); err != nil {
			return err
		}
	case CutPeers:
		for _, o := range c.layout().nodes {
			if o == n {
				continue
			}
			if err := c.layout().blackhole(ctx, n, o); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("cluster: unknown cut %d", how)
	}
	c.log.Info("partitioned", "node", n, "cut", how)
	return nil
}

// CutBetween cuts nodes x and y from each other only, each still seeing
// the third: a bridge partition, where the third node sees both sides.
// [Cluster.Heal] undoes it.
func (c *Cluster) CutBetween(x, y Node) error {
	if err := c.layout().check(x); err != nil {
		return err
	}
	if err := c.layout().check(y); err != nil {
		return err
	}
	if x == y {
		return fmt.Errorf("cluster: cut between %s and itself", x)
	}
	if err := c.layout().blackhole(context.Background(), x, y); err != nil {
		return err
	}
	c.log.Info("partitioned", "between", []Node{x, y})
	return nil
}

// blackhole routes x's packets to y, and y's to x, nowhere: they vanish
// silently. (tc's drop action needs a module this kernel lacks, and there
// is no iptables or nft.)
func (l *layout) blackhole(ctx context.Context, x, y Node) error {
	if _, err := ip(ctx, "-n", nodeNS(x), "route", "replace", "blackhole", l.nodeIP(y)+"/32"); err != nil {
		return err
	}
	_, err := ip(ctx, "-n", nodeNS(y), "route", "replace", "blackhole", l.nodeIP(x)+"/32")
	return err
}

// Heal removes every blackhole route between nodes and sets every hub
// link up again; client cuts stay until [Cluster.RestoreClient].
// Whether the nodes then merge again depends on the partition handling
// mode and on whether they noticed the cut at all; see
// [Cluster.WaitRunning].
func (c *Cluster) Heal() error {
	ctx := context.Background()
	var errs []error
	for _, n := range c.layout().nodes {
		out, err := ip(ctx, "-n", nodeNS(n), "route", "show", "type", "blackhole")
		if err != nil {
			errs = append(errs, err)
		}
		for line := range strings.Lines(out) {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "blackhole" && !c.layout().isClientIP(f[1]) {
				if _, err := ip(ctx, "-n", nodeNS(n), "route", "del", "blackhole", f[1]); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if _, err := ip(ctx, "-n", c.layout().hub, "link", "set", hubVeth(n), "up"); err != nil {
			errs = append(errs, err)
		}
	}
	c.log.Info("healed")
	return errors.Join(errs...)
}

// Dial connects to addr from inside the hub namespace, where the nodes are
// reachable. It fits amqp.Config.Dial.
func (c *Cluster) Dial(network, addr string) (net.Conn, error) {
	return c.DialContext(context.Background(), network, addr)
}

// DialContext is [Cluster.Dial] bounded by ctx. The returned connection is
// an ordinary net.Conn: a socket belongs to the namespace it was created
// in, whatever thread uses it later.
func (c *Cluster) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return dialIn(ctx, nsPath(c.layout().hub), network, addr)
}

// dialIn creates a socket inside the network namespace at nsFile and
// connects it.
func dialIn(ctx context.Context, nsFile, network, addr string) (net.Conn, error) {
	return dialInFrom(ctx, nsFile, "", network, addr)
}

// dialInFrom is dialIn from the local address local ("" for any).
//
// A network namespace belongs to a thread, so the dial runs on a goroutine
// locked to its thread, which enters the namespace and leaves it again. If
// leaving fails the goroutine exits still locked, and the runtime then
// ends that thread rather than reuse it in the wrong namespace.
func dialInFrom(ctx context.Context, nsFile, local, network, addr string) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	res := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		restored := false
		defer func() {
			if restored {
				runtime.UnlockOSThread()
			}
		}()
		self, err := os.Open("/proc/self/task/" + strconv.Itoa(gettid()) + "/ns/net")
		if err != nil {
			restored = true // never left it
			res <- result{err: fmt.Errorf("cluster: current network namespace: %w", err)}
			return
		}
		defer self.Close()
		target, err := os.Open(nsFile)
		if err != nil {
			restored = true
			res <- result{err: fmt.Errorf("cluster: %w", err)}
			return
		}
		err = setns(target)
		target.Close()
		if err != nil {
			restored = true // setns failed: still where we were
			res <- result{err: fmt.Errorf("cluster: enter %s: %w", nsFile, err)}
			return
		}
		var d net.Dialer
		if local != "" {
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
		}
		conn, err := d.DialContext(ctx, network, addr)
		if rerr := setns(self); rerr != nil {
			if conn != nil {
				conn.Close()
			}
			res <- result{err: fmt.Errorf("cluster: leave %s: %w", nsFile, rerr)}
			return
		}
		restored = true
		res <- result{conn, err}
	}()
	r := <-res
	return r.conn, r.err
}
