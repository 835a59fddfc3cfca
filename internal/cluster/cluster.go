// Package cluster runs a throwaway three-node RabbitMQ cluster on this
// machine, from the system's own RabbitMQ install, for tests that need
// node loss and network partitions.
//
// Each node runs in a network namespace of its own (amqpd-a, amqpd-b,
// amqpd-c), attached by a veth to a bridge inside a hub namespace
// (amqpd-hub). The nodes are 10.201.0.1–3, the hub 10.201.0.254. Nothing
// listens outside these namespaces, so the cluster cannot collide with
// the system broker on 127.0.0.1:5672, and partitions can be made with
// routes and links instead of a firewall (this machine has neither
// iptables nor nft).
//
// Clients are tests running in the root namespace. The nodes are only
// reachable from the hub, so clients connect through [Cluster.Dial], which
// creates its socket inside the hub namespace:
//
//	conn, err := amqp.DialConfig(c.URL(cluster.A), amqp.Config{Dial: c.Dial})
//
// The nodes never share anything with the system broker: they get their own
// HOME and Erlang cookie, an empty rabbitmq-env.conf, their own config,
// plugins file, data and logs under [Options.Dir], and are started under a
// clean environment (the /usr/sbin wrappers would switch to the rabbitmq
// user and its cookie). Everything about a running cluster can be derived
// from Options.Dir, so a separate process can take it over with [Attach].
//
// With [Options.Standalone], [Start] boots a single node instead, with
// configuration of its own (an auth backend, plugins, advanced.config),
// in namespaces, a subnet and ports of its own: it runs beside the
// cluster, and neither's Start or Stop touches the other.
//
// Running a cluster needs root (namespaces, and setns for dialing); see
// [Usable]. Only one three-node cluster of this package may exist on a
// machine at a time, and one standalone node of each name: [Start]
// removes whatever an earlier one of the same layout left behind.
package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Node names one of the three cluster nodes: "a", "b" or "c".
type Node string

// The three nodes. A is the one B and C join when the cluster forms.
const A, B, C Node = "a", "b", "c"

// Nodes lists every node, in order.
var Nodes = []Node{A, B, C}

// Cut is how [Cluster.Partition] separates a node.
type Cut int

const (
	// CutPeers blackholes the routes between the node and its peers, both
	// ways: Erlang distribution traffic silently vanishes (no RST, no
	// ICMP), as in a real partition, while clients in the hub still reach
	// the node.
	CutPeers Cut = iota
	// CutFull sets the node's veth in the hub down: the node is unreachable
	// for everyone, clients included, and their packets vanish silently.
	CutFull
)

// String names the cut as the clusterctl command spells it.
func (k Cut) String() string {
	switch k {
	case CutPeers:
		return "peers"
	case CutFull:
		return "full"
	}
	return "Cut(" + strconv.Itoa(int(k)) + ")"
}

// Options configures [Start] and [Attach]. The zero value is usable.
type Options struct {
	// Dir holds everything of the cluster: cookie, configs, data, logs, pid
	// files. Default: $TMPDIR/amqpd-cluster.
	Dir string
	// PartitionHandling is RabbitMQ's cluster_partition_handling: "ignore"
	// (the default, as in RabbitMQ), "pause_minority" or "autoheal".
	PartitionHandling string
	// NetTicktime is Erlang's net_ticktime in seconds: a silent peer is
	// declared down after 0.75–1.25 times this. Default 60, RabbitMQ's;
	// tests of partitions want it short.
	NetTicktime int
	// BootTimeout bounds the boot of one node. Default 120 s.
	BootTimeout time.Duration
	// Logger receives progress messages. Nil: silent.
	Logger *slog.Logger
	// Standalone, if set, makes Start boot this one node instead of the
	// three-node cluster; PartitionHandling and NetTicktime still apply.
	// Default Dir: $TMPDIR/amqpd-<Name>.
	Standalone *Standalone
}

// withDefaults fills in the zero fields.
func (o Options) withDefaults() Options {
	if o.Standalone != nil {
		s := o.Standalone.withDefaults()
		o.Standalone = &s
	}
	if o.Dir == "" {
		o.Dir = filepath.Join(os.TempDir(), "amqpd-cluster")
		if o.Standalone != nil {
			o.Dir = o.Standalone.defaultDir(os.TempDir())
		}
	}
	if o.PartitionHandling == "" {
		o.PartitionHandling = "ignore"
	}
	if o.NetTicktime <= 0 {
		o.NetTicktime = 60
	}
	if o.BootTimeout <= 0 {
		o.BootTimeout = 120 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

func (o Options) validate() error {
	switch o.PartitionHandling {
	case "ignore", "pause_minority", "autoheal":
	default:
		return fmt.Errorf("cluster: partition handling %q: want ignore, pause_minority or autoheal",
			o.PartitionHandling)
	}
	if !filepath.IsAbs(o.Dir) {
		// Paths end up in the nodes' environment, which runs elsewhere.
		return fmt.Errorf("cluster: Dir %q is not absolute", o.Dir)
	}
	if o.Standalone != nil {
		return o.Standalone.validate()
	}
	return nil
}

// Cluster is a running (or partly running) three-node cluster, or a
// standalone node. Its methods may be called from several goroutines.
type Cluster struct {
	o   Options
	lay *layout // nil in a zero Cluster: see layout
	log *slog.Logger

	mu sync.Mutex
	// launched holds, per node this process booted, a channel closed when
	// the rabbitmq-server launcher exited and has been reaped. Nodes found
	// by Attach have none.
	launched map[Node]chan struct{}
}

// Usable reports whether this machine can run a cluster: root, `ip` with
// network namespace support, and a RabbitMQ install at
// /usr/lib/rabbitmq/bin. reason is one line, for t.Skip.
func Usable() (ok bool, reason string) {
	if runtime.GOOS != "linux" {
		return false, "cluster: needs Linux (network namespaces)"
	}
	if os.Geteuid() != 0 {
		return false, "cluster: needs root (network namespaces, setns)"
	}
	for _, f := range []string{rmqServer, rmqCtl} {
		if st, err := os.Stat(f); err != nil || st.Mode()&0o111 == 0 {
			return false, "cluster: no RabbitMQ install (" + f + " missing)"
		}
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		return false, "cluster: no `ip` command (iproute2)"
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		return false, "cluster: the kernel has no network namespaces"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, ip, "netns", "list").CombinedOutput(); err != nil {
		return false, "cluster: `ip netns list` failed: " + firstLine(string(out), err)
	}
	return true, ""
}

// Start boots the three nodes in parallel, joins b and c to a (in
// parallel), and verifies that a sees three running nodes; or, with
// o.Standalone, boots that node alone. It first removes whatever an
// earlier cluster (or standalone node of the same name) left: its
// namespaces and its nodes, and the previous contents of o.Dir.
//
// If Start fails it tears down what it built; the error says which log to
// read.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	if ok, why := Usable(); !ok {
		return nil, errors.New(why)
	}
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	c := newCluster(o)
	t0 := time.Now()
	if err := c.layout().cleanStale(c.log); err != nil {
		return nil, err
	}
	if err := c.writeFiles(); err != nil {
		return nil, err
	}
	if err := c.layout().netUp(ctx); err != nil {
		_ = c.layout().netDown()
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			if err := c.Stop(); err != nil {
				c.log.Warn("cleanup after a failed start", "err", err)
			}
		}
	}()
	for _, n := range c.layout().nodes {
		if err := c.boot(n); err != nil {
			return nil, err
		}
	}
	if err := each(c.layout().nodes, func(n Node) error { return c.await(ctx, n) }); err != nil {
		return nil, err
	}
	c.log.Info("nodes booted", "nodes", c.layout().nodes, "elapsed", time.Since(t0).Round(time.Millisecond))
	if o.Standalone == nil {
		if err := c.form(ctx); err != nil {
			return nil, err
		}
	}
	c.log.Info("up", "nodes", c.layout().nodes, "elapsed", time.Since(t0).Round(time.Millisecond),
		"partition_handling", o.PartitionHandling, "net_ticktime", o.NetTicktime, "dir", o.Dir)
	ok = true
	return c, nil
}

// form joins b and c to a and waits until some node sees all three
// running.
func (c *Cluster) form(ctx context.Context) error {
	// b and c join at the same time: about 5 s faster than one after the
	// other. start_app may log "Failed to create a tracked connection
	// table" for the other joiner; it is harmless.
	var serial sync.Mutex
	err := each([]Node{B, C}, func(n Node) error { return c.join(ctx, n, &serial) })
	if err != nil {
		return err
	}
	// A bounded wait, since start_app returns once the app runs, not once
	// every peer has seen it.
	wctx, cancel := context.WithTimeout(ctx, c.o.BootTimeout)
	defer cancel()
	if err := c.WaitRunning(wctx, len(Nodes)); err != nil {
		return fmt.Errorf("cluster did not form: %w", err)
	}
	return nil
}

// joinAttempts bounds how often [Cluster.join] tries one node.
const joinAttempts = 3

// join makes n a member of a's cluster. The parallel joins of b and c
// sometimes race in mnesia's schema merge: start_app then fails with
// "{badmatch,{error,{normal,{mnesia_app,start,...}}}}" (seen in a CI run
// of 2026-12-01). A failed attempt is retried from a clean slate (reset,
// which also makes a forget the half-joined node) while holding serial, so
// a retry never races the other joiner's retry.
func (c *Cluster) join(ctx context.Context, n Node, serial *sync.Mutex) error {
	steps := [][]string{{"stop_app"}, {"join_cluster", nodeName(A)}, {"start_app"}}
	var err error
	for attempt := 1; attempt <= joinAttempts; attempt++ {
		if attempt > 1 {
			serial.Lock()
			c.log.Warn("join failed; retrying from a reset", "node", n, "attempt", attempt, "err", err)
			_, _ = c.Ctl(ctx, n, "stop_app")
			steps = [][]string{{"reset"}, {"join_cluster", nodeName(A)}, {"start_app"}}
		}
		err = nil
		for _, args := range steps {
			if _, err = c.Ctl(ctx, n, args...); err != nil {
				break
			}
		}
		if attempt > 1 {
			serial.Unlock()
		}
		if err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("join %s to %s: %w", n, A, err)
	}
	return nil
}

// Attach takes over a cluster (or standalone node) that [Start] booted,
// possibly in another process, from the files in o.Dir. Boot options
// (partition handling, net ticktime, the standalone node) are read back
// from o.Dir, so [Cluster.Restart] boots a node as Start did, and a
// standalone node's Dir never yields the three-node layout, whose Stop
// would take the cluster's namespaces down. Attach does not check that
// any node runs; it fails only if there is no cluster state in o.Dir or
// the hub namespace is gone.
func Attach(o Options) (*Cluster, error) {
	o = o.withDefaults()
	b, err := os.ReadFile(filepath.Join(o.Dir, stateFile))
	if err != nil {
		return nil, fmt.Errorf("cluster: no cluster state in %s (cluster start first?): %w", o.Dir, err)
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", stateFile, err)
	}
	o.PartitionHandling, o.NetTicktime, o.Standalone = st.PartitionHandling, st.NetTicktime, st.Standalone
	c := newCluster(o)
	if _, err := os.Stat(nsPath(c.layout().hub)); err != nil {
		return nil, fmt.Errorf("cluster: namespace %s is gone: %w", c.layout().hub, err)
	}
	return c, nil
}

func newCluster(o Options) *Cluster {
	l := three
	if o.Standalone != nil {
		l = o.Standalone.layout()
	}
	return &Cluster{o: o, lay: l, log: o.Logger, launched: map[Node]chan struct{}{}}
}

// layout is c's nodes, their namespaces, addresses and ports. A zero
// Cluster is the three-node cluster's: it knows the URLs, which some
// callers need before (or without) a Start.
func (c *Cluster) layout() *layout {
	if c.lay == nil {
		return three
	}
	return c.lay
}

// Nodes lists the nodes of c: a, b and c, or the standalone node.
func (c *Cluster) Nodes() []Node { return slices.Clone(c.layout().nodes) }

// Dir returns the directory holding the cluster's files.
func (c *Cluster) Dir() string { return c.o.Dir }

// Stop stops the nodes (gracefully, for up to about 30 s, then with kill -9
// of our own beam.smp processes only), deletes the namespaces and removes
// the nodes' data. It is bounded, safe to call more than once, and returns
// the first error met while carrying on with the rest.
func (c *Cluster) Stop() error {
	t0 := time.Now()
	pids := map[Node]int{}
	for _, n := range c.layout().nodes {
		if p, err := c.beamPID(n); err == nil {
			pids[n] = p // rabbit removes its pid file before the VM exits: keep the pid
		}
	}
	for n, p := range pids { // a frozen node would wait out the graceful stop
		_ = c.signalVerified(n, p, syscall.SIGCONT)
	}
	ctx, cancel := context.WithTimeout(context.Background(), gracefulStop)
	defer cancel()
	var wg sync.WaitGroup
	for n := range pids {
		wg.Go(func() {
			if _, err := c.Ctl(ctx, n, "stop"); err != nil {
				c.log.Debug("graceful stop", "node", n, "err", err)
			}
		})
	}
	wg.Wait()
	var errs []error
	for n, p := range pids {
		if waitGone(ctx, p) {
			continue
		}
		c.log.Warn("node did not stop in time: kill -9", "node", n, "pid", p)
		if err := c.killVerified(n, p); err != nil {
			errs = append(errs, err)
		}
	}
	c.reapLaunchers()
	if err := c.layout().netDown(); err != nil {
		errs = append(errs, err)
	}
	for _, n := range c.layout().nodes {
		if err := os.RemoveAll(filepath.Join(c.o.Dir, string(n), "mnesia")); err != nil {
			errs = append(errs, err)
		}
	}
	c.log.Info("stopped", "nodes", c.layout().nodes, "elapsed", time.Since(t0).Round(time.Millisecond))
	return errors.Join(errs...)
}

// URL returns the AMQP URL of node n, for amqp.DialConfig with Dial set to
// [Cluster.Dial].
func (c *Cluster) URL(n Node) string { return "amqp://guest:guest@" + c.Addr(n) + "/" }

// Addr returns node n's AMQP address, host:port, reachable through
// [Cluster.Dial].
func (c *Cluster) Addr(n Node) string { return c.layout().amqpAddr(n) }

// URLs returns the AMQP URLs of c's nodes, in order (a, b, c).
func (c *Cluster) URLs() []string {
	u := make([]string, len(c.layout().nodes))
	for i, n := range c.layout().nodes {
		u[i] = c.URL(n)
	}
	return u
}

// Kill sends SIGKILL to node n's beam.smp: a crash, as far as its peers and
// clients can tell. It refuses a pid that is not ours: the process must be
// a beam.smp whose environment names our node and our pid file. Kill
// returns once the VM is gone.
func (c *Cluster) Kill(n Node) error {
	if err := c.layout().check(n); err != nil {
		return err
	}
	p, err := c.beamPID(n)
	if err != nil {
		return err
	}
	if err := c.killVerified(n, p); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !waitGone(ctx, p) {
		return fmt.Errorf("cluster: node %s: beam.smp %d still there 10 s after kill -9", n, p)
	}
	c.log.Info("killed", "node", n, "pid", p)
	return nil
}

// Freeze stops node n's beam.smp with SIGSTOP: the VM keeps its sockets,
// so the kernel still completes TCP handshakes and acknowledges segments,
// but nothing answers over AMQP or to its peers, as with a node stalled on
// its disk or paused by its hypervisor. [Cluster.Thaw] resumes it; Stop
// resumes every node before stopping it.
func (c *Cluster) Freeze(n Node) error { return c.signal(n, syscall.SIGSTOP, "frozen") }

// Thaw resumes node n after [Cluster.Freeze] (SIGCONT). Its peers may have
// counted it down meanwhile: what they recorded is theirs to heal.
func (c *Cluster) Thaw(n Node) error { return c.signal(n, syscall.SIGCONT, "thawed") }

// signal sends sig to node n's own beam.smp (verified, as Kill does).
func (c *Cluster) signal(n Node, sig syscall.Signal, what string) error {
	if err := c.layout().check(n); err != nil {
		return err
	}
	p, err := c.beamPID(n)
	if err != nil {
		return err
	}
	if err := c.signalVerified(n, p, sig); err != nil {
		return err
	}
	c.log.Info(what, "node", n, "pid", p)
	return nil
}

// Restart boots node n again after [Cluster.Kill] (or a graceful stop) and
// waits until it has started (rabbitmqctl await_startup). The node rejoins
// the cluster by itself; use [Cluster.WaitRunning] to wait for that.
func (c *Cluster) Restart(ctx context.Context, n Node) error {
	if err := c.layout().check(n); err != nil {
		return err
	}
	if p, err := c.beamPID(n); err == nil {
		return fmt.Errorf("cluster: node %s still runs (pid %d)", n, p)
	}
	t0 := time.Now()
	if err := c.boot(n); err != nil {
		return err
	}
	if err := c.await(ctx, n); err != nil {
		return err
	}
	c.log.Info("restarted", "node", n, "elapsed", time.Since(t0).Round(time.Millisecond))
	return nil
}

// StopApp stops the RabbitMQ application on n (rabbitmqctl stop_app); the
// Erlang VM stays up, clients get connection.close 320 or a reset.
func (c *Cluster) StopApp(ctx context.Context, n Node) error {
	_, err := c.Ctl(ctx, n, "stop_app")
	return err
}

// StartApp starts the RabbitMQ application on n again (rabbitmqctl
// start_app). After a healed partition in "ignore" mode, StopApp then
// StartApp on the minority node is how it rejoins.
func (c *Cluster) StartApp(ctx context.Context, n Node) error {
	_, err := c.Ctl(ctx, n, "start_app")
	return err
}

// Leader returns the node leading quorum queue queue, asking each node
// whose VM runs until one answers.
func (c *Cluster) Leader(ctx context.Context, queue string) (Node, error) {
	var errs []error
	for _, n := range c.layout().nodes {
		if _, err := c.beamPID(n); err != nil {
			continue
		}
		out, err := c.Ctl(ctx, n, "list_queues", "--formatter", "json", "name", "leader")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var qs []struct{ Name, Leader string }
		if err := json.Unmarshal([]byte(jsonPart(out)), &qs); err != nil {
			errs = append(errs, fmt.Errorf("node %s: list_queues: %w", n, err))
			continue
		}
		for _, q := range qs {
			if q.Name != queue {
				continue
			}
			if l, ok := c.layout().nodeOf(q.Leader); ok {
				return l, nil
			}
			return "", fmt.Errorf("cluster: queue %q has leader %q, not one of our nodes", queue, q.Leader)
		}
		errs = append(errs, fmt.Errorf("node %s does not list queue %q", n, queue))
	}
	if len(errs) == 0 {
		return "", errors.New("cluster: no node runs")
	}
	return "", fmt.Errorf("cluster: leader of %q: %w", queue, errors.Join(errs...))
}

// cliBound bounds one rabbitmqctl call. Each call boots an Erlang VM, a few
// seconds of CPU; WaitRunning starts two per node every round. A bound
// those boots miss on a busy machine kills them and boots them again a
// second later, which keeps the machine busy: 45 s lets a slow round
// finish, and a whole wait stays bounded by its ctx.
const cliBound = 45 * time.Second

// Running reports whether the RabbitMQ application runs on n. It is false
// when the VM is down, the app is stopped, or the node does not answer
// within ctx (or cliBound).
func (c *Cluster) Running(ctx context.Context, n Node) bool {
	if _, err := c.beamPID(n); err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, cliBound)
	defer cancel()
	out, err := c.Ctl(ctx, n, "eval", "rabbit:is_running().")
	return err == nil && strings.TrimSpace(out) == "true"
}

// WaitRunning waits until some node's cluster_status lists at least want
// running nodes, each of which also reports its application running, and
// records no partition; or until ctx ends. It polls about once a second;
// use it after a restart, StartApp or Heal. After a partition that the
// nodes noticed, in the default "ignore" mode, the partition stays
// recorded until StopApp and StartApp on the minority node, so WaitRunning
// waits for that.
func (c *Cluster) WaitRunning(ctx context.Context, want int) error {
	var last string
	for {
		got, detail := c.runningNodes(ctx)
		if len(got) >= want {
			return nil
		}
		if last == "" || ctx.Err() == nil {
			// A round cut short by ctx says only that: keep the one before.
			last = detail
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: waiting for %d running nodes: %w (last: %s)", want, ctx.Err(), last)
		case <-time.After(time.Second):
		}
	}
}

// runningNodes returns the nodes that the best-informed node without a
// recorded partition sees running and that say so themselves, with a
// description for errors.
func (c *Cluster) runningNodes(ctx context.Context) ([]Node, string) {
	views := make([]view, len(c.layout().nodes))
	var wg sync.WaitGroup
	for i, n := range c.layout().nodes {
		wg.Go(func() { views[i] = c.viewFrom(ctx, n) })
	}
	wg.Wait()
	return bestView(views)
}

// A view is what one node says of the cluster: whether its own app runs,
// and the running nodes and partitions its cluster_status lists.
type view struct {
	from       Node
	self       bool
	running    []Node
	partitions map[string][]string
	err        error
}

// viewFrom asks n (within 2 cliBound) whether its app runs and what it sees. A
// node whose VM is down has no view: err says why.
func (c *Cluster) viewFrom(ctx context.Context, n Node) view {
	v := view{from: n}
	if _, err := c.beamPID(n); err != nil {
		v.err = err
		return v
	}
	cctx, cancel := context.WithTimeout(ctx, 2*cliBound) // Running, then cluster_status
	defer cancel()
	v.self = c.Running(cctx, n)
	out, err := c.Ctl(cctx, n, "cluster_status", "--formatter", "json")
	if err != nil {
		v.err = err
		return v
	}
	st, err := parseClusterStatus(out)
	if err != nil {
		v.err = err
		return v
	}
	v.partitions = st.Partitions
	for _, s := range st.RunningNodes {
		if m, ok := c.layout().nodeOf(s); ok {
			v.running = append(v.running, m)
		}
	}
	return v
}

// bestView picks, from the views of every node (in the layout's order),
// the longest list of running nodes that also say their app runs, among
// the views that record no partition; desc describes every view, for
// errors.
func bestView(views []view) (best []Node, desc string) {
	self := map[Node]bool{}
	for _, v := range views {
		self[v.from] = v.self
	}
	var lines []string
	for _, v := range views {
		if v.err != nil {
			lines = append(lines, fmt.Sprintf("%s: %v", v.from, firstLine(v.err.Error(), nil)))
			continue
		}
		var ok []Node
		for _, m := range v.running {
			if self[m] {
				ok = append(ok, m)
			}
		}
		lines = append(lines, fmt.Sprintf("%s sees %v (app running: %v, partitions: %v)",
			v.from, v.running, v.self, v.partitions))
		if len(v.partitions) > 0 {
			continue // a view across a recorded partition is no healthy cluster
		}
		if len(ok) > len(best) {
			best = ok
		}
	}
	return best, strings.Join(lines, "; ")
}

// clusterStatus is the part of `rabbitmqctl cluster_status` we read.
type clusterStatus struct {
	RunningNodes []string            `json:"running_nodes"`
	Partitions   map[string][]string `json:"partitions"`
}

// parseClusterStatus reads `rabbitmqctl cluster_status --formatter json`.
func parseClusterStatus(out string) (clusterStatus, error) {
	var st clusterStatus
	err := json.Unmarshal([]byte(jsonPart(out)), &st)
	return st, err
}

// each runs f for every node in parallel and joins the errors.
func each(ns []Node, f func(Node) error) error {
	errs := make([]error, len(ns))
	var wg sync.WaitGroup
	for i, n := range ns {
		wg.Go(func() { errs[i] = f(n) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// jsonPart drops anything the CLI prints before its JSON document (a
// warning line, say).
func jsonPart(s string) string {
	if i := strings.IndexAny(s, "[{"); i > 0 {
		return s[i:]
	}
	return s
}

// firstLine shortens command output to one line for messages.
func firstLine(s string, err error) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if s == "" && err != nil {
		return err.Error()
	}
	return s
}

// Status describes the cluster for humans, one line per fact: each node's
// pid and memory, what each running node sees (bounded, in parallel: a
// partition slows the CLI down), and the cuts in place.
func (c *Cluster) Status(ctx context.Context) string {
	var b strings.Builder
	for _, n := range c.layout().nodes {
		p, err := c.beamPID(n)
		if err != nil {
			fmt.Fprintf(&b, "%s %s DOWN\n", n, nodeName(n))
			continue
		}
		fmt.Fprintf(&b, "%s %s pid=%d rss=%dMiB url=%s\n", n, nodeName(n), p, rssMiB(p), c.URL(n))
	}
	for _, s := range c.seenFromEach(ctx) {
		if s != "" {
			b.WriteString(s + "\n")
		}
	}
	for _, n := range c.layout().nodes {
		b.WriteString(c.netStatus(ctx, n) + "\n")
	}
	return b.String()
}

// seenFromEach asks every node whose VM runs, in parallel and within 20 s
// each, what it sees; a line per node, in Nodes' order, "" for a node
// that is down.
func (c *Cluster) seenFromEach(ctx context.Context) []string {
	seen := make([]string, len(c.layout().nodes))
	var wg sync.WaitGroup
	for i, n := range c.layout().nodes {
		if _, err := c.beamPID(n); err != nil {
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			seen[i] = c.seenFrom(cctx, n)
		})
	}
	wg.Wait()
	return seen
}

// seenFrom is one line of what n says it sees, or why it said nothing.
func (c *Cluster) seenFrom(ctx context.Context, n Node) string {
	out, err := c.Ctl(ctx, n, "cluster_status", "--formatter", "json")
	if err != nil {
		return fmt.Sprintf("seen from %s: no answer (%s)", n, firstLine(err.Error(), nil))
	}
	st, err := parseClusterStatus(out)
	if err != nil {
		return fmt.Sprintf("seen from %s: %v", n, err)
	}
	return fmt.Sprintf("seen from %s: running %s | partitions: %v",
		n, strings.Join(st.RunningNodes, " "), st.Partitions)
}

// netStatus describes n's network: the state of its link in the hub
// (down under a full cut) and the addresses its namespace blackholes (its
// peers', under a cut from them).
func (c *Cluster) netStatus(ctx context.Context, n Node) string {
	routes, err := ip(ctx, "-n", nodeNS(n), "route", "show", "type", "blackhole")
	if err != nil {
		return fmt.Sprintf("net %s: no namespace", n)
	}
	var holes []string
	for line := range strings.Lines(routes) {
		if f := strings.Fields(line); len(f) >= 2 {
			holes = append(holes, f[1])
		}
	}
	link, _ := ip(ctx, "-br", "-n", c.layout().hub, "link", "show", hubVeth(n))
	state := "?"
	if f := strings.Fields(link); len(f) >= 2 {
		state = f[1]
	}
	return fmt.Sprintf("net %s: hub link %s, blackholed: %v", n, state, holes)
}

// rssMiB is p's resident memory, 0 if unknown.
func rssMiB(p int) int {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/status")
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.Atoi(f[1])
			return kb / 1024
		}
	}
	return 0
}

// Cleanup removes what a three-node cluster of this package may have left
// behind, without needing its Dir: every beam.smp running one of its node
// names, and its namespaces (with whatever runs in them); standalone nodes
// are left alone. [Start] does this first; it is for `clusterctl stop`
// when the state directory is gone.
func Cleanup() error {
	return three.cleanStale(slog.New(slog.DiscardHandler))
}

// Exec returns a command that runs name with args inside the hub
// namespace (via `ip netns exec`), where the nodes are reachable: for
// tools that cannot use [Cluster.Dial]. The caller sets Env, Stdout and
// so on, and runs it.
func (c *Cluster) Exec(ctx context.Context, name string, args ...string) *exec.Cmd {
	argv := append([]string{"netns", "exec", c.layout().hub, name}, args...)
	return exec.CommandContext(ctx, ipCmd(), argv...)
}
