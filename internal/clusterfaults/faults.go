// Package clusterfaults runs publishers and consumers against a real
// three-node RabbitMQ cluster (package internal/cluster) while a fault is
// injected, and measures what each read mode's client made of it: the time
// from the fault to the first new confirm, the longest gap between
// confirms, nacks, duplicates, and confirmed messages lost.
//
// One fault is one Cell. Every variant (upstream, drainer, legacy) runs in
// the same cell at the same time, each on its own quorum queue, so that a
// costly fault (a node killed and booted again) is paid once for all of
// them and every variant sees the very same fault.
//
// The reliability suite (reliability/cluster) asserts on the results; the
// benchmark scenario "failover" reports them.
package clusterfaults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
)

// A Fault is one thing done to the cluster while clients run.
type Fault struct {
	// ID is short and stable (the numbering): 1, 2, 3, 4, 5+7,
	// 5pm, 5pmL, 6a, 6b.
	ID string
	// Name says what happens, for tables.
	Name string
	// Leader is where each variant's quorum queue is declared, so where
	// its leader starts (RabbitMQ places a new quorum queue's leader on
	// the declaring client's node). Publisher and Consumer are the nodes
	// the clients first connect to.
	Leader, Publisher, Consumer cluster.Node
	// Probe is a node the fault spares, where the cell measures the
	// broker's readiness: the first moment a fresh channel there has a
	// publish confirmed (Result.BrokerReady), which splits each gap into
	// the broker's share and the client's.
	Probe cluster.Node
	// Inject does the fault.
	Inject func(ctx context.Context, c *cluster.Cluster) error
	// Hold is how long a cut is kept before Repair; zero repairs as soon
	// as every variant has resumed (or Window ran out).
	Hold time.Duration
	// Repair undoes the fault and waits until three nodes run again. Its
	// note, if any, says what it found (a partition still recorded after
	// the heal).
	Repair func(ctx context.Context, c *cluster.Cluster) (note string, err error)
	// CloseDuring also times Connection.Close, in every variant, on a
	// connection to the publisher's node whose confirm is stalled by the
	// fault (the fault 7).
	CloseDuring bool
	// Partition marks a cut, whose resume target is the confirm timeout
	// or heartbeat rather than the 1 s of a node's death.
	Partition bool
	// ConsumerLost marks a fault that takes the consumer's node away
	// (killed, or its link cut): the consumer must consume again on
	// another node, which the cell records (Result.ConsumerResumed).
	ConsumerLost bool
}

// Faults are the faults 1 to 7 (7 rides on 5; 5pm is 5 under
// pause_minority instead of RabbitMQ's default ignore; 5pmL is 5pm with
// the queue's leader on the cut node), and issue #43's frozen nodes (8L,
// 8, 8c), with 8o, which the nemesis found (issue #42, seed 1): the
// leader frozen while the publisher is on a healthy node, whose channel
// goes silent until the election is over. hold is how long a partition or a freeze is kept. It is a
// table: each fault's injection and repair are built by the helpers below
// it.
func Faults(hold time.Duration) []Fault {
	return []Fault{
		{ID: "1", Name: "kill -9 of the queue leader (no client on it)",
			Leader: cluster.A, Publisher: cluster.B, Consumer: cluster.C, Probe: cluster.B,
			Inject: killNode(cluster.A), Repair: restartNode(cluster.A)},
		{ID: "2", Name: "kill -9 of the publisher's node, the leader",
			Leader: cluster.B, Publisher: cluster.B, Consumer: cluster.C, Probe: cluster.C,
			Inject: killNode(cluster.B), Repair: restartNode(cluster.B)},
		{ID: "3", Name: "stop_app of the publisher's node, the leader",
			Leader: cluster.B, Publisher: cluster.B, Consumer: cluster.C, Probe: cluster.C,
			Inject: stopApp(cluster.B), Repair: startApp(cluster.B)},
		{ID: "4", Name: "kill -9 of the consumer's node",
			Leader: cluster.A, Publisher: cluster.B, Consumer: cluster.C, Probe: cluster.B,
			Inject: killNode(cluster.C), Repair: restartNode(cluster.C), ConsumerLost: true},
		{ID: "5+7",
			Name:   "the publisher's node cut from its peers, still reachable; Close() during the cut",
			Leader: cluster.A, Publisher: cluster.B, Consumer: cluster.C, Probe: cluster.C,
			Inject: cutNode(cluster.B, cluster.CutPeers), Hold: hold, Repair: healNode(cluster.B),
			CloseDuring: true, Partition: true},
		{ID: "5pm", Name: "the publisher's node cut from its peers, pause_minority",
			Leader: cluster.A, Publisher: cluster.B, Consumer: cluster.C, Probe: cluster.C,
			Inject: pauseMinorityCut(cluster.B), Hold: hold, Repair: pauseMinorityHeal(cluster.B),
			Partition: true},
		// The leader is on the cut node: the majority must first notice
		// the cut (0.75–1.25 × net_ticktime), then elect a new leader,
		// before any node confirms, so the confirm timeout alone cannot
		// make it short (issue #27, item 5).
		{ID: "5pmL", Name: "the publisher's node, the leader, cut from its peers, pause_minority",
			Leader: cluster.B, Publisher: cluster.B, Consumer: cluster.C, Probe: cluster.C,
			Inject: pauseMinorityCut(cluster.B), Hold: hold, Repair: pauseMinorityHeal(cluster.B),
			Partition: true},
		{ID: "6a", Name: "link of the publisher's node cut",
			Leader: cluster.A, Publisher: cluster.B, Consumer: cluster.C, Probe: cluster.C,
			Inject: cutNode(cluster.B, cluster.CutFull), Hold: hold, Repair: healNode(cluster.B),
			Partition: true},
		{ID: "6b", Name: "link of the consumer's node cut",
			Leader: cluster.A, Publisher: cluster.B, Consumer: cluster.C, Probe: cluster.B,
			Inject: cutNode(cluster.C, cluster.CutFull), Hold: hold, Repair: healNode(cluster.C),
			Partition: true, ConsumerLost: true},
		// Frozen nodes (issue #43): the VM stopped (SIGSTOP) for hold,
		// alive to TCP and silent to AMQP and to its peers, as a node
		// stalled on its disk or paused by its hypervisor is. Its peers
		// count it down after 0.75–1.25 × net_ticktime; the leader's
		// queue then elects another leader.
		{ID: "8L", Name: "the publisher's node, the leader, frozen (SIGSTOP)",
			Leader: cluster.B, Publisher: cluster.B, Consumer: cluster.C, Probe: cluster.C,
			Inject: freezeNode(cluster.B), Hold: hold, Repair: thawNode(cluster.B), Partition: true},
		{ID: "8", Name: "the publisher's node frozen (SIGSTOP), not the leader",
			Leader: cluster.A, Publisher: cluster.B, Consumer: cluster.C, Probe: cluster.C,
			Inject: freezeNode(cluster.B), Hold: hold, Repair: thawNode(cluster.B), Partition: true},
		{ID: "8o", Name: "the leader frozen (SIGSTOP), the publisher on another node",
			Leader: cluster.A, Publisher: cluster.B, Consumer: cluster.C, Probe: cluster.B,
			Inject: freezeNode(cluster.A), Hold: hold, Repair: thawNode(cluster.A), Partition: true},
		{ID: "8c", Name: "the consumer's node frozen (SIGSTOP)",
			Leader: cluster.A, Publisher: cluster.B, Consumer: cluster.C, Probe: cluster.B,
			Inject: freezeNode(cluster.C), Hold: hold, Repair: thawNode(cluster.C), Partition: true,
			ConsumerLost: true},
	}
}

// freezeNode stops n's VM (SIGSTOP).
func freezeNode(n cluster.Node) func(context.Context, *cluster.Cluster) error {
	return func(_ context.Context, c *cluster.Cluster) error { return c.Freeze(n) }
}

// thawNode resumes n's VM, then heals what its peers recorded while it
// was silent: they counted it down, and in the default ignore handling a
// partition stays recorded until an app restarts (HealAndRejoin).
func thawNode(n cluster.Node) func(context.Context, *cluster.Cluster) (string, error) {
	return func(ctx context.Context, c *cluster.Cluster) (string, error) {
		if err := c.Thaw(n); err != nil {
			return "", err
		}
		return HealAndRejoin(ctx, c, n)
	}
}

// killNode kills n's VM (kill -9): a crash, as its peers and clients see
// it.
func killNode(n cluster.Node) func(context.Context, *cluster.Cluster) error {
	return func(_ context.Context, c *cluster.Cluster) error { return c.Kill(n) }
}

// restartNode undoes killNode: it boots n again and waits until three
// nodes run, so that the next cell meets a whole cluster.
func restartNode(n cluster.Node) func(context.Context, *cluster.Cluster) (string, error) {
	return func(ctx context.Context, c *cluster.Cluster) (string, error) {
		if err := c.Restart(ctx, n); err != nil {
			return "", err
		}
		return "", c.WaitRunning(ctx, 3)
	}
}

// stopApp stops RabbitMQ's app on n, its VM still up: clients get a
// connection.close, not a silence.
func stopApp(n cluster.Node) func(context.Context, *cluster.Cluster) error {
	return func(ctx context.Context, c *cluster.Cluster) error { return c.StopApp(ctx, n) }
}

// startApp undoes stopApp and waits until three nodes run.
func startApp(n cluster.Node) func(context.Context, *cluster.Cluster) (string, error) {
	return func(ctx context.Context, c *cluster.Cluster) (string, error) {
		if err := c.StartApp(ctx, n); err != nil {
			return "", err
		}
		return "", c.WaitRunning(ctx, 3)
	}
}

// cutNode cuts n off as how says (from its peers only, or from everyone).
func cutNode(n cluster.Node, how cluster.Cut) func(context.Context, *cluster.Cluster) error {
	return func(_ context.Context, c *cluster.Cluster) error { return c.Partition(n, how) }
}

// healNode undoes cutNode, and whatever partition the nodes still record
// after it (HealAndRejoin).
func healNode(n cluster.Node) func(context.Context, *cluster.Cluster) (string, error) {
	return func(ctx context.Context, c *cluster.Cluster) (string, error) {
		return HealAndRejoin(ctx, c, n)
	}
}

// pauseMinorityCut switches the cluster to pause_minority, then cuts n
// from its peers: n, alone, pauses itself once it notices.
func pauseMinorityCut(n cluster.Node) func(context.Context, *cluster.Cluster) error {
	return func(ctx context.Context, c *cluster.Cluster) error {
		if err := SetPartitionHandling(ctx, c, "pause_minority"); err != nil {
			return err
		}
		return c.Partition(n, cluster.CutPeers)
	}
}

// pauseMinorityHeal undoes pauseMinorityCut: the paused node resumes by
// itself once it sees its peers; then the cluster goes back to ignore,
// the suite's default.
func pauseMinorityHeal(n cluster.Node) func(context.Context, *cluster.Cluster) (string, error) {
	return func(ctx context.Context, c *cluster.Cluster) (string, error) {
		note, err := HealAndRejoin(ctx, c, n)
		if err != nil {
			return note, err
		}
		return note, SetPartitionHandling(ctx, c, "ignore")
	}
}

// HealAndRejoin undoes every cut, then makes the cluster whole again. In
// RabbitMQ's default `ignore` partition handling a healed partition stays
// recorded (each side keeps treating the other as down) until the app of a
// node on one side restarts. The node to restart is the one the others
// name most in their records (usually n, the node that was cut; but which
// side records what depends on who noticed first), and again until no
// record is left; the note says what was done. Then it waits for three
// running nodes.
func HealAndRejoin(ctx context.Context, c *cluster.Cluster, n cluster.Node) (note string,
	err error) {
	if err := c.Heal(); err != nil {
		return "", err
	}
	var notes []string
	for range len(cluster.Nodes) {
		// The nodes notice each other again within a tick or two; a
		// partition is recorded then, if at all.
		var parts map[string][]string
		WaitFor(ctx, 15*time.Second, func() bool {
			parts, err = Partitions(ctx, c)
			return err == nil && len(parts) > 0
		})
		if len(parts) == 0 {
			break
		}
		restart := loneNode(parts, n)
		notes = append(notes, fmt.Sprintf(
			"partition still recorded after the heal (%v): restarted %s's app", parts, restart))
		how, err := restartApp(ctx, c, restart)
		if how != "" {
			notes = append(notes, how)
		}
		if err != nil {
			return strings.Join(notes, "; "),
				fmt.Errorf("restarting %s after a recorded partition: %w", restart, err)
		}
	}
	return strings.Join(notes, "; "), c.WaitRunning(ctx, 3)
}

// appRestartBound bounds one stop_app/start_app pair. start_app can wait
// for mnesia's tables from peers that still hold the node's partition
// (rabbit retries that wait 10 × 30 s), which a clean CI run once spent
// its whole repair budget in; a healthy restart takes a few seconds.
const appRestartBound = 90 * time.Second

// restartApp restarts n's app (stop_app, start_app) within
// appRestartBound; past it, it kills n's VM and boots it again, which is
// what an operator does with a node whose app does not come back. The
// note says when it had to.
func restartApp(ctx context.Context, c *cluster.Cluster, n cluster.Node) (note string, err error) {
	actx, cancel := context.WithTimeout(ctx, appRestartBound)
	err = c.StopApp(actx, n)
	if err == nil {
		err = c.StartApp(actx, n)
	}
	cancel()
	if err == nil || ctx.Err() != nil {
		return "", err
	}
	note = fmt.Sprintf("%s's app did not restart within %v (%v): killed and booted its VM",
		n, appRestartBound, err)
	if kerr := c.Kill(n); kerr != nil {
		return note, errors.Join(err, kerr)
	}
	return note, c.Restart(ctx, n)
}

// loneNode picks the node to restart after a healed partition: the one
// that is on its own, by its records and by the others' (its own list's
// length plus how often the others name it; ties go to def). After a cut
// of b, a and c each record b, and b records both; but a node that
// noticed late can leave the records lopsided, naming another.
func loneNode(parts map[string][]string, def cluster.Node) cluster.Node {
	nodeOf := func(name string) (cluster.Node, bool) {
		for _, n := range cluster.Nodes {
			if strings.HasSuffix(name, "-"+string(n)) {
				return n, true
			}
		}
		return "", false
	}
	score := map[cluster.Node]int{}
	for self, names := range parts {
		if n, ok := nodeOf(self); ok {
			score[n] += len(names)
		}
		for _, name := range names {
			if n, ok := nodeOf(name); ok {
				score[n]++
			}
		}
	}
	best := def
	for _, n := range cluster.Nodes {
		if score[n] > score[best] {
			best = n
		}
	}
	return best
}

// SetPartitionHandling sets cluster_partition_handling on every node at
// run time (RabbitMQ reads it when a partition is detected), so that one
// cluster serves both `ignore` and `pause_minority` cells.
func SetPartitionHandling(ctx context.Context, c *cluster.Cluster, mode string) error {
	for _, n := range cluster.Nodes {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		set := fmt.Sprintf("application:set_env(rabbit, cluster_partition_handling, %s).", mode)
		_, err := c.Ctl(cctx, n, "eval", set)
		cancel()
		if err != nil {
			return fmt.Errorf("setting cluster_partition_handling %s on %s: %w", mode, n, err)
		}
	}
	return nil
}

// Partitions returns the partitions any running node reports, by node.
func Partitions(ctx context.Context, c *cluster.Cluster) (map[string][]string, error) {
	out := map[string][]string{}
	var lastErr error
	asked := 0
	for _, n := range cluster.Nodes {
		if !c.Running(ctx, n) {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		s, err := c.Ctl(cctx, n, "cluster_status", "--formatter", "json")
		cancel()
		if err != nil {
			lastErr = err
			continue
		}
		var st struct {
			Partitions map[string][]string `json:"partitions"`
		}
		if err := json.Unmarshal([]byte(s), &st); err != nil {
			lastErr = fmt.Errorf("cluster_status of %s: %w", n, err)
			continue
		}
		asked++
		for k, v := range st.Partitions {
			if len(v) > 0 {
				out[k] = v
			}
		}
	}
	if asked == 0 {
		if lastErr == nil {
			lastErr = errors.New("no node is running")
		}
		return nil, lastErr
	}
	return out, nil
}
