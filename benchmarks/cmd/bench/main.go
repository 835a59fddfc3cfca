// Command bench is the A/B benchmark runner behind `make bench`.
//
// It builds the scenario program (benchmarks/cmd/benchscenario) twice, once
// against pristine upstream amqp091-go (go.upstream.mod, build tag
// "pristine") and once against the patched tree, starts a Toxiproxy
// server as a process of its own, and runs every scenario's cases in four
// variants: the pristine build, and the patched build in upstream, legacy
// and drainer modes. Each measurement is a fresh process. Repetitions are
// interleaved (variant 1..4, then 2..4 and 1, ...) so that the machine's
// drift, and going first, are shared rather than charged to one variant.
//
// It writes the raw results as JSON, BENCHMARKS.md with the tables, ratios
// and targets beside the reference figures, and PNG charts. With -ab it
// instead compares the pristine build with the patched build in one mode,
// through benchstat.
//
// -plan picks a named selection of the suite (plans.go): full, the
// default, runs everything and writes BENCHMARKS.md; quick, what `make
// bench` runs, the headline scenarios in 5-6 minutes, with its report
// under .cache/bench/quick. -dry-run prints what a run would measure.
//
//	go run ./benchmarks/cmd/bench                       # everything, 3 reps
//	go run ./benchmarks/cmd/bench -plan quick           # the headline scenarios
//	go run ./benchmarks/cmd/bench -plan quick -dry-run  # what it would run
//	go run ./benchmarks/cmd/bench -scenarios throughput -reps 5
//	go run ./benchmarks/cmd/bench -ab -mode drainer -scenarios stalled-consumer,throughput
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/readmode"
	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/scenario"
	"github.com/amqp091-drainer/amqp091-drainer/internal/toxi"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.plan, "plan", "full", "the named plan to run, "+planNames()+": full is every scenario and section, writing BENCHMARKS.md; "+
		"quick the headline scenarios, pristine against legacy and drainer (go-floor in the drain), writing .cache/bench/quick/BENCHMARKS.md; the flags below override its choices")
	flag.BoolVar(&cfg.dryRun, "dry-run", false, "print what the plan would measure, and where it would write, and exit: no build, no broker")
	flag.IntVar(&cfg.reps, "reps", 3, "repetitions of each measurement (scenarios that fix their own count keep it); default: the plan's")
	flag.StringVar(&cfg.scenarios, "scenarios", "", "comma-separated scenarios to run, with the sections failover and overhead; empty means all; default: the plan's")
	flag.StringVar(&cfg.variants, "variants", "", "comma-separated variants (pristine,upstream,legacy,drainer); empty means all; default: the plan's")
	flag.BoolVar(&cfg.quick, "quick", false, "smoke-test sizes: checks the suite runs, measures nothing worth quoting")
	flag.IntVar(&cfg.messages, "n", 0, "message count for the scenarios that take one (drain, roundtrip); 0 means each one's default, or the plan's")
	flag.StringVar(&cfg.report, "report", "BENCHMARKS.md", "the Markdown report to write; default: the plan's")
	flag.StringVar(&cfg.results, "results", "benchmarks/results", "directory for the raw JSON and the charts; default: the plan's")
	flag.BoolVar(&cfg.ab, "ab", false, "compare the pristine build with the patched build in -mode through benchstat, instead of writing the report")
	flag.StringVar(&cfg.abMode, "mode", "drainer", "with -ab: the patched build's read mode")
	flag.StringVar(&cfg.baseline, "baseline", "", "a benchscenario binary built from an earlier commit (scripts/bench-baseline REV prints one): each patched variant also runs in it, as <variant>-old, alternated with this build's")
	flag.BoolVar(&cfg.coalesce, "coalesce", false, "also run the drainer and legacy variants with CoalescePublishes on, as drainer-coalesce and legacy-coalesce")
	flag.BoolVar(&cfg.render, "render", false, "measure nothing: rewrite the report and the charts from -results' results.json (after a change to the report's code)")
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	cfg.command = commandLine(cfg.plan, set, os.Args[1:])
	var err error
	if cfg, err = applyPlan(cfg, set); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	run := runSuite
	switch {
	case cfg.render:
		run = func(_ context.Context, cfg config) error { return render(cfg) }
	case cfg.dryRun:
		run = func(_ context.Context, cfg config) error { return dryRun(cfg) }
	}
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// config is the command line, with the plan's choices filled in.
type config struct {
	plan            string
	command         string // what the report says generated it
	dryRun          bool
	reps            int
	scenarios       string
	variants        string
	quick           bool
	messages        int
	report, results string
	ab              bool
	abMode          string
	render          bool
	baseline        string
	coalesce        bool
	// cases and sizes are the plan's, by scenario: the cases it runs
	// (all when absent) and its message count (-n) where it sets one.
	cases map[string][]string
	sizes map[string]int
	// scenarioReps are the plan's repetitions of a scenario, where they
	// are not cfg.reps.
	scenarioReps map[string]int
}

func runSuite(ctx context.Context, cfg config) error {
	if _, err := os.Stat("go.upstream.mod"); err != nil {
		return errors.New("run from the repository root (where go.upstream.mod is); `make bench` does")
	}
	start := time.Now()
	bins, err := buildBinaries(ctx)
	bins.baseline = cfg.baseline
	if err != nil {
		return err
	}
	env, err := describeEnvironment()
	if err != nil {
		return err
	}
	logf("broker RabbitMQ %s at %s; %d CPUs; %s", env.Broker, redact(env.BrokerURL), env.CPUs, env.GoVersion)

	toxURL := os.Getenv("TOXIPROXY_URL")
	if toxURL == "" {
		u, stopToxi, err := toxi.StartServer()
		if err != nil {
			return fmt.Errorf("start Toxiproxy: %w", err)
		}
		defer stopToxi()
		toxURL = u
	}
	defer sweep(env.BrokerURL, toxURL)

	// The failover scenario needs a cluster of its own and runs after the
	// per-process scenarios (failover.go).
	var (
		plan plan
		runs []run
	)
	if planCfg, others := withoutSections(cfg); others {
		all, err := listScenarios(bins)
		if err != nil {
			return err
		}
		if plan, err = makePlan(planCfg, all, bins.cclient != ""); err != nil {
			return err
		}
		logf("plan %s: %d measurements", cfg.plan, plan.count())
		r := runner{bins: bins, toxiproxy: toxURL, brokerURL: env.BrokerURL, quick: cfg.quick,
			prior: priorDurations(cfg.results, cfg.quick, plan.messages)}
		if !cfg.ab {
			// Runs save their artefacts (CPU profiles) beside the results.
			if err := os.MkdirAll(cfg.results, 0o755); err != nil {
				return err
			}
			r.artefacts = cfg.results
		}
		runs = plan.execute(ctx, r)
	}
	env.Seconds = time.Since(start).Seconds()
	env.Reps, env.Quick, env.Plan, env.Command = cfg.reps, cfg.quick, cfg.plan, cfg.command

	if cfg.ab {
		return abCompare(ctx, cfg, runs)
	}
	if err := os.MkdirAll(cfg.results, 0o755); err != nil {
		return err
	}
	suite := assemble(env, plan, runs)
	for _, sr := range suite.Scenarios {
		for _, cr := range sr.Cases {
			if t := timelineSummary(sr, cr); t != "" {
				logf("%s %s:\n%s", sr.Name, cr.Case, t)
			}
		}
	}
	if microWanted(cfg) {
		logf("micro-benchmarks (benchmarks/micro), both builds")
		if suite.Micro, err = runMicro(ctx, cfg.quick); err != nil {
			return err
		}
	}
	if sectionWanted(cfg, failoverScenario) {
		suite.Failover = runFailover(ctx, cfg)
		if suite.Failover.Skipped != "" {
			logf("failover: skipped: %s", suite.Failover.Skipped)
		}
	}
	if sectionWanted(cfg, overheadScenario) {
		suite.Overhead = runOverhead(ctx, env.BrokerURL, cfg.quick)
	}
	suite.Env.TotalSeconds = time.Since(start).Seconds()
	if err := writeJSON(filepath.Join(cfg.results, "results.json"), suite); err != nil {
		return err
	}
	charts, err := drawCharts(suite, cfg.results)
	if err != nil {
		return fmt.Errorf("charts: %w", err)
	}
	if err := writeReport(cfg.report, suite, charts, cfg.results); err != nil {
		return err
	}
	logf("wrote %s/results.json and %d charts in %s", cfg.results, len(charts), time.Since(start).Round(time.Second))
	logf("report: %s", cfg.report)
	return errOverhead(suite.Overhead)
}

// dryRun prints what runSuite would measure, from the runner's own list
// of the scenarios, building and measuring nothing. The C client's drain
// is listed as if it built.
func dryRun(cfg config) error {
	planCfg, others := withoutSections(cfg)
	var p plan
	if others {
		var err error
		if p, err = makePlan(planCfg, registryListing(), true); err != nil {
			return err
		}
	}
	printPlan(os.Stdout, cfg, p)
	return nil
}

// binaries are the builds of the scenario program: pristine, patched, and
// optionally a patched build of an earlier commit (-baseline); and the C
// client's drain (benchmarks/cclient), empty where it cannot be built.
type binaries struct{ pristine, patched, baseline, cclient string }

// buildBinaries compiles the scenario program against both trees.
func buildBinaries(ctx context.Context) (binaries, error) {
	dir := filepath.Join(".cache", "bench")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return binaries{}, err
	}
	b := binaries{pristine: filepath.Join(dir, "benchscenario-pristine"), patched: filepath.Join(dir, "benchscenario-patched")}
	builds := [][]string{
		{"build", "-modfile=go.upstream.mod", "-tags", "pristine", "-o", b.pristine, "./benchmarks/cmd/benchscenario"},
		{"build", "-o", b.patched, "./benchmarks/cmd/benchscenario"},
	}
	for i, args := range builds {
		cmd := exec.CommandContext(ctx, "go", args...)
		if i == 0 {
			// -modfile and workspaces exclude each other: the pristine
			// build is the root module alone, with go.upstream.mod.
			cmd.Env = append(os.Environ(), "GOWORK=off")
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			return b, fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	b.cclient = buildCClient(ctx, filepath.Join(dir, "cclient-drain"))
	return b, nil
}

// buildCClient compiles the C client's drain, the drain scenario's C
// reference, and returns its path, or "" when the machine lacks a C
// compiler or librabbitmq's headers (Debian: librabbitmq-dev): the
// c-client variant is then left out, said once, and nothing else changes.
func buildCClient(ctx context.Context, out string) string {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	args := []string{"-O2", "-Wall", "-o", out, filepath.Join("benchmarks", "cclient", "drain.c"), "-lrabbitmq"}
	if msg, err := exec.CommandContext(ctx, cc, args...).CombinedOutput(); err != nil {
		first, _, _ := strings.Cut(strings.TrimSpace(string(msg)), "\n")
		logf("%s variant left out: %s %s: %v (%s); it needs librabbitmq's headers (Debian: apt-get install librabbitmq-dev)",
			scenario.CClient, cc, strings.Join(args, " "), err, first)
		return ""
	}
	return out
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

// variantsFor returns the variants a scenario runs in, filtered by
// -variants; with baseline, each patched variant is followed by its run in
// the baseline build (<name>-old), and with coalesce, each drainer and
// legacy variant by its run with CoalescePublishes (<name>-coalesce).
func variantsFor(modes []string, filter string, baseline, coalesce bool) []scenario.Variant {
	var out []scenario.Variant
	for _, v := range scenario.Variants {
		if filter != "" && !contains(strings.Split(filter, ","), v.Name) {
			continue
		}
		if (len(modes) > 0 || v.Reference || v.OptIn) && !contains(modes, v.Mode) {
			continue
		}
		out = append(out, v)
		if baseline && v.Build == "patched" && !v.OptIn { // an earlier build may not have the option
			out = append(out, scenario.Variant{Name: v.Name + "-old", Build: "baseline", Mode: v.Mode})
		}
		if coalesce && v.Build == "patched" && v.Mode != "upstream" {
			out = append(out, scenario.Variant{Name: v.Name + "-coalesce", Build: "patched", Mode: v.Mode,
				Env: []string{readmode.CoalesceEnv + "=1"}})
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if strings.TrimSpace(x) == s {
			return true
		}
	}
	return false
}

// render rewrites the report and the charts from a results.json that an
// earlier run wrote, linking each scenario to its spec by name again.
func render(cfg config) error {
	path := filepath.Join(cfg.results, "results.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var s suite
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for i := range s.Scenarios {
		spec, err := scenario.Lookup(s.Scenarios[i].Name)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		s.Scenarios[i].spec = spec
	}
	charts, err := drawCharts(s, cfg.results)
	if err != nil {
		return fmt.Errorf("charts: %w", err)
	}
	if err := writeReport(cfg.report, s, charts, cfg.results); err != nil {
		return err
	}
	logf("rendered %s and %d charts from %s", cfg.report, len(charts), path)
	return nil
}
