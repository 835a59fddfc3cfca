// Package scenario holds the benchmark scenarios of the A/B suite, each a
// reproduction of one reference measurement (../shared/reference/anchors.md)
// or of one Go failure the project exists to fix.
//
// A scenario runs once per process: benchmarks/cmd/benchscenario runs one
// scenario, one case, in one read mode, and prints its Result as JSON. The
// runner (benchmarks/cmd/bench) starts that program for every build, mode,
// case and repetition, so that CPU, RSS and allocation counts belong to
// one measurement only, and a scenario that wedges upstream's reader
// cannot disturb the next.
//
// The same scenarios compile against pristine upstream (build tag
// "pristine") and against the patched tree; package readmode hides the
// difference.
package scenario

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/hist"
)

// A Scenario is one benchmark of the suite.
type Scenario struct {
	// Name identifies it on the command line: "stalled-consumer".
	Name string
	// Title heads its section of BENCHMARKS.md.
	Title string
	// About says in a sentence or two what it sets up and measures.
	About string
	// Cases are its parameter sets, such as "publishers=10"; none means
	// one unnamed case.
	Cases []string
	// Modes are the read modes it runs in; none means every mode the build
	// offers.
	Modes []string
	// ReferenceCase, when set, is the only case in which the reference
	// variants (Variant.Reference) run: they do not use amqp091-go, so
	// the cases that vary its API would measure them again for nothing.
	ReferenceCase string
	// Reps overrides the runner's repetition count when non-zero, for
	// scenarios whose length is fixed by what they measure (30 s idle).
	Reps int
	// QuickReps, when non-zero, is the repetition count under -quick.
	QuickReps int
	// Counted says that the scenario takes a message count (Env.Count),
	// which the runner's -n and its plans set.
	Counted bool
	// Concurrent lets the runner start every variant and repetition of a
	// case at once. Only for scenarios whose measurement is per process
	// and that load neither broker nor CPU (a throttled transfer).
	Concurrent bool
	// Timeout bounds one run; the runner kills a process that exceeds it.
	Timeout time.Duration
	// Run performs one measurement.
	Run func(ctx context.Context, env *Env, c string) (*Result, error)
	// Report says how BENCHMARKS.md presents it.
	Report Report
}

var registry = map[string]*Scenario{}

// Register adds s to the suite; scenario files call it from init.
func Register(s *Scenario) {
	if _, dup := registry[s.Name]; dup {
		panic("scenario: registered twice: " + s.Name)
	}
	registry[s.Name] = s
}

// Lookup returns the named scenario.
func Lookup(name string) (*Scenario, error) {
	s, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("scenario: no scenario %q; have %v", name, Names())
	}
	return s, nil
}

// Names lists the registered scenarios in the order of the suite.
func Names() []string {
	names := slices.Collect(maps.Keys(registry))
	slices.SortFunc(names, func(a, b string) int {
		return registry[a].order() - registry[b].order()
	})
	return names
}

// order places a scenario by its position in the list, unknown
// ones last.
func (s *Scenario) order() int {
	if i := slices.Index(suiteOrder, s.Name); i >= 0 {
		return i
	}
	return len(suiteOrder)
}

// suiteOrder is the order of the suite's sections.
var suiteOrder = []string{
	"stalled-consumer", "stalled-listener", "throughput", "error-propagation",
	"bounded-shutdown", "fragmented-frame", "idle-connections", "allocations",
	"client-throughput", "confirm-wait", "drain", "roundtrip", "observability",
}

// CaseList returns s.Cases, or one unnamed case.
func (s *Scenario) CaseList() []string {
	if len(s.Cases) == 0 {
		return []string{""}
	}
	return s.Cases
}

// A Result is what one run measured. Every figure is a named number in
// Metrics, so that repetitions aggregate uniformly; latency distributions
// are also kept whole, for charts.
type Result struct {
	Metrics map[string]float64      `json:"metrics"`
	Latency map[string]hist.Summary `json:"latency,omitempty"`
	Notes   []string                `json:"notes,omitempty"`
	// Timeline is what a run sampled over time, for a timeline chart;
	// Lines are log lines it quotes in the report, by name.
	Timeline []BudgetPoint     `json:"timeline,omitempty"`
	Lines    map[string]string `json:"lines,omitempty"`
	// Artefacts are the files the run saved beside the results (a CPU
	// profile), which the report links to.
	Artefacts []string `json:"artefacts,omitempty"`
}

// NewResult returns an empty Result.
func NewResult() *Result {
	return &Result{Metrics: map[string]float64{}, Latency: map[string]hist.Summary{}}
}

// Set records one figure.
func (r *Result) Set(metric string, v float64) { r.Metrics[metric] = v }

// Note records a remark for the report, such as why a run stopped waiting.
func (r *Result) Note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// AddLatency records a distribution as name.p50_ms, name.p95_ms,
// name.p99_ms, name.max_ms and name.n, and keeps it whole under name.
func (r *Result) AddLatency(name string, s hist.Summary) {
	r.Latency[name] = s
	r.Metrics[name+".n"] = float64(s.N)
	r.Metrics[name+".p50_ms"] = s.P50
	r.Metrics[name+".p95_ms"] = s.P95
	r.Metrics[name+".p99_ms"] = s.P99
	r.Metrics[name+".max_ms"] = s.Max
}
