package nemesis

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
)

// seedRun is a named schedule the cluster suite replays: the short seed
// CI runs, and every seed that ever failed (a regression schedule), with
// what it found.
type seedRun struct {
	name     string
	seed     uint64
	duration time.Duration
	meanGap  time.Duration
}

// seedRuns: the first is the short seed of .ci/run. A seed whose run
// lost a confirmed message, leaked or hung joins this list under a name
// that says what it found, after the fix, so that it never comes back.
var seedRuns = []seedRun{
	{name: "short", seed: 1, duration: 100 * time.Second, meanGap: 10 * time.Second},
}

// One seed's schedule against a workload per read mode, all at once:
// nothing confirmed is lost, no goroutine leaks and every workload
// confirms again after the last heal, in every mode.
func TestSeeds(t *testing.T) {
	c := sharedCluster(t)
	for _, sr := range seedRuns {
		t.Run(sr.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), sr.duration+10*time.Minute)
			defer cancel()
			res, err := Run(ctx, RunOptions{
				Cluster: c, Seed: sr.seed,
				Modes:   []compat.Mode{compat.Drainer, compat.LegacyAutoDrain, compat.Upstream},
				Options: Options{Duration: sr.duration, MeanGap: sr.meanGap, Heartbeat: 2 * time.Second},
				Workload: Workload{Publishers: 2, Consumers: 2, Rate: 50, Heartbeat: 2 * time.Second,
					HoldEvery: 2000, HoldFor: 5 * time.Second},
				Argv: []string{os.Args[0], "-test.run=^$"},
				Logf: t.Logf,
			})
			var report strings.Builder
			_ = WriteReport(&report, res, nil)
			t.Log("\n" + report.String())
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range res.Modes {
				if m.Report.Lost > 0 || m.Report.Leaked > 0 || m.Stuck != "" {
					t.Errorf("%s: %d confirmed messages lost, %d goroutines leaked, stuck: %q",
						m.Mode, m.Report.Lost, m.Report.Leaked, m.Stuck)
				}
			}
		})
	}
}
