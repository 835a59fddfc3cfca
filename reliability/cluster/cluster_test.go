package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster/clustertest"
	"github.com/amqp091-drainer/amqp091-drainer/internal/clusterfaults"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// EnvVar selects how much runs: short (each fault once) or full (three
// rounds). Unset skips the suite.
const EnvVar = "AMQP091_CLUSTER"

// rounds reads EnvVar; zero skips.
func rounds(t *testing.T) int {
	switch v := os.Getenv(EnvVar); v {
	case "":
		t.Skipf("%s is not set: the cluster suite runs under make cluster (full) and .ci/run (short)", EnvVar)
	case "short", "1":
		return 1
	case "full":
		return 3
	default:
		t.Fatalf("%s=%q: want short or full", EnvVar, v)
	}
	return 0
}

// netTicktime is the cluster's net_ticktime, in seconds.
const netTicktime = clustertest.NetTicktime

// startCluster returns the package's cluster, starting it on first use.
func startCluster(t *testing.T) *cluster.Cluster { return clustertest.Shared(t) }

// TestFaults runs every fault in every variant and checks the books. Each
// fault is a subtest named by its ID, so that one fault runs alone with
// -run 'TestFaults/5pmL$' (every round of it); the table and the failed
// checks come at the end, in the parent.
func TestFaults(t *testing.T) {
	n := rounds(t)
	c := startCluster(t)
	cfg := clusterfaults.Config{Cluster: c, NetTicktime: netTicktime * time.Second, Logf: t.Logf}
	faults := clusterfaults.Faults(12 * time.Second)
	var all []clusterfaults.Result
	var failures []string
	ran := map[string]bool{}
	for round := 1; round <= n; round++ {
		for _, f := range faults {
			// ID/round: -run 'TestFaults/5pmL$' matches every round.
			t.Run(fmt.Sprintf("%s/round%d", f.ID, round), func(t *testing.T) {
				ran[f.ID] = true
				ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
				res := clusterfaults.RunCell(ctx, cfg, f, round)
				cancel()
				all = append(all, res...)
				failures = append(failures, check(t, cfg, res)...)
			})
		}
	}
	var legend []clusterfaults.Fault
	for _, f := range faults {
		if ran[f.ID] {
			legend = append(legend, f)
		}
	}
	table := "Faults:\n\n" + clusterfaults.Legend(legend) + "\n" + clusterfaults.Table(cfg, all)
	t.Log("\n" + table)
	writeReport(t, table)
	// Again after the table, so that the end of a long log (all a CI
	// summary may keep) says which checks failed.
	for _, f := range failures {
		t.Errorf("%s", f)
	}
}

// check returns what the suite guarantees and res breaks, with generous
// bounds (the timing targets are the benchmark's), and logs each as it
// is found.
func check(t *testing.T, cfg clusterfaults.Config, res []clusterfaults.Result) (failures []string) {
	t.Helper()
	fail := func(format string, args ...any) {
		failures = append(failures, fmt.Sprintf(format, args...))
		t.Log("FAILED CHECK: " + failures[len(failures)-1])
	}
	for _, r := range res {
		cell := fmt.Sprintf("fault %s round %d %s", r.Fault.ID, r.Round, r.Variant.Name)
		if r.RepairNote != "" {
			t.Logf("%s: %s", cell, r.RepairNote)
		}
		if len(r.Errors) > 0 {
			t.Logf("%s: publish errors: %s", cell, strings.Join(r.Errors, "; "))
		}
		if r.Timeline != "" {
			t.Logf("%s: timeline: %s", cell, r.Timeline)
		}
		// The consumer is package failover's in every variant, upstream's
		// included (only the publisher is upstream's there): after a
		// fault that takes its node away it must consume again elsewhere.
		if r.Fault.ConsumerLost {
			if r.ConsumerResumed {
				t.Logf("%s: the consumer consumed again (%d basic.consume after the fault), first delivery %v after the injection began",
					cell, r.ConsumerReconnects, r.ConsumerResume.Round(time.Millisecond))
			} else {
				fail("%s: the consumer lost its node and handled no delivery on a new connection (%d basic.consume after the fault)",
					cell, r.ConsumerReconnects)
			}
		}
		if r.Variant.Baseline {
			// Upstream mode is measured and reported, not judged; a loss
			// there would still be news.
			if r.Lost > 0 {
				t.Logf("%s: upstream mode lost %d confirmed messages, e.g. %v", cell, r.Lost, r.LostIDs)
			}
			continue
		}
		if r.Err != nil {
			fail("%s: %v", cell, r.Err)
		}
		if r.Lost > 0 {
			fail("%s: %d confirmed messages neither consumed nor in the queue, e.g. %v", cell, r.Lost, r.LostIDs)
		}
		if r.Phantoms > 0 {
			fail("%s: %d messages found that were never published", cell, r.Phantoms)
		}
		if r.Confirmed == 0 {
			fail("%s: nothing confirmed", cell)
		}
		if !r.Resumed {
			fail("%s: publishing did not resume within %v of the fault", cell, 30*time.Second)
		}
		// Every publish call returns by its own deadline (30 s), give or
		// take scheduling.
		if r.Longest > 35*time.Second {
			fail("%s: a publish call took %v, past its 30 s deadline", cell, r.Longest)
		}
		if r.Fault.CloseDuring && r.Close > 2*time.Second+5*time.Second {
			fail("%s: Close during the cut took %v; CloseTimeout is 2 s", cell, r.Close)
		}
	}
	return failures
}

// writeReport leaves the table under .cache/cluster for docs/clusters.md.
func writeReport(t *testing.T, table string) {
	dir := filepath.Join("..", "..", ".cache", "cluster")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("report: %v", err)
		return
	}
	p := filepath.Join(dir, "faults.md")
	if err := os.WriteFile(p, []byte(table), 0o644); err != nil {
		t.Logf("report: %v", err)
		return
	}
	t.Logf("table written to %s", p)
}
