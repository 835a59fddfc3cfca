package scenario

import (
	"fmt"
	"strings"
)

// Targets that bind every build and mode alike ("0 deadlocks anywhere",
// "arrives intact"). They judge the worst repetition, not the median: one
// deadlock in one repetition is a deadlock.

// maxEverywhere is a Target that metric is at most limit in every
// repetition of every variant that measured it.
func maxEverywhere(text, metric string, limit float64) Target {
	return everyVariant(text, metric, func(s Stat) (float64, bool) { return s.Max, s.Max <= limit })
}

// minEverywhere is a Target that metric is at least limit in every
// repetition of every variant that measured it.
func minEverywhere(text, metric string, limit float64) Target {
	return everyVariant(text, metric, func(s Stat) (float64, bool) { return s.Min, s.Min >= limit })
}

// everyVariant checks judge against each variant's stat of metric; its
// measured text lists each variant's worst value, so that a failure names
// the variant at fault.
func everyVariant(text, metric string, judge func(Stat) (worst float64, ok bool)) Target {
	return Target{Text: text, Check: func(a Agg) (string, bool) {
		var parts []string
		all := true
		for _, v := range Variants {
			s, measured := a.Get(v.Name, metric)
			if !measured {
				continue
			}
			worst, ok := judge(s)
			parts = append(parts, fmt.Sprintf("%s %s", v.Name, FormatNumber(worst, 0)))
			all = all && ok
		}
		if len(parts) == 0 {
			return "not measured", false
		}
		return strings.Join(parts, ", "), all
	}}
}
