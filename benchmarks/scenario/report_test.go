package scenario

import (
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
