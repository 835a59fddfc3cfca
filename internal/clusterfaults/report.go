package clusterfaults

import (
	"fmt"
	"strings"
	"time"
)

// Table renders results as a Markdown table, one row per fault and
// variant, with the targets for drainer and legacy judged in the
// "target" column (upstream is measured, not judged), and each resume
// split into the broker's share and the client's (Result.BrokerReady).
func Table(cfg Config, results []Result) string {
	cfg.defaults()
	var sb strings.Builder
	sb.WriteString("| fault | round | variant | leader | resumed after | target | longest gap " +
		"| confirmed | nacks | failovers / reopens / abandons | duplicates | redelivered | lost " +
		"| unsettled | Close during the cut | broker's share / client's |\n")
	sb.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
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
			target += leaderLossShare(r)
			target += frozenGap(r)
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
		shares := ""
		if r.BrokerReadyOK && r.Resumed {
			shares = ms(r.BrokerReady) + " / " + signedMs(r.Resume-r.BrokerReady)
		}
		fmt.Fprintf(&sb, "| %s | %d | %s | %s | %s | %s | %s | %d of %d | %d | %s | %d | %d | %s "+
			"| %d | %s | %s |\n",
			r.Fault.ID, r.Round, r.Variant.Name, r.Leader, resume, target, ms(r.MaxGap),
			r.Confirmed, r.Published, r.Nacks, counters, r.Duplicates, r.Redelivered, lost,
			r.Unsettled, closeCell, shares)
	}
	return sb.String()
}

// leaderLoss reports a fault that takes the queue's leader away, from
// the publisher's node or another: no node confirms before the broker
// elected another.
func leaderLoss(f Fault) bool { return f.ID == "5pmL" || f.ID == "8L" || f.ID == "8o" }

// leaderLossShare judges the client's share of a leader's loss: from the
// broker's readiness (or, unmeasured, its last nack) to the resume, at
// most ClientShare. Empty for other faults, or with neither measured.
func leaderLossShare(r Result) string {
	if !leaderLoss(r.Fault) {
		return ""
	}
	share, after := r.AfterNack, "the last nack"
	switch {
	case r.BrokerReadyOK && r.Resumed:
		share, after = r.Resume-r.BrokerReady, "the broker's readiness"
	case !r.NackedFirst:
		return ""
	}
	return fmt.Sprintf("; %s after %s, ≤ %s %s", signedMs(share), after, ms(ClientShare),
		verdict(share <= ClientShare))
}

// frozenGap judges the longest gap of a frozen publisher's node (issue
// #43): at most the broker's share + 1 s when it leads the queue (8L),
// or when the leader frozen is another node (8o), at most the 3 s
// when it does not (8).
func frozenGap(r Result) string {
	var bound time.Duration
	switch {
	case (r.Fault.ID == "8L" || r.Fault.ID == "8o") && r.BrokerReadyOK:
		bound = r.BrokerReady + time.Second
	case r.Fault.ID == "8":
		bound = 3 * time.Second
	default:
		return ""
	}
	return fmt.Sprintf("; gap ≤ %s %s", ms(bound), verdict(r.MaxGap <= bound))
}

func verdict(met bool) string {
	if met {
		return "met"
	}
	return "**missed**"
}

// signedMs is ms for a share that may come out below zero: a client that
// resumed before the probe's confirm, which lands within probeEvery.
func signedMs(d time.Duration) string {
	if d < 0 {
		return "−" + ms(-d)
	}
	return ms(d)
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
