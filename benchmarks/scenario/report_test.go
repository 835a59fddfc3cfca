package scenario

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestAggregateMinMedianMax(t *testing.T) {
	got := Aggregate([]map[string]float64{{"a": 3, "b": 1}, {"a": 1}, {"a": 2, "b": 3}})
	if a := got["a"]; a != (Stat{Min: 1, Median: 2, Max: 3, N: 3}) {
		t.Errorf("a = %+v", a)
	}
	// An even count takes the mean of the middle two; a metric missing from
	// a repetition is aggregated over the others.
	if b := got["b"]; b != (Stat{Min: 1, Median: 2, Max: 3, N: 2}) {
		t.Errorf("b = %+v", b)
	}
}

func TestRatioNeedsBothSides(t *testing.T) {
	a := Agg{"legacy": {"p99": {Median: 1000}}, "drainer": {"p99": {Median: 2}, "zero": {Median: 0}}}
	if v, ok := a.Ratio(Ratio{Metric: "p99", Num: "legacy", Den: "drainer"}); !ok || v != 500 {
		t.Errorf("ratio = %v, %v; want 500, true", v, ok)
	}
	for _, r := range []Ratio{
		{Metric: "p99", Num: "pristine", Den: "drainer"}, // not measured
		{Metric: "zero", Num: "drainer", Den: "drainer"}, // zero denominator
	} {
		if _, ok := a.Ratio(r); ok {
			t.Errorf("%+v: ok, want not measured", r)
		}
	}
}

func TestTargets(t *testing.T) {
	a := Agg{"drainer": {"p99": {Median: 4, Max: 9}, "lost": {Max: 0}}, "legacy": {"p99": {Median: 2000}, "lost": {Max: 3}}}
	if got, ok := AtMost("", "drainer", "p99", 5, "ms").Check(a); !ok || got != "4.000 ms" {
		t.Errorf("AtMost = %q, %v", got, ok)
	}
	if _, ok := AtLeastRatio("", Ratio{Metric: "p99", Num: "legacy", Den: "drainer"}, 300).Check(a); !ok {
		t.Error("AtLeastRatio 500 >= 300 not met")
	}
	if got, ok := maxEverywhere("", "lost", 0).Check(a); ok {
		t.Errorf("maxEverywhere met with legacy losing 3: %q", got)
	}
	if got, ok := maxIn([]string{"drainer"}, "", "lost", 0).Check(a); !ok || !strings.Contains(got, "legacy 3") {
		t.Errorf("maxIn judging drainer only = %q, %v; want met, legacy's 3 listed", got, ok)
	}
	if _, ok := maxIn([]string{"legacy"}, "", "lost", 0).Check(a); ok {
		t.Error("maxIn judging legacy met with legacy losing 3")
	}
	if got, ok := AtMost("", "upstream", "p99", 5, "ms").Check(a); ok || got != "not measured" {
		t.Errorf("unmeasured target = %q, %v", got, ok)
	}
}

// A target needing a variant that the plan did not run is not judged; one
// whose variant was planned and produced no figure has failed.
func TestJudge(t *testing.T) {
	cpu := Ratio{Metric: "cpu_s_per_100k", Num: "drainer", Den: GoFloor}
	target := besideCClient("cpu_s_per_100k", atMostRatio("", cpu, 1.25))
	if fmt.Sprint(target.Variants) != "[drainer go-floor]" {
		t.Errorf("a ratio's target needs %v, want its two sides", target.Variants)
	}
	drainerOnly := Agg{"drainer": {"cpu_s_per_100k": {Median: 1.1}}}
	got, v := target.Judge(drainerOnly, []string{"pristine", "drainer"})
	if v != NotInPlan || got != "go-floor not run" {
		t.Errorf("go-floor not in the plan: %q, %v; want not in this plan", got, v)
	}
	got, v = target.Judge(drainerOnly, []string{"drainer", GoFloor})
	if v != NotMet || got != "not measured" {
		t.Errorf("go-floor planned, every repetition failed: %q, %v; want not met", got, v)
	}
	withFloor := Agg{"drainer": {"cpu_s_per_100k": {Median: 1.1}},
		GoFloor: {"cpu_s_per_100k": {Median: 1.0}}}
	if got, v := target.Judge(withFloor, []string{"drainer", GoFloor}); v != Met || got != "1.10×" {
		t.Errorf("1.1× go-floor's, at most 1.25×: %q, %v; want met", got, v)
	}
	withFloor["drainer"]["cpu_s_per_100k"] = Stat{Median: 1.3}
	if got, v := target.Judge(withFloor, []string{"drainer", GoFloor}); v != NotMet || got != "1.30×" {
		t.Errorf("1.3× go-floor's, at most 1.25×: %q, %v; want not met", got, v)
	}
	// The C client is shown beside, never judged, and never needed.
	withFloor[CClient] = map[string]Stat{"cpu_s_per_100k": {Median: 0.5}}
	got, v = target.Judge(withFloor, []string{"drainer", GoFloor, CClient})
	if v != NotMet || got != "1.30× (c-client 0.50×, the reference to beat)" {
		t.Errorf("with the C client: %q, %v", got, v)
	}
	// A median that misses while the repetitions' ranges reach the bound is
	// within noise; one that every repetition misses is a no.
	delete(withFloor, CClient)
	withFloor["drainer"]["cpu_s_per_100k"] = Stat{Min: 1.2, Median: 1.3, Max: 1.4}
	withFloor[GoFloor]["cpu_s_per_100k"] = Stat{Min: 0.95, Median: 1.0, Max: 1.05}
	got, v = target.Judge(withFloor, []string{"drainer", GoFloor})
	if v != WithinNoise || got != "1.30× (reps 1.14–1.47×)" {
		t.Errorf("ranges that reach 1.25×: %q, %v; want within noise", got, v)
	}
	withFloor["drainer"]["cpu_s_per_100k"] = Stat{Min: 1.4, Median: 1.5, Max: 1.6}
	if got, v := target.Judge(withFloor, []string{"drainer", GoFloor}); v != NotMet || got != "1.50×" {
		t.Errorf("every repetition over 1.25×: %q, %v; want not met", got, v)
	}
	// A target over whichever variants ran needs none of them.
	if _, v := maxEverywhere("", "lost", 0).Judge(Agg{"drainer": {"lost": {}}}, nil); v != Met {
		t.Errorf("maxEverywhere: %v, want met", v)
	}
}

// The drain judges issue #18's goals as ratios to go-floor: every target
// needs go-floor, none the C client, and none is an absolute figure.
func TestDrainTargetsAreRatiosToGoFloor(t *testing.T) {
	s, err := Lookup("drain")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range s.Cases {
		n := 0
		for _, target := range s.Report.Targets {
			if !target.AppliesTo(c) {
				continue
			}
			n++
			if !slices.Contains(target.Variants, GoFloor) || slices.Contains(target.Variants, CClient) {
				t.Errorf("%s: %q needs %v, want go-floor and not c-client", c, target.Text, target.Variants)
			}
		}
		if n < 3 {
			t.Errorf("%s: %d targets, want CPU, syscalls and msg/s at least", c, n)
		}
	}
}

func TestFormatNumber(t *testing.T) {
	for _, c := range []struct {
		v      float64
		digits int
		want   string
	}{
		{0, 0, "0"}, {999, 0, "999"}, {1000, 0, "1,000"}, {1234567.891, 2, "1,234,567.89"},
		{-45000, 1, "-45,000.0"}, {0.0042, 4, "0.0042"},
	} {
		if got := FormatNumber(c.v, c.digits); got != c.want {
			t.Errorf("FormatNumber(%v, %d) = %q, want %q", c.v, c.digits, got, c.want)
		}
	}
}

func TestEveryScenarioIsComplete(t *testing.T) {
	for _, name := range Names() {
		s, err := Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		if s.Title == "" || s.About == "" || s.Run == nil || len(s.Report.Columns) == 0 {
			t.Errorf("%s: title, about, run and report columns are all needed", name)
		}
		if s.order() == len(suiteOrder) {
			t.Errorf("%s: not in suiteOrder", name)
		}
	}
	if len(Names()) != len(suiteOrder) {
		t.Errorf("%d scenarios registered, suiteOrder lists %d", len(Names()), len(suiteOrder))
	}
}
