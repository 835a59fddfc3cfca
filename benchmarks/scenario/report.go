package scenario

import (
	"fmt"
	"slices"
	"strings"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/readmode"
)

// Variants are the four builds-and-modes every scenario compares, in the
// order reports list them.
var Variants = []Variant{
	{Name: "pristine", Build: "pristine", Mode: "upstream"},
	{Name: "upstream", Build: "patched", Mode: "upstream"},
	{Name: "legacy", Build: "patched", Mode: "legacy"},
	{Name: "drainer", Build: "patched", Mode: "drainer"},
	// The drainer with its socket read by blocking system calls
	// (compat.WithBlockingRead), issue #40's option: where it saves CPU
	// (the drain) and where its thread per connection shows (the idle
	// connections).
	{Name: DrainerBlocking, Build: "patched", Mode: DrainerBlocking, OptIn: true},
	// References that are not amqp091-go, run only by the scenarios that
	// list their Mode (the drain): what a Go program spends at the least
	// (package rawdrain), and the C client.
	{Name: GoFloor, Build: "pristine", Mode: GoFloor, Reference: true},
	{Name: CClient, Build: "pristine", Mode: CClient, Reference: true},
	// The floor read with blocking read(2) on a locked OS thread instead
	// of through the netpoller, told of (entersyscall) and not
	// (RawSyscall): issue #40's question whether a blocking read would
	// earn the drainer an option. Experiments beside go-floor, not
	// yardsticks that any target judges against.
	{Name: GoFloorBlocking, Build: "pristine", Mode: GoFloorBlocking, Reference: true},
	{Name: GoFloorRawSyscall, Build: "pristine", Mode: GoFloorRawSyscall, Reference: true},
}

// The reference variants' names, which are also their modes.
const (
	GoFloor           = "go-floor"
	CClient           = "c-client"
	GoFloorBlocking   = "go-floor-blocking"
	GoFloorRawSyscall = "go-floor-rawsyscall"
	// DrainerBlocking is the drainer with compat.WithBlockingRead.
	DrainerBlocking = readmode.DrainerBlocking
)

// CClientEnv names the environment variable through which the runner
// gives the c-client variant's process the path of the C program it
// built (benchmarks/cclient).
const CClientEnv = "BENCH_CCLIENT_DRAIN"

// A Variant is one build in one read mode.
type Variant struct {
	Name  string `json:"name"`  // pristine, upstream, legacy or drainer
	Build string `json:"build"` // pristine or patched
	Mode  string `json:"mode"`  // upstream, legacy or drainer
	// Env is added to the scenario process's environment: a variant of
	// a mode with an option on (the runner's -coalesce).
	Env []string `json:"env,omitempty"`
	// Reference marks a variant that is not amqp091-go but a yardstick
	// for it: only a scenario whose Modes name its Mode runs it.
	Reference bool `json:"reference,omitempty"`
	// OptIn marks a variant of amqp091-go with an option on that only a
	// scenario whose Modes name its Mode runs: it answers that
	// scenario's question, and would only lengthen the others.
	OptIn bool `json:"opt_in,omitempty"`
}

// A Report says how BENCHMARKS.md presents a scenario: a table with a row
// per variant, the ratios between variants, and the targets.
type Report struct {
	Columns   []Column
	Ratios    []Ratio
	Targets   []Target
	Reference string   // the reference figures, in Markdown, printed beside ours
	Charts    []string // latency names whose distributions are charted
}

// A Column is one figure of the table: the min/median/max of a metric
// over the repetitions.
type Column struct {
	Label  string
	Metric string
	Digits int // decimals printed
}

// A Ratio divides the median of a metric in one variant by its median in
// another: "legacy P99 / drainer P99" says how many times better the
// drainer is.
type Ratio struct {
	Label    string
	Metric   string
	Num, Den string // variant names
}

// A Target is one goal of the issue, checked against the aggregate.
type Target struct {
	Text  string
	Check func(a Agg) (measured string, ok bool)
	// Cases, when set, are the only cases the target judges: an issue's
	// goal may differ by payload size.
	Cases []string
	// Variants are the variants whose figures Check needs (a ratio's two
	// sides). A run whose plan left one out cannot judge the target, which
	// is then neither met nor missed (Judge); nil for a target that judges
	// whichever variants ran.
	Variants []string
	// Reach, when set, tells a miss from noise (issue #40): it reports
	// whether the repetitions' ranges still reach the bound that the
	// medians missed, with the range it judged. Nil: every miss is NotMet.
	Reach func(a Agg) (span string, reached bool)
}

// A Verdict is what Judge makes of a target in one case of one run.
type Verdict int

const (
	// Met: the figures are within the target.
	Met Verdict = iota
	// NotMet: the variants the target needs were all in the plan, and the
	// figures miss it, or a variant ran and produced none (every
	// repetition failed): a regression or a broken measurement.
	NotMet
	// NotInPlan: the plan did not run a variant the target needs (make
	// bench's quick plan runs no c-client, -variants may leave out any),
	// so the run says nothing about it either way.
	NotInPlan
	// WithinNoise: the medians miss the target, but the repetitions'
	// ranges reach it (Target.Reach), so the run cannot tell a miss from
	// the machine's noise; more repetitions decide. A "no" is then kept
	// for a figure that even the ranges' most favourable pairing misses.
	WithinNoise
)

// Judge checks t against a, the case's aggregate, where planned are the
// variants the run's plan gave the case. Only a variant absent from the
// plan makes the target NotInPlan: one that was planned but has no figure
// failed, and a failure is NotMet.
func (t Target) Judge(a Agg, planned []string) (measured string, v Verdict) {
	var missing []string
	for _, name := range t.Variants {
		if !slices.Contains(planned, name) {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return strings.Join(missing, " and ") + " not run", NotInPlan
	}
	measured, ok := t.Check(a)
	switch {
	case ok:
		return measured, Met
	case t.Reach == nil:
		return measured, NotMet
	}
	if span, reached := t.Reach(a); reached {
		return measured + " (reps " + span + ")", WithinNoise
	}
	return measured, NotMet
}

// AppliesTo reports whether t judges the case named c.
func (t Target) AppliesTo(c string) bool {
	return len(t.Cases) == 0 || slices.Contains(t.Cases, c)
}

// ForCases returns t restricted to the named cases.
func (t Target) ForCases(cases ...string) Target {
	t.Cases = cases
	return t
}

// A Stat is a metric over the repetitions of one variant.
type Stat struct {
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// Agg holds the stats of one case: variant name, then metric.
type Agg map[string]map[string]Stat

// Get returns the stat of metric in variant, and whether it was measured.
func (a Agg) Get(variant, metric string) (Stat, bool) {
	s, ok := a[variant][metric]
	return s, ok
}

// Median returns the median of metric in variant, or NaN-free false.
func (a Agg) Median(variant, metric string) (float64, bool) {
	s, ok := a.Get(variant, metric)
	return s.Median, ok
}

// Ratio evaluates r, reporting false if either side is missing or the
// denominator is zero.
func (a Agg) Ratio(r Ratio) (float64, bool) {
	n, ok1 := a.Median(r.Num, r.Metric)
	d, ok2 := a.Median(r.Den, r.Metric)
	if !ok1 || !ok2 || d == 0 {
		return 0, false
	}
	return n / d, true
}

// Aggregate reduces repetitions (each a metric map) to stats.
func Aggregate(reps []map[string]float64) map[string]Stat {
	values := map[string][]float64{}
	for _, m := range reps {
		for k, v := range m {
			values[k] = append(values[k], v)
		}
	}
	out := map[string]Stat{}
	for k, vs := range values {
		slices.Sort(vs)
		med := vs[len(vs)/2]
		if len(vs)%2 == 0 {
			med = (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
		}
		out[k] = Stat{Min: vs[0], Median: med, Max: vs[len(vs)-1], N: len(vs)}
	}
	return out
}

// FormatNumber prints v with the given decimals and thousands separators.
func FormatNumber(v float64, digits int) string {
	s := fmt.Sprintf("%.*f", digits, v)
	neg := s[0] == '-'
	if neg {
		s = s[1:]
	}
	intPart, frac := s, ""
	for i := range s {
		if s[i] == '.' {
			intPart, frac = s[:i], s[i:]
			break
		}
	}
	var b []byte
	for i := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b = append(b, ',')
		}
		b = append(b, intPart[i])
	}
	if neg {
		return "-" + string(b) + frac
	}
	return string(b) + frac
}
