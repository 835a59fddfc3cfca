package scenario

import (
	"fmt"
	"slices"
	"strings"
)

// Targets that bind every build and mode alike ("0 deadlocks anywhere",
// "arrives intact"), or only the variants named (maxIn). They judge the worst
// repetition, not the median: one deadlock in one repetition is a deadlock.

// maxEverywhere is a Target that metric is at most limit in every
// repetition of every variant that measured it.
func maxEverywhere(text, metric string, limit float64) Target {
	return maxIn(nil, text, metric, limit)
}

// maxIn is maxEverywhere judging only the variants named (nil: all), for a
// fault the others have by design; their worst values are still listed.
func maxIn(judged []string, text, metric string, limit float64) Target {
	return everyVariant(text, metric, judged, func(s Stat) (float64, bool) { return s.Max, s.Max <= limit })
}

// minEverywhere is a Target that metric is at least limit in every
// repetition of every variant that measured it.
func minEverywhere(text, metric string, limit float64) Target {
	return everyVariant(text, metric, nil, func(s Stat) (float64, bool) { return s.Min, s.Min >= limit })
}

// everyVariant checks judge against each variant's stat of metric; its
// measured text lists each variant's worst value, so that a failure names
// the variant at fault. Only the variants in judged (nil: all) can fail it.
func everyVariant(text, metric string, judged []string, judge func(Stat) (worst float64, ok bool)) Target {
	return Target{Text: text, Variants: judged, Check: func(a Agg) (string, bool) {
		var parts []string
		all := true
		for _, v := range Variants {
			s, measured := a.Get(v.Name, metric)
			if !measured {
				continue
			}
			worst, ok := judge(s)
			parts = append(parts, fmt.Sprintf("%s %s", v.Name, FormatNumber(worst, 0)))
			if judged == nil || slices.Contains(judged, v.Name) {
				all = all && ok
			}
		}
		if len(parts) == 0 {
			return "not measured", false
		}
		return strings.Join(parts, ", "), all
	}}
}

// AtMost is a Target that the median of metric in variant is at most
// limit.
func AtMost(text, variant, metric string, limit float64, unit string) Target {
	return Target{Text: text, Variants: []string{variant}, Check: func(a Agg) (string, bool) {
		v, ok := a.Median(variant, metric)
		if !ok {
			return "not measured", false
		}
		return fmt.Sprintf("%s %s", FormatNumber(v, 3), unit), v <= limit
	}}
}

// MetricIs is a Target that the median of metric in variant is exactly
// want: for counts and flags, where "at most" would read oddly.
func MetricIs(text, variant, metric string, want float64) Target {
	return Target{Text: text, Variants: []string{variant}, Check: func(a Agg) (string, bool) {
		v, ok := a.Median(variant, metric)
		if !ok {
			return "not measured", false
		}
		return FormatNumber(v, 0), v == want
	}}
}

// AtLeastRatio is a Target that ratio r is at least limit.
func AtLeastRatio(text string, r Ratio, limit float64) Target {
	return ratioTarget(text, r, func(v float64) bool { return v >= limit })
}

// atMostRatio is a Target that ratio r is at most limit, for figures where
// less is better, such as bytes allocated.
func atMostRatio(text string, r Ratio, limit float64) Target {
	return ratioTarget(text, r, func(v float64) bool { return v <= limit })
}

// inCase is t judging the case named c only.
func inCase(c string, t Target) Target {
	t.Cases = []string{c}
	return t
}

// ratioTarget judges ratio r with ok. A ratio of medians that misses is
// within noise if the ranges' most favourable pairing still meets ok (the
// least numerator over the greatest denominator, or the other way round):
// on this machine three repetitions of one drain range over ±20%.
func ratioTarget(text string, r Ratio, ok func(float64) bool) Target {
	return Target{Text: text, Variants: []string{r.Num, r.Den}, Check: func(a Agg) (string, bool) {
		v, measured := a.Ratio(r)
		if !measured {
			return "not measured", false
		}
		return fmt.Sprintf("%s×", FormatNumber(v, 2)), ok(v)
	}, Reach: func(a Agg) (string, bool) {
		n, ok1 := a.Get(r.Num, r.Metric)
		d, ok2 := a.Get(r.Den, r.Metric)
		if !ok1 || !ok2 || d.Min <= 0 || d.Max <= 0 {
			return "", false
		}
		lo, hi := n.Min/d.Max, n.Max/d.Min
		return fmt.Sprintf("%s–%s×", FormatNumber(lo, 2), FormatNumber(hi, 2)), ok(lo) || ok(hi)
	}}
}

// besideCClient adds to t's measured figure the C client's ratio of metric
// to go-floor's, where the run has both: the reference to beat, shown and
// never judged. t.Variants does not name c-client, so a run without it
// (make bench, a machine without librabbitmq's headers) judges t the same.
func besideCClient(metric string, t Target) Target {
	check := t.Check
	t.Check = func(a Agg) (string, bool) {
		got, ok := check(a)
		if c, measured := a.Ratio(Ratio{Metric: metric, Num: CClient, Den: GoFloor}); measured {
			got += fmt.Sprintf(" (%s %s×, the reference to beat)", CClient, FormatNumber(c, 2))
		}
		return got, ok
	}
	return t
}
