package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/hist"
	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/scenario"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBenchName(t *testing.T) {
	for in, want := range map[[2]string]string{
		{"stalled-consumer", ""}:           "BenchmarkStalledConsumer",
		{"throughput", "publishers=10"}:    "BenchmarkThroughput/publishers=10",
		{"allocations", "pubsub size=512"}: "BenchmarkAllocations/pubsub_size=512",
	} {
		if got := benchName(in[0], in[1]); got != want {
			t.Errorf("benchName(%q, %q) = %q, want %q", in[0], in[1], got, want)
		}
	}
}

func TestVariantFilters(t *testing.T) {
	names := func(vs []scenario.Variant) (out []string) {
		for _, v := range vs {
			out = append(out, v.Name)
		}
		return out
	}
	if got := names(variantsFor(nil, "", false, false)); len(got) != 4 {
		t.Errorf("all variants: %v", got)
	}
	if got := names(variantsFor([]string{"drainer", "upstream"}, "", false, false)); len(got) != 3 || got[2] != "drainer" {
		t.Errorf("modes drainer+upstream: %v, want pristine, upstream, drainer", got)
	}
	if got := names(variantsFor(nil, "legacy,drainer", false, false)); len(got) != 2 {
		t.Errorf("-variants legacy,drainer: %v", got)
	}
	if got := names(variantsFor(nil, "drainer,pristine", true, false)); fmt.Sprint(got) != "[pristine drainer drainer-old]" {
		t.Errorf("with a baseline: %v, want [pristine drainer drainer-old]", got)
	}
	if got := names(abVariants(scenario.Variants, "legacy")); len(got) != 2 || got[0] != "pristine" || got[1] != "legacy" {
		t.Errorf("ab legacy: %v", got)
	}
	// The references run only where a scenario names them, and no
	// -variants filter that leaves them out brings them back.
	withRefs := []string{"upstream", "drainer", scenario.GoFloor, scenario.CClient}
	if got := names(variantsFor(withRefs, "", false, false)); fmt.Sprint(got) != "[pristine upstream drainer go-floor c-client]" {
		t.Errorf("a scenario naming the references: %v", got)
	}
	if got := names(variantsFor(withRefs, "pristine,drainer", true, false)); fmt.Sprint(got) != "[pristine drainer drainer-old]" {
		t.Errorf("references filtered out: %v", got)
	}
	// The drain names every reference, issue #40's blocking floors too,
	// and -variants picks among them.
	drain, err := scenario.Lookup("drain")
	if err != nil {
		t.Fatal(err)
	}
	const drainRefs = "[go-floor c-client go-floor-blocking go-floor-rawsyscall]"
	got := names(variantsFor(drain.Modes, "", false, false))
	if len(got) < 5 || fmt.Sprint(got[:5]) != "[pristine upstream legacy drainer drainer-blocking]" ||
		fmt.Sprint(got[5:]) != drainRefs {
		t.Errorf("the drain's variants: %v, want the five amqp091-go ones, then %s", got, drainRefs)
	}
	// An opt-in variant runs only where a scenario names it.
	if got := names(variantsFor(nil, "", false, false)); slices.Contains(got, scenario.DrainerBlocking) {
		t.Errorf("a scenario that names no mode runs %v", got)
	}
	got = names(variantsFor(drain.Modes, "go-floor,go-floor-blocking", false, false))
	if fmt.Sprint(got) != "[go-floor go-floor-blocking]" {
		t.Errorf("-variants go-floor,go-floor-blocking in the drain: %v", got)
	}
}

func TestFormatStat(t *testing.T) {
	if got := formatStat(scenario.Stat{}, false, 1); got != "—" {
		t.Errorf("unmeasured: %q", got)
	}
	if got := formatStat(scenario.Stat{Min: 1, Median: 2, Max: 3, N: 3}, true, 1); got != "2.0 (1.0–3.0)" {
		t.Errorf("spread: %q", got)
	}
	if got := formatStat(scenario.Stat{Min: 2, Median: 2, Max: 2, N: 3}, true, 0); got != "2" {
		t.Errorf("agreeing reps: %q", got)
	}
}

func TestFileName(t *testing.T) {
	if got := fileName("allocations", "pubsub size=512", "publish"); got != "allocations_pubsub-size-512_publish" {
		t.Errorf("fileName = %q", got)
	}
}

func TestSplitMode(t *testing.T) {
	if n, m := splitMode("Publish/size=4/mode=drainer-2"); n != "Publish/size=4" || m != "drainer" {
		t.Errorf("splitMode = %q, %q", n, m)
	}
	if sortKey("Deliver/size=43") >= sortKey("Deliver/size=512") {
		t.Error("size=43 must sort before size=512")
	}
}

// The 5pmL section judges the client's share after the broker's last
// nack, from the repetitions that had nacks.
func TestWriteFailoverClientShare(t *testing.T) {
	sum := func(p50, max float64, n int64) hist.Summary { return hist.Summary{N: n, P50: p50, Max: max} }
	f := &failoverResult{
		Reps:       3,
		Faults:     map[string]string{"5pmL": "the leader's node cut"},
		Targets:    map[string]time.Duration{"5pmL": 7750 * time.Millisecond},
		Resume:     map[string]map[string]hist.Summary{"5pmL": {"upstream": sum(32000, 32100, 3), "drainer": sum(8100, 11100, 3), "legacy": sum(8000, 11100, 3)}},
		Gap:        map[string]map[string]hist.Summary{"5pmL": {"upstream": sum(32000, 32000, 3), "drainer": sum(8100, 11100, 3), "legacy": sum(8000, 11100, 3)}},
		AfterNack:  map[string]map[string]hist.Summary{"5pmL": {"drainer": sum(550, 565, 3), "legacy": sum(510, 1200, 2)}},
		NotResumed: map[string]map[string]int{"5pmL": {}},
		Lost:       map[string]map[string]int{"5pmL": {}},
	}
	var b strings.Builder
	writeFailover(func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }, f)
	for _, want := range []string{
		"- drainer resumed 550 ms (P50) / 565 ms (max) after the broker's last nack; target, within 1s in every repetition with nacks (3 of 3): **met**",
		"- legacy resumed 510 ms (P50) / 1200 ms (max) after the broker's last nack; target, within 1s in every repetition with nacks (2 of 3): **not met**",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the section lacks %q:\n%s", want, b.String())
		}
	}
}

// The Observer-overhead section is kept in results.json, so that -render,
// which writes the report again from it, keeps the section that the run
// wrote: it is not appended to the report by anything else.
func TestRenderKeepsOverhead(t *testing.T) {
	dir := t.TempDir()
	spec, err := scenario.Lookup("stalled-consumer")
	if err != nil {
		t.Fatal(err)
	}
	const section = "\n## Observer overhead\n\nGenerated by `go run ./cmd/overhead -n 2000 -rounds 1 -size 64 -markdown`.\n\n" +
		"### Publish\n\n| variant | msg/s P50 |\n|---|---:|\n| none | 86893 |\n"
	s := suite{
		Env: environment{Reps: 1, Plan: "full"},
		Scenarios: []scenarioResult{{Name: spec.Name, Title: spec.Title, About: spec.About, spec: spec,
			Cases: []caseResult{{Variants: []string{"pristine"}, Agg: scenario.Agg{}}}}},
		Overhead: &overheadResult{Command: "(cd otelamqp && GOWORK=off go run ./cmd/overhead -markdown)", Markdown: section},
	}
	measured := filepath.Join(dir, "measured.md")
	if err := writeReport(measured, s, nil, dir); err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(filepath.Join(dir, "results.json"), s); err != nil {
		t.Fatal(err)
	}
	rendered := filepath.Join(dir, "rendered.md")
	if err := render(config{report: rendered, results: dir}); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{measured, rendered} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		report := string(b)
		if n := strings.Count(report, "## Observer overhead"); n != 1 {
			t.Errorf("%s: %d Observer overhead sections, want 1:\n%s", filepath.Base(path), n, report)
		}
		if !strings.HasSuffix(report, strings.TrimSpace(section)+"\n") {
			t.Errorf("%s does not end with the section, whole:\n%s", filepath.Base(path), report)
		}
		if i, j := strings.Index(report, spec.Title), strings.Index(report, "## Observer overhead"); i < 0 || j < i {
			t.Errorf("%s: the section is not after the scenarios", filepath.Base(path))
		}
	}

	// A failed measurement says so where the section would be.
	s.Overhead = &overheadResult{Command: "go run ./cmd/overhead", Error: "exit status 1"}
	if err := writeReport(measured, s, nil, dir); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(measured); !strings.Contains(string(b), "## Observer overhead\n\nNot measured: `go run ./cmd/overhead` failed: exit status 1.") {
		t.Errorf("a failed overhead run is not reported:\n%s", b)
	}
	if errOverhead(s.Overhead) == nil {
		t.Error("a failed overhead run is not an error of the run")
	}
}

func TestApplyPlan(t *testing.T) {
	base := config{plan: "quick", reps: 3, report: "BENCHMARKS.md", results: "benchmarks/results"}
	cfg, err := applyPlan(base, map[string]bool{"plan": true})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.report != ".cache/bench/quick/BENCHMARKS.md" || cfg.results != ".cache/bench/quick" {
		t.Errorf("quick writes %s and %s, want its report under .cache/bench/quick", cfg.report, cfg.results)
	}
	if cfg.variants != "pristine,legacy,drainer,drainer-blocking,go-floor" || cfg.reps != 3 {
		t.Errorf("quick: variants %q, reps %d", cfg.variants, cfg.reps)
	}
	if cfg.messagesFor("drain") != 50_000 || cfg.messagesFor("throughput") != 0 {
		t.Errorf("quick: drain -n %d, throughput -n %d", cfg.messagesFor("drain"), cfg.messagesFor("throughput"))
	}
	if sectionWanted(cfg, failoverScenario) || sectionWanted(cfg, overheadScenario) || microWanted(cfg) {
		t.Error("quick runs a section beside the headline scenarios")
	}

	// Flags given beside -plan override it.
	over := base
	over.reps, over.messages, over.report, over.variants = 1, 1000, "/tmp/x.md", "pristine,drainer"
	cfg, err = applyPlan(over, map[string]bool{"plan": true, "reps": true, "n": true, "report": true, "variants": true})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.reps != 1 || cfg.report != "/tmp/x.md" || cfg.variants != "pristine,drainer" || cfg.messagesFor("drain") != 1000 {
		t.Errorf("explicit flags lost: %+v", cfg)
	}
	smoke := base
	smoke.quick = true
	if cfg, _ = applyPlan(smoke, map[string]bool{"quick": true}); cfg.messagesFor("drain") != 0 {
		t.Errorf("-quick keeps the plan's drain size %d, want the smoke test's own", cfg.messagesFor("drain"))
	}

	// full is the runner's default and the suite as it always was.
	full := base
	full.plan = "full"
	if cfg, _ = applyPlan(full, nil); cfg.scenarios != "" || cfg.variants != "" || cfg.report != "BENCHMARKS.md" ||
		cfg.results != "benchmarks/results" || !sectionWanted(cfg, overheadScenario) || !microWanted(cfg) {
		t.Errorf("full: %+v", cfg)
	}
	if _, err := applyPlan(config{plan: "nope"}, nil); err == nil {
		t.Error("an unknown plan is accepted")
	}

	// The report names the make command only for a plan run as it is.
	for _, c := range []struct {
		plan string
		set  map[string]bool
		args []string
		want string
	}{
		{"full", nil, nil, "make bench FULL=1"},
		{"quick", map[string]bool{"plan": true}, []string{"-plan", "quick"}, "make bench"},
		{"full", map[string]bool{"quick": true, "reps": true}, []string{"-quick", "-reps", "1"}, "go run ./benchmarks/cmd/bench -quick -reps 1"},
	} {
		if got := commandLine(c.plan, c.set, c.args); got != c.want {
			t.Errorf("commandLine(%q, %v) = %q, want %q", c.plan, c.args, got, c.want)
		}
	}
}

// The quick plan's measurements: the cases and sizes it names, in
// pristine, legacy and drainer, and drainer-blocking and go-floor in the
// drain, whose targets are ratios to go-floor; never the C client, even
// where it could be built. The throughput's parity targets get 5
// repetitions.
func TestQuickPlanMeasurements(t *testing.T) {
	cfg, err := applyPlan(config{plan: "quick"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := makePlan(cfg, registryListing(), true)
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]int{}
	for _, g := range p.groups {
		for _, m := range g {
			switch v := m.variant.Name; {
			case (v == scenario.GoFloor || v == scenario.DrainerBlocking) && m.scenario.Name == "drain":
			case v != "pristine" && v != "legacy" && v != "drainer":
				t.Errorf("%s %s runs in %s", m.scenario.Name, m.c, v)
			}
			if want := cfg.messagesFor(m.scenario.Name); m.messages != want {
				t.Errorf("%s: -n %d, want %d", m.scenario.Name, m.messages, want)
			}
			runs[joinNonEmpty(m.scenario.Name, m.c)]++
		}
	}
	want := map[string]int{"stalled-consumer": 9, "stalled-listener b=rpc": 9, "throughput publishers=10": 15,
		"bounded-shutdown broker-stops-reading": 9, "drain api=consume": 15, "drain api=consumefunc": 15,
		"roundtrip size=4096": 9}
	if fmt.Sprint(runs) != fmt.Sprint(want) {
		t.Errorf("runs per case: %v, want %v", runs, want)
	}
	for _, c := range []string{"api=consume", "api=consumefunc"} {
		if got := p.variantsOf("drain", c); fmt.Sprint(got) != "[pristine legacy drainer drainer-blocking go-floor]" {
			t.Errorf("drain %s planned in %v, want drainer-blocking and go-floor beside the three", c, got)
		}
	}
	var out strings.Builder
	printPlan(&out, cfg, p)
	if !strings.Contains(out.String(), "81 measurements; then: none") {
		t.Errorf("-dry-run:\n%s", out.String())
	}
}

// The headline judges only what the plan ran: a target needing a variant
// the plan left out reads "not in this plan", neither yes nor no; one whose
// variant was planned and failed is a "no". The profiles are named, with
// the command that writes them again, and not linked.
func TestHeadlineJudgesOnlyWhatRan(t *testing.T) {
	spec, err := scenario.Lookup("drain")
	if err != nil {
		t.Fatal(err)
	}
	figures := func(cpu, syscalls, rate float64) map[string]scenario.Stat {
		return map[string]scenario.Stat{"cpu_s_per_100k": {Median: cpu},
			"syscalls_per_msg": {Median: syscalls}, "msg_s": {Median: rate}}
	}
	pprof := "benchmarks/results/drain_api-consumefunc_drainer_rep1.pprof"
	cases := []caseResult{
		// api=consume: go-floor not in the plan.
		{Case: "api=consume", Variants: []string{"pristine", "drainer"},
			Planned: []string{"pristine", "drainer"}, Agg: scenario.Agg{"drainer": figures(2, 0.7, 20000)}},
		// api=consumefunc: go-floor planned and measured, the C client beside it.
		{Case: "api=consumefunc", Variants: []string{"drainer", scenario.GoFloor, scenario.CClient},
			Planned: []string{"drainer", scenario.GoFloor, scenario.CClient},
			Runs:    []output{{Result: &scenario.Result{Artefacts: []string{pprof}}}},
			Agg: scenario.Agg{"drainer": figures(1.1, 0.5, 26000), scenario.GoFloor: figures(1, 0.5, 27000),
				scenario.CClient: figures(0.5, 0, 30000)}},
	}
	s := suite{Env: environment{Reps: 3, Plan: "quick", Command: "make bench"}, Scenarios: []scenarioResult{
		{Name: spec.Name, Title: spec.Title, About: spec.About, spec: spec, Cases: cases}}}
	row := func(c, target, measured, met string) string {
		return fmt.Sprintf("| drain | %s | %s | %s | %s |", c, target, measured, met)
	}
	const chanCPU = "drainer CPU-s per 100k at most 2.0× go-floor's (#29; #18's 0.8 CPU-s)"
	got := reportOf(t, s)
	for _, want := range []string{
		row("api=consume", chanCPU, "go-floor not run", "not in this plan"),
		row("api=consumefunc", "drainer CPU-s per 100k at most 1.25× go-floor's (#29; #18's 0.8 CPU-s)",
			"1.10× (c-client 0.50×, the reference to beat)", "yes"),
		row("api=consumefunc", "drainer syscalls per delivery at most 1.2× go-floor's (#18's 0.6)", "1.00×", "yes"),
		// legacy was in no plan of this run.
		row("api=consumefunc", "legacy CPU-s per 100k at most 1.25× go-floor's (#29)", "legacy not run",
			"not in this plan"),
		"- CPU profiles: 1, written by the runs as `benchmarks/results/drain_api-consumefunc_*.pprof`",
		"`make bench` writes them again, or this scenario alone: " +
			"`go run ./benchmarks/cmd/bench -plan quick -scenarios drain",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "**no**") || strings.Contains(got, "]("+pprof) {
		t.Errorf("a target not in the plan reads no, or a profile is linked:\n%s", got)
	}

	// go-floor planned in api=consume, and every repetition of it failed:
	// a failure, not a gap in the plan.
	s.Scenarios[0].Cases[0].Planned = append(s.Scenarios[0].Cases[0].Planned, scenario.GoFloor)
	if got := reportOf(t, s); !strings.Contains(got, row("api=consume", chanCPU, "not measured", "**no**")) {
		t.Errorf("a planned go-floor that failed is not a no:\n%s", got)
	}
}

// reportOf is the report writeReport writes of s.
func reportOf(t *testing.T, s suite) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	if err := writeReport(path, s, nil, "benchmarks/results"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestProgressEstimate(t *testing.T) {
	m := func(scen, c, mode string) measurement {
		return measurement{scenario: listing{Name: scen}, c: c, variant: scenario.Variant{Build: "patched", Mode: mode}, reps: 1}
	}
	prior := map[string]time.Duration{priorKey("drain", "api=consume", "patched", "drainer"): 20 * time.Second}
	p := newProgress(4, prior)
	rest := [][]measurement{{m("throughput", "publishers=10", "drainer")}, {m("throughput", "publishers=100", "drainer")},
		{m("drain", "api=consume", "drainer")}, {m("roundtrip", "size=4096", "drainer")}}
	if left, ok := p.remaining(rest); !ok || left != 20*time.Second {
		t.Errorf("before any run: %v %v, want the drain's prior alone", left, ok)
	}
	p.record(rest[0], 4*time.Second)
	// publishers=100 by its scenario's runs, the drain by its prior, the
	// round trip by the mean of every run.
	if left, ok := p.remaining(rest[1:]); !ok || left != 28*time.Second {
		t.Errorf("after one run: %v, want 4+20+4 s", left)
	}
	// A group run at once charges each member its share.
	p.record([]measurement{m("fragmented-frame", "", "drainer"), m("fragmented-frame", "", "legacy")}, 10*time.Second)
	if d, _ := p.estimate(m("fragmented-frame", "", "upstream")); d != 5*time.Second {
		t.Errorf("a concurrent run: %v, want 5s", d)
	}
	if !strings.Contains(p.line(rest[1:]), "[4/4] throughput publishers=100 rep 1/1 (elapsed ") {
		t.Errorf("progress line: %q", p.line(rest[1:]))
	}
}
