package nemesis

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster/clustertest"
	"github.com/amqp091-drainer/amqp091-drainer/internal/clusterfaults"
)

// Client faults go through their hooks, and their heal through what the
// hook returned; a missing hook, or a node fault without its nodes, is an
// error before anything is touched.
func TestApplyWithoutACluster(t *testing.T) {
	var log []string
	hooks := Hooks{CutClientLink: func(_ context.Context, client string) (func() error, error) {
		log = append(log, "cut "+client)
		return func() error { log = append(log, "restore "+client); return nil }, nil
	}}
	ctx := context.Background()
	heal, err := Apply(ctx, nil, Action{Kind: ClientLink, Client: "w1"}, hooks)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := heal(ctx); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(log, ", "); got != "cut w1, restore w1" {
		t.Fatalf("hook calls %q", got)
	}
	for _, a := range []Action{
		{Kind: FreezeClient, Client: "w1"},               // no hook
		{Kind: Kill},                                     // no node
		{Kind: Bridge, Nodes: []cluster.Node{cluster.A}}, // one end
		{Kind: "flood", Nodes: []cluster.Node{cluster.A}},
	} {
		if heal, err := Apply(ctx, nil, a, hooks); err == nil || heal != nil {
			t.Errorf("%v: heal %v, err %v; want an error and no heal", a, heal != nil, err)
		}
	}
}

// Each node fault, applied alone on a real cluster and healed: the three
// nodes run again and no partition stays recorded. Runs under make cluster
// (AMQP091_CLUSTER=full, as root with RabbitMQ installed).
func TestApplyEachNodeFaultAlone(t *testing.T) {
	if os.Getenv("AMQP091_CLUSTER") == "short" {
		// 2.5 minutes of CI's 45; the short seed applies faults too.
		t.Skip("AMQP091_CLUSTER=short: make cluster runs it")
	}
	c := sharedCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	for _, a := range []Action{
		{Kind: Kill, Nodes: []cluster.Node{cluster.B}},
		{Kind: StopApp, Nodes: []cluster.Node{cluster.B}},
		{Kind: Partition, Nodes: []cluster.Node{cluster.B}},
		{Kind: Bridge, Nodes: []cluster.Node{cluster.B, cluster.C}},
		{Kind: FreezeNode, Nodes: []cluster.Node{cluster.B}},
	} {
		t.Run(string(a.Kind), func(t *testing.T) {
			// Held past net_ticktime (5 s), so that the peers notice.
			a.Hold = 8 * time.Second
			start := time.Now()
			heal, err := Apply(ctx, c, a, Hooks{})
			if err != nil {
				t.Fatal(err)
			}
			hold(ctx, a.Hold)
			note, err := heal(ctx)
			if err != nil {
				t.Fatalf("heal: %v (%s)", err, note)
			}
			parts, err := clusterfaults.Partitions(ctx, c)
			if err != nil || len(parts) > 0 {
				t.Fatalf("after the heal: partitions %v, err %v", parts, err)
			}
			t.Logf("%v applied and healed in %v; %s", a, time.Since(start).Round(100*time.Millisecond), note)
		})
	}
}

// sharedCluster is the package's cluster, where the cluster suites run
// (AMQP091_CLUSTER set, as root with RabbitMQ installed).
func sharedCluster(t *testing.T) *cluster.Cluster {
	t.Helper()
	if os.Getenv("AMQP091_CLUSTER") == "" {
		t.Skip("AMQP091_CLUSTER is not set: the cluster suites run under make cluster and .ci/run")
	}
	return clustertest.Shared(t)
}
