package nemesis

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
)

// Publish is one publish of a message: when, on which node, and on which
// channel generation (the workload's own label for a channel, "b/3" say),
// so that a loss says which channel's ack confirmed it.
type Publish struct {
	At   time.Time
	Node cluster.Node
	Gen  string
}

// Message is what the workload recorded of one message ID.
type Message struct {
	ID        string
	Publishes []Publish
	// Confirmed: its Publish returned nil, at ConfirmedAt, after an ack on
	// channel generation ConfirmedGen.
	Confirmed    bool
	ConfirmedAt  time.Time
	ConfirmedGen string
	// Err is how its Publish ended when not confirmed (ErrGaveUp or
	// ErrNacked with their reason, or ctx's error); empty if confirmed.
	Err string
	// Deliveries counts the times it was consumed, or fetched from its
	// queue when the checker drained it.
	Deliveries int
}

// History is what a workload recorded over a schedule's run.
type History struct {
	Start    time.Time // the schedule's time 0
	Messages []Message
	// Stale counts settlements refused with ErrStaleDelivery: a delivery
	// held across a fault and settled on a channel that had ended. Never
	// a loss: the broker redelivers it.
	Stale int
}

// Report is the checker's verdict.
type Report struct {
	Published int // distinct messages
	Confirmed int
	// Lost: confirmed, never consumed. It must be 0.
	Lost int
	// Duplicates: deliveries past a message's first (at-least-once).
	Duplicates int
	// UnconfirmedDelivered: their Publish ended with an error, yet they
	// arrived.
	UnconfirmedDelivered int
	Stale                int
	// Failed counts the publishes that ended with an error, by error.
	Failed map[string]int
	// LongestGap is, per fault kind, the longest time between two
	// consecutive confirms (of any message) that overlaps a fault of it.
	LongestGap map[Kind]time.Duration
	// LostHistories tell each lost message's story (see Check).
	LostHistories []string
}

// Check compares what was confirmed with what was consumed, over the
// schedule s that ran from h.Start. Each lost message gets its history:
// its publishes (when, node, channel generation), its confirmation
// (when, which generation), and the faults active at each, so that whoever
// reads it can tell a client's bug (an ack of one generation settling a
// message of another) from the broker's.
func Check(h History, s Schedule) Report {
	rep := Report{Published: len(h.Messages), Stale: h.Stale,
		Failed: map[string]int{}, LongestGap: map[Kind]time.Duration{}}
	var confirms []time.Duration
	for _, m := range h.Messages {
		if m.Deliveries > 1 {
			rep.Duplicates += m.Deliveries - 1
		}
		if !m.Confirmed {
			if m.Err != "" {
				rep.Failed[m.Err]++
			}
			if m.Deliveries > 0 {
				rep.UnconfirmedDelivered++
			}
			continue
		}
		rep.Confirmed++
		confirms = append(confirms, m.ConfirmedAt.Sub(h.Start))
		if m.Deliveries == 0 {
			rep.Lost++
			rep.LostHistories = append(rep.LostHistories, story(m, h.Start, s))
		}
	}
	sort.Strings(rep.LostHistories)
	rep.longestGaps(confirms, s)
	return rep
}

// longestGaps fills LongestGap from the confirm times, from the
// schedule's start.
func (rep *Report) longestGaps(confirms []time.Duration, s Schedule) {
	sort.Slice(confirms, func(i, j int) bool { return confirms[i] < confirms[j] })
	for i := 1; i < len(confirms); i++ {
		from, to := confirms[i-1], confirms[i]
		for _, a := range s.Actions {
			if a.Start < to && from < a.End() && to-from > rep.LongestGap[a.Kind] {
				rep.LongestGap[a.Kind] = to - from
			}
		}
	}
}

// story is m's history, relative to the schedule's start.
func story(m Message, start time.Time, s Schedule) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "lost %s:", m.ID)
	for _, p := range m.Publishes {
		at := p.At.Sub(start)
		fmt.Fprintf(&sb, " published %s%s%s%s;", secs(at), known(" on ", string(p.Node)), known(" (gen ", p.Gen, ")"),
			faultsAt(s, at))
	}
	at := m.ConfirmedAt.Sub(start)
	fmt.Fprintf(&sb, " confirmed %s%s%s; never consumed", secs(at), known(" by gen ", m.ConfirmedGen), faultsAt(s, at))
	return sb.String()
}

// known is prefix, v and suffix, or "" when v is unknown (a workload that
// cannot tell the node or channel generation).
func known(prefix, v string, suffix ...string) string {
	if v == "" {
		return ""
	}
	return prefix + v + strings.Join(suffix, "")
}

// faultsAt lists the faults active at t, or "" with none.
func faultsAt(s Schedule, t time.Duration) string {
	var names []string
	for _, a := range s.Active(t) {
		names = append(names, fmt.Sprintf("%s %s %s–%s", a.Kind, a.target(), secs(a.Start), secs(a.End())))
	}
	if len(names) == 0 {
		return ""
	}
	return ", during " + strings.Join(names, ", ")
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }
