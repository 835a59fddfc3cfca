// Command chaos runs the nemesis (package internal/nemesis) on the
// project's three-node cluster: for each seed it boots a cluster, runs
// one workload process per read mode against the seed's schedule, heals
// everything, drains the queues and checks what each mode confirmed
// against what was consumed. make chaos runs it.
//
//	chaos [-duration 10m] [-seeds 1,2,3] [-modes drainer,legacy-autodrain,upstream] [-out .cache/chaos]
//
// It writes, per seed, REPORT.md (the schedule as drawn and as it ran,
// each mode's verdict and timeline), a PNG per mode, each mode's events
// (JSON lines) and both schedules (schedule.json), and a summary of every seed in out/REPORT.md. It
// exits 1 when a confirmed message was lost, a goroutine leaked or a
// workload did not confirm again after the last heal, so that its "no"
// means a regression; 3 when the machine cannot run a
// cluster (not root, no ip netns, no RabbitMQ install).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
	"github.com/amqp091-drainer/amqp091-drainer/internal/nemesis"
)

func main() {
	nemesis.MaybeRunWorkload() // a workload process exits here
	failed, err := run()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

type config struct {
	duration, heartbeat, holdFor, meanGap  time.Duration
	seeds                                  []uint64
	modes                                  []compat.Mode
	out                                    string
	rate, publishers, consumers, holdEvery int
}

func parse() (config, error) {
	var c config
	seeds := flag.String("seeds", "1", "comma-separated seeds, one run each")
	modes := flag.String("modes", "drainer,legacy-autodrain,upstream", "read modes, one workload process each, all at once")
	flag.DurationVar(&c.duration, "duration", 10*time.Minute, "how long each schedule injects faults")
	flag.DurationVar(&c.meanGap, "mean-gap", 15*time.Second, "mean time between two fault starts")
	flag.DurationVar(&c.heartbeat, "heartbeat", 2*time.Second, "the workloads' heartbeat (a frozen client is held 2.5 to 5 of them)")
	flag.StringVar(&c.out, "out", ".cache/chaos", "report directory")
	flag.IntVar(&c.rate, "rate", 50, "messages per second per publisher")
	flag.IntVar(&c.publishers, "publishers", 2, "publishers per workload")
	flag.IntVar(&c.consumers, "consumers", 2, "consumers per workload")
	flag.IntVar(&c.holdEvery, "hold-every", 2000, "a consumer holds every n-th delivery before its ack (0: none)")
	flag.DurationVar(&c.holdFor, "hold-for", 5*time.Second, "how long a held delivery is held")
	flag.Parse()
	for s := range strings.SplitSeq(*seeds, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return c, fmt.Errorf("seed %q: %w", s, err)
		}
		c.seeds = append(c.seeds, n)
	}
	for s := range strings.SplitSeq(*modes, ",") {
		m, err := compat.ParseMode(strings.TrimSpace(s))
		if err != nil {
			return c, err
		}
		c.modes = append(c.modes, m)
	}
	return c, nil
}

func run() (failed bool, err error) {
	cfg, err := parse()
	if err != nil {
		return false, err
	}
	if ok, reason := cluster.Usable(); !ok {
		fmt.Println("skipped:", reason)
		os.Exit(3)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var summary strings.Builder
	summary.WriteString("# Chaos\n\n| seed | mode | faults | confirmed | lost | duplicates | unconfirmed but delivered | stale | failed | leaked | peak RSS |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, seed := range cfg.seeds {
		res, err := runSeed(ctx, cfg, seed)
		if err != nil {
			return true, fmt.Errorf("seed %d: %w", seed, err)
		}
		for _, m := range res.Modes {
			r := m.Report
			failed = failed || r.Lost > 0 || r.Leaked > 0 || m.Stuck != ""
			fmt.Fprintf(&summary, "| [%d](seed-%d/REPORT.md) | %s | %d | %d | **%d** | %d | %d | %d | %d | %d | %.0f MiB |\n",
				seed, seed, m.Mode, len(res.Ran.Actions), r.Confirmed, r.Lost, r.Duplicates, r.UnconfirmedDelivered,
				r.Stale, len(r.Failed), r.Leaked, float64(r.PeakRSSKiB)/1024)
		}
		if err := os.WriteFile(filepath.Join(cfg.out, "REPORT.md"), []byte(summary.String()), 0o644); err != nil {
			return true, err
		}
	}
	fmt.Print(summary.String())
	return failed, nil
}

// runSeed boots a cluster, runs seed on it and writes its report.
func runSeed(ctx context.Context, cfg config, seed uint64) (nemesis.RunResult, error) {
	start := time.Now()
	c, err := cluster.Start(ctx, cluster.Options{PartitionHandling: "ignore", NetTicktime: 5})
	if err != nil {
		return nemesis.RunResult{}, err
	}
	fmt.Printf("seed %d: cluster up in %v\n", seed, time.Since(start).Round(time.Second))
	res, err := nemesis.Run(ctx, nemesis.RunOptions{
		Cluster: c, Seed: seed, Modes: cfg.modes,
		Options: nemesis.Options{Duration: cfg.duration, MeanGap: cfg.meanGap, Heartbeat: cfg.heartbeat},
		Workload: nemesis.Workload{Publishers: cfg.publishers, Consumers: cfg.consumers, Rate: cfg.rate,
			Heartbeat: cfg.heartbeat, HoldEvery: cfg.holdEvery, HoldFor: cfg.holdFor},
		Logf: func(format string, args ...any) { fmt.Printf(format+"\n", args...) },
	})
	err = errors.Join(err, c.Stop())
	if werr := writeSeed(cfg.out, res); werr != nil {
		err = errors.Join(err, werr)
	}
	return res, err
}

// writeSeed writes seed's report, charts and events under out/seed-N.
func writeSeed(out string, res nemesis.RunResult) error {
	dir := filepath.Join(out, fmt.Sprintf("seed-%d", res.Planned.Seed))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	charts := map[string]string{}
	for _, m := range res.Modes {
		name := m.Mode.String()
		if err := nemesis.Timeline(m, res.Ran.For(name), filepath.Join(dir, name+".png")); err != nil {
			return err
		}
		charts[name] = name + ".png"
		if err := os.WriteFile(filepath.Join(dir, name+".events.jsonl"), m.Events, 0o644); err != nil {
			return err
		}
	}
	sched, err := json.MarshalIndent(struct {
		Start        time.Time
		Planned, Ran nemesis.Schedule
	}{res.Start, res.Planned, res.Ran}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "schedule.json"), sched, 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "REPORT.md"))
	if err != nil {
		return err
	}
	if err := nemesis.WriteReport(f, res, charts); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
