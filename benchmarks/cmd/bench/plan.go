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
	reps     int // of this case, for the progress lines
	messages int // benchscenario -n; 0 for the scenario's own count
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
	// messages is the message count each scenario was given (-n or the
	// plan's), where it was given one.
	messages map[string]int
}

func (p plan) count() int {
	n := 0
	for _, g := range p.groups {
		n += len(g)
	}
	return n
}

// variantsOf returns the variants the plan runs the named scenario's case
// in, in the order of their first run.
func (p plan) variantsOf(scenarioName, c string) []string {
	var vs []string
	for _, g := range p.groups {
		for _, m := range g {
			if m.scenario.Name == scenarioName && m.c == c && !slices.Contains(vs, m.variant.Name) {
				vs = append(vs, m.variant.Name)
			}
		}
	}
	return vs
}

// listScenarios asks the patched build which scenarios it has.
func listScenarios(bins binaries) ([]listing, error) {
	out, err := exec.Command(bins.patched, "-list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s -list: %w", bins.patched, err)
	}
	var all []listing
	if err := json.Unmarshal(out, &all); err != nil {
		return nil, err
	}
	return all, nil
}

// makePlan lays out the measurements of the listed scenarios that cfg
// selects; withCClient says whether the C client's drain was built.
func makePlan(cfg config, all []listing, withCClient bool) (plan, error) {
	p := plan{messages: map[string]int{}}
	for _, s := range all {
		if cfg.scenarios != "" && !contains(strings.Split(cfg.scenarios, ","), s.Name) {
			continue
		}
		s.Cases = cfg.casesFor(s.Name, s.Cases)
		if len(s.Cases) == 0 {
			return p, fmt.Errorf("%s: the plan names none of its cases", s.Name)
		}
		p.scenarios = append(p.scenarios, s)
		n := cfg.messagesFor(s.Name)
		if n > 0 && !s.Counted {
			if _, planned := cfg.sizes[s.Name]; planned {
				return p, fmt.Errorf("%s: the plan gives it a message count, which it does not take", s.Name)
			}
			n = 0 // -n is for the scenarios that take one
		}
		if n > 0 {
			p.messages[s.Name] = n
		}
		reps := cfg.reps
		if s.Reps > 0 && !cfg.quick {
			reps = s.Reps
		}
		if s.QuickReps > 0 && cfg.quick {
			reps = s.QuickReps
		}
		if r, ok := cfg.scenarioReps[s.Name]; ok {
			reps = r
		}
		variants := variantsFor(s.Modes, cfg.variants, cfg.baseline != "", cfg.coalesce)
		if !withCClient {
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
					m := measurement{scenario: s, c: c, variant: v, rep: rep, reps: reps, messages: n}
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
	artefacts string // the directory runs save artefacts in; empty for none
	// prior is, by scenario, case and variant, how long a run took in
	// the last run of this plan (results.json), for the first estimates.
	prior map[string]time.Duration
}

// execute runs the plan's groups in order, logging each as it starts,
// with the time spent and an estimate of the time left, and as it ends.
func (p plan) execute(ctx context.Context, r runner) []run {
	var runs []run
	prog := newProgress(p.count(), r.prior)
	for gi, g := range p.groups {
		logf("%s", prog.line(p.groups[gi:]))
		started := time.Now()
		results := make([]run, len(g))
		var wg sync.WaitGroup
		for i, m := range g {
			wg.Go(func() { results[i] = run{m, r.measure(ctx, m)} })
		}
		wg.Wait()
		prog.record(g, time.Since(started))
		for i, res := range results {
			status := fmt.Sprintf("%.1fs", res.out.Seconds)
			if res.out.Error != "" {
				status = "ERROR: " + res.out.Error
			}
			logf("[%d/%d] %s: %s", prog.done-len(g)+i+1, prog.total,
				joinNonEmpty(res.scenario.Name, res.c, res.variant.Name, fmt.Sprintf("rep %d/%d", res.rep+1, res.reps)), status)
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
	if m.messages > 0 {
		args = append(args, "-n", strconv.Itoa(m.messages))
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
