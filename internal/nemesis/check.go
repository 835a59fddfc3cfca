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
	ID string
	// Publisher is the client that published it ("p1"): gaps are
	// measured per publisher.
	Publisher string
	Publishes []Publish
	// Confirmed: its Publish returned nil, at ConfirmedAt, after an ack on
	// channel generation ConfirmedGen.
	Confirmed    bool
	ConfirmedAt  time.Time
	ConfirmedGen string
	// Err is how its Publish ended when not confirmed (ErrGaveUp or
	// ErrNacked with their reason, or ctx's error); empty if confirmed.
	Err string
	// Deliveries are the times it was consumed, or fetched from its
	// queue when the checker drained it.
	Deliveries []time.Time
}

// History is what a workload recorded over a schedule's run.
type History struct {
	Start    time.Time // the schedule's time 0
	Messages []Message
	// Stale counts settlements that failed because their delivery's
	// channel had ended: a delivery held across a fault. Never a loss:
	// the broker delivers it again. The failover consumer opens a new
	// connection after a loss, so these are its failed acks
	// (End.AckErrors), not ErrStaleDelivery, which only SafeRecovery's
	// recovery on the same connection returns.
	Stale int
	// Ends are what each workload process said of itself at its end.
	Ends []End
	// Clients are each client's dials and failover events (dial, fo), by
	// client name, for a loss's story.
	Clients map[string][]Event
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
	// consecutive confirms of one publisher that overlaps faults of that
	// kind only; a gap that overlaps faults of two kinds or more counts
	// under Overlap, since either could have caused it. A publisher's
	// gaps are charged to the node faults, to freezes of its process and
	// to cuts of its own link, not to another client's link.
	LongestGap map[Kind]time.Duration
	// LostHistories tell each lost message's story (see Check).
	LostHistories []string
	// Leaked: goroutines a workload process held after its clients
	// closed, beyond those it had before they started (0 is right).
	// PeakRSSKiB: the largest peak resident set of a workload process.
	Leaked, PeakRSSKiB int
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
	confirms := map[string][]time.Duration{} // by publisher
	for _, m := range h.Messages {
		if len(m.Deliveries) > 1 {
			rep.Duplicates += len(m.Deliveries) - 1
		}
		if !m.Confirmed {
			if m.Err != "" {
				rep.Failed[m.Err]++
			}
			if len(m.Deliveries) > 0 {
				rep.UnconfirmedDelivered++
			}
			continue
		}
		rep.Confirmed++
		confirms[m.Publisher] = append(confirms[m.Publisher], m.ConfirmedAt.Sub(h.Start))
		if len(m.Deliveries) == 0 {
			rep.Lost++
			rep.LostHistories = append(rep.LostHistories, story(m, h, s))
		}
	}
	sort.Strings(rep.LostHistories)
	for _, e := range h.Ends {
		rep.Leaked += max(0, e.GoroutinesAfter-e.GoroutinesBefore)
		rep.PeakRSSKiB = max(rep.PeakRSSKiB, e.PeakRSSKiB)
	}
	for pub, cs := range confirms {
		rep.longestGaps(cs, s.forPublisher(pub))
	}
	return rep
}

// forPublisher is s without the link cuts of clients other than pub (a
// name, "p1", the end of a client's "workload/p1"); "" keeps them all.
func (s Schedule) forPublisher(pub string) Schedule {
	if pub == "" {
		return s
	}
	out := s
	out.Actions = nil
	for _, a := range s.Actions {
		if a.Kind != ClientLink || a.Client == pub || strings.HasSuffix(a.Client, "/"+pub) {
			out.Actions = append(out.Actions, a)
		}
	}
	return out
}

// Overlap is LongestGap's key for gaps that overlap faults of more than
// one kind.
const Overlap Kind = "overlap"

// longestGaps fills LongestGap from the confirm times, from the
// schedule's start.
func (rep *Report) longestGaps(confirms []time.Duration, s Schedule) {
	sort.Slice(confirms, func(i, j int) bool { return confirms[i] < confirms[j] })
	for i := 1; i < len(confirms); i++ {
		from, to := confirms[i-1], confirms[i]
		kind := Kind("")
		for _, a := range s.Actions {
			switch {
			case a.End() <= from || to <= a.Start: // no overlap
			case kind == "" || kind == a.Kind:
				kind = a.Kind
			default:
				kind = Overlap
			}
		}
		if kind != "" && to-from > rep.LongestGap[kind] {
			rep.LongestGap[kind] = to - from
		}
	}
}

// story is m's history, relative to the schedule's start: its publishes
// and confirm, the faults active at each, and what its publisher did in
// between (dials, reopens, abandonments).
func story(m Message, h History, s Schedule) string {
	start := h.Start
	var sb strings.Builder
	fmt.Fprintf(&sb, "lost %s:", m.ID)
	for _, p := range m.Publishes {
		at := p.At.Sub(start)
		fmt.Fprintf(&sb, " published %s%s%s%s;", secs(at), known(" on ", string(p.Node)), known(" (gen ", p.Gen, ")"),
			faultsAt(s, at))
	}
	at := m.ConfirmedAt.Sub(start)
	fmt.Fprintf(&sb, " confirmed %s%s%s; never consumed", secs(at), known(" by gen ", m.ConfirmedGen), faultsAt(s, at))
	if len(m.Publishes) > 0 {
		for _, e := range h.Clients[m.Publisher] {
			if t := time.Unix(0, e.T); !t.Before(m.Publishes[0].At) && !t.After(m.ConfirmedAt) {
				fmt.Fprintf(&sb, "; %s: %s %s%s", secs(t.Sub(start)), m.Publisher, e.Kind, known(" ", e.Node+e.Err))
			}
		}
	}
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
