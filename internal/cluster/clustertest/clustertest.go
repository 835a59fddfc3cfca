// Package clustertest gives a test binary one three-node cluster
// (package cluster), shared by its tests: booting three nodes costs half a
// minute, and only one cluster may exist on a machine at a time.
package clustertest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

// NetTicktime is the shared cluster's net_ticktime, in seconds: short,
// so that a cut is noticed (and a healed partition recorded) within a
// fault's hold.
const NetTicktime = 5

var shared struct {
	once sync.Once
	c    *cluster.Cluster
	err  error
}

// Shared returns the test binary's cluster, in RabbitMQ's default
// partition handling (ignore), starting it on first use; it stops when
// the binary exits, which needs testenv.Main as the package's TestMain.
// It skips the test where this machine cannot run a cluster.
func Shared(t *testing.T) *cluster.Cluster {
	t.Helper()
	if ok, reason := cluster.Usable(); !ok {
		t.Skip("skipped: " + reason)
	}
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		t0 := time.Now()
		shared.c, shared.err = cluster.Start(ctx, cluster.Options{PartitionHandling: "ignore", NetTicktime: NetTicktime})
		if shared.err != nil {
			return
		}
		t.Logf("cluster of three up in %v", time.Since(t0).Round(100*time.Millisecond))
		c := shared.c
		if err := testenv.AtExit(func() {
			if err := c.Stop(); err != nil {
				fmt.Fprintf(os.Stderr, "stopping the cluster: %v\n", err)
			}
		}); err != nil {
			_ = c.Stop()
			shared.err = err
		}
	})
	if shared.err != nil {
		t.Fatalf("starting the cluster: %v", shared.err)
	}
	return shared.c
}
