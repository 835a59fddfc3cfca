package clusterfaults

import (
	"fmt"
	"strings"
	"time"
)

// Table renders results as a Markdown table, one row per fault and
// variant, with the targets for drainer and legacy judged in the
// "target" column (upstream is measured, not judged).
func Table(cfg Config, results []Result) string {
	cfg.defaults()
	var sb strings.Builder
	sb.WriteString("| fault | round | variant | leader | resumed after | target | longest gap " +
		"| confirmed | nacks | failovers / reopens / abandons | duplicates | redelivered | lost " +
		"| unsettled | Close during the cut |\n")
	sb.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		resume := "not within the window"
		if r.Resumed {
			resume = ms(r.Resume)
		}
		target := ms(cfg.ResumeTarget(r.Fault))
		if !r.Variant.Baseline {
			if r.Resumed && r.Resume <= cfg.ResumeTarget(r.Fault) {
				target += " met"
			} else {
				target += " **missed**"
			}
			if r.Fault.ID == "5pmL" && r.NackedFirst {
				share := "met"
				if r.AfterNack > ClientShare {
					share = "**missed**"
				}
				target += fmt.Sprintf("; %s after the last nack, ≤ %s %s",
					ms(r.AfterNack), ms(ClientShare), share)
			}
		}
		counters := fmt.Sprintf("%d / %d / %d", r.Failovers, r.Reopens, r.Abandons)
		if r.Variant.Baseline {
			counters = "recovery"
		}
		closeCell := ""
		if r.Fault.CloseDuring {
			closeCell = ms(r.Close)
			if r.CloseErr != "" {
				closeCell += " (" + short(r.CloseErr) + ")"
			}
		}
		lost := fmt.Sprint(r.Lost)
		if r.Lost > 0 {
			lost = "**" + lost + "**"
		}
		fmt.Fprintf(&sb, "| %s | %d | %s | %s | %s | %s | %s | %d of %d | %d | %s | %d | %d | %s "+
			"| %d | %s |\n",
			r.Fault.ID, r.Round, r.Variant.Name, r.Leader, resume, target, ms(r.MaxGap),
			r.Confirmed, r.Published, r.Nacks, counters, r.Duplicates, r.Redelivered, lost,
			r.Unsettled, closeCell)
	}
	return sb.String()
}

// Legend lists the faults of a table's rows, for its legend.
func Legend(faults []Fault) string {
	var sb strings.Builder
	for _, f := range faults {
		fmt.Fprintf(&sb, "- fault %s: %s (leader %s, publisher on %s, consumer on %s)\n",
			f.ID, f.Name, f.Leader, f.Publisher, f.Consumer)
	}
	return sb.String()
}

func ms(d time.Duration) string {
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return fmt.Sprintf("%d ms", d.Milliseconds())
}

func short(s string) string {
	if len(s) > 60 {
		return s[:57] + "..."
	}
	return s
}
