package clusterfaults

import (
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/failover"
)

// t0 is the fault of the synthetic cells; at(ms) is ms milliseconds after
// it (negative: before it).
var t0 = time.Unix(1000, 0)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// Folded repeats keep their last time, which lastBefore finds within its
// window: a storm's last nack, not its first.
func TestTimelineLastBefore(t *testing.T) {
	var tl timeline
	tl.add(at(0), "fault")
	tl.add(at(100), "nack")
	tl.add(at(200), "nack") // folded into the entry at 100
	tl.add(at(300), "channel-reopen")
	tl.add(at(400), "nack")
	tl.add(at(500), "nack") // folded
	tl.add(at(900), "ack")
	want := "+0.00s fault, +0.10s nack ×2, +0.30s channel-reopen, +0.40s nack ×2, +0.90s ack"
	if got := tl.since(at(0), at(1000)); got != want {
		t.Fatalf("since: %s", got)
	}
	for _, tc := range []struct {
		from, to, want int
		ok             bool
	}{
		{0, 900, 500, true},
		{0, 450, 400, true}, // the fold's first time, its last being past the window
		{0, 250, 200, true},
		{600, 900, 0, false},
	} {
		got, ok := tl.lastBefore("nack", at(tc.from), at(tc.to))
		if ok != tc.ok || (ok && !got.Equal(at(tc.want))) {
			t.Fatalf("lastBefore(nack, %d, %d) = %v, %v; want +%d ms, %v",
				tc.from, tc.to, got.Sub(t0), ok, tc.want, tc.ok)
		}
	}
}

// Only a repeat of the entry just before folds: the same event after
// another starts an entry of its own, so the log keeps the order of what
// happened.
func TestTimelineFoldsOnlyConsecutiveRepeats(t *testing.T) {
	var tl timeline
	for i, what := range []string{"ack", "ack", "ack", "nack", "ack"} {
		tl.add(at(10*i), what)
	}
	if len(tl.entries) != 3 {
		t.Fatalf("%d entries, want 3: %+v", len(tl.entries), tl.entries)
	}
	first := tl.entries[0]
	if first.n != 3 || !first.at.Equal(at(0)) || !first.last.Equal(at(20)) {
		t.Fatalf("the folded entry: n=%d from %v to %v; want 3 from +0 to +20 ms",
			first.n, first.at.Sub(t0), first.last.Sub(t0))
	}
}

// since lists what began within its window, by the entry's first time:
// a fold that began before the fault is left out even if it went on past
// it, and what came after the repair is left out too.
func TestTimelineSinceWindow(t *testing.T) {
	var tl timeline
	tl.add(at(-200), "ack")
	tl.add(at(100), "ack") // folded into the entry at -200
	tl.add(at(200), "abandon")
	tl.add(at(1500), "dialled a")
	tl.add(at(2500), "repair")
	tl.add(at(3000), "ack")
	for _, tc := range []struct {
		name     string
		from, to int
		want     string
	}{
		{"fault to repair", 0, 2500, "+0.20s abandon, +1.50s dialled a, +2.50s repair"},
		{"an empty window", 300, 1400, ""},
		{"from before the first", -300, 200, "+0.10s ack ×2, +0.50s abandon"},
	} {
		if got := tl.since(at(tc.from), at(tc.to)); got != tc.want {
			t.Errorf("%s: since(%d, %d) = %q, want %q", tc.name, tc.from, tc.to, got, tc.want)
		}
	}
}

// The client's share after a nack storm: from the storm's last nack to
// the resume, none if no nack came from the fault on.
func TestTimelineSinceLast(t *testing.T) {
	var tl timeline
	tl.add(at(-50), "nack") // before the fault: not this fault's storm
	tl.add(at(300), "abandon")
	tl.add(at(400), "nack")
	tl.add(at(700), "nack")
	for _, tc := range []struct {
		name     string
		from, to int
		want     time.Duration
		ok       bool
	}{
		{"resumed after the storm", 0, 1000, 300 * time.Millisecond, true},
		{"resumed at the last nack", 0, 700, 0, true},
		{"resumed before the storm", 0, 350, 0, false},
		{"a window reaching back to an earlier nack", -100, 100, 150 * time.Millisecond, true},
	} {
		got, ok := tl.sinceLast("nack", at(tc.from), at(tc.to))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: sinceLast = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// event keeps what explains a gap and drops what follows from it.
func TestTimelineEventFilter(t *testing.T) {
	var tl timeline
	for i, k := range []failover.EventKind{
		failover.EventConnectionLost, failover.EventDialFailed, failover.EventConnected,
		failover.EventRepublish, failover.EventAbandon, failover.EventAbandoned,
		failover.EventNack, failover.EventChannelReopen,
	} {
		tl.event(failover.Event{Kind: k, Time: at(100 * i)})
	}
	want := "+0.00s connection-lost, +0.20s connected, +0.40s abandon, +0.60s nack, " +
		"+0.70s channel-reopen"
	if got := tl.since(at(0), at(1000)); got != want {
		t.Fatalf("since = %q, want %q", got, want)
	}
}
