package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/scenario"
)

// listing and output are what benchscenario prints.
type (
	listing = scenario.Listing
	output  = scenario.Output
)

// A measurement is one process to start.
type measurement struct {
	scenario listing
	c        string
	variant  scenario.Variant
	rep      int
}

// A run is a measurement and what it printed.
type run struct {
	measurement
	out output
}

// A plan is the measurements of a suite, grouped so that a group's
// members may run at once (Concurrent scenarios) or one after another.
type plan struct {
	scenarios []listing
	groups    [][]measurement
}

func (p plan) count() int {
	n := 0
	for _, g := range p.groups {
		n += len(g)
	}
	return n
}

// makePlan lists the scenarios and lays out their measurements.
func makePlan(cfg config, bins binaries) (plan, error) {
	out, err := exec.Command(bins.patched, "-list").Output()
	if err != nil {
		return plan{}, fmt.Errorf("%s -list: %w", bins.patched, err)
	}
	var all []listing
	if err := json.Unmarshal(out, &all); err != nil {
		return plan{}, err
	}
	var p plan
	for _, s := range all {
		if cfg.scenarios != "" && !contains(strings.Split(cfg.scenarios, ","), s.Name) {
			continue
		}
		p.scenarios = append(p.scenarios, s)
		reps := cfg.reps
		if s.Reps > 0 && !cfg.quick {
			reps = s.Reps
		}
		if s.QuickReps > 0 && cfg.quick {
			reps = s.QuickReps
		}
		variants := variantsFor(s.Modes, cfg.variants, cfg.baseline != "", cfg.coalesce)
		if bins.cclient == "" {
			variants = slices.DeleteFunc(variants, func(v scenario.Variant) bool { return v.Name == scenario.CClient })
		}
		if cfg.ab {
			variants = abVariants(variants, cfg.abMode)
		}
		for _, c := range s.Cases {
			variants := variants
			if s.ReferenceCase != "" && c != s.ReferenceCase {
				variants = slices.DeleteFunc(slices.Clone(variants), func(v scenario.Variant) bool { return v.Reference })
			}
			var group []measurement
			for rep := range reps {
				// Each repetition starts with another variant, so that
				// going first (a cold broker, the last run's queues still
				// being deleted) is not always the same variant's lot.
				for i := range variants {
					v := variants[(i+rep)%len(variants)]
					m := measurement{scenario: s, c: c, variant: v, rep: rep}
					if s.Concurrent {
						group = append(group, m)
					} else {
						p.groups = append(p.groups, []measurement{m})
					}
				}
			}
			if len(group) > 0 {
				p.groups = append(p.groups, group)
			}
		}
	}
	if len(p.scenarios) == 0 {
		return p, fmt.Errorf("no scenario matches -scenarios=%q", cfg.scenarios)
	}
	return p, nil
}

// A runner starts measurements.
type runner struct {
	bins      binaries
	toxiproxy string
	brokerURL string
	quick     bool
	messages  int    // -n, passed on when set
	artefacts string // the directory runs save artefacts in; empty for none
}

// execute runs the plan's groups in order.
func (p plan) execute(ctx context.Context, r runner) []run {
	var runs []run
	done, total := 0, p.count()
	for _, g := range p.groups {
		results := make([]run, len(g))
		var wg sync.WaitGroup
		for i, m := range g {
			wg.Go(func() { results[i] = run{m, r.measure(ctx, m)} })
		}
		wg.Wait()
		for _, res := range results {
			done++
			status := fmt.Sprintf("%.1fs", res.out.Seconds)
			if res.out.Error != "" {
				status = "ERROR: " + res.out.Error
			}
			logf("[%d/%d] %s %s %s rep %d: %s", done, total, res.scenario.Name, res.c, res.variant.Name, res.rep+1, status)
		}
		runs = append(runs, results...)
		if ctx.Err() != nil {
			break
		}
	}
	return runs
}

// measure starts one process and reads its output. The process bounds
// itself; the runner kills it only if it overruns that bound too.
func (r runner) measure(ctx context.Context, m measurement) output {
	bin := r.bins.patched
	switch m.variant.Build {
	case "pristine":
		bin = r.bins.pristine
	case "baseline":
		bin = r.bins.baseline
	}
	args := []string{"-scenario", m.scenario.Name, "-case", m.c, "-mode", m.variant.Mode}
	if r.quick {
		args = append(args, "-quick")
	}
	if r.messages > 0 {
		args = append(args, "-n", strconv.Itoa(r.messages))
	}
	if r.artefacts != "" {
		// Named as the charts are, with the variant and repetition: a
		// run's artefacts are its own.
		args = append(args, "-artefacts", filepath.Join(r.artefacts,
			fileName(m.scenario.Name, m.c, m.variant.Name, fmt.Sprintf("rep%d", m.rep+1))))
	}
	ctx, cancel := context.WithTimeout(ctx, m.scenario.Timeout+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "TOXIPROXY_URL="+r.toxiproxy, "AMQP_URL="+r.brokerURL)
	cmd.Env = append(cmd.Env, m.variant.Env...)
	if m.variant.Name == scenario.CClient {
		cmd.Env = append(cmd.Env, scenario.CClientEnv+"="+r.bins.cclient)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var out output
	if jerr := json.Unmarshal(stdout.Bytes(), &out); jerr != nil {
		out = output{Scenario: m.scenario.Name, Case: m.c, Build: m.variant.Build, Mode: m.variant.Mode,
			Error: fmt.Sprintf("no result (%v): %s", err, lastLine(stderr.String()))}
	}
	return out
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
