package nemesis

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

func TestMain(m *testing.M) {
	MaybeRunWorkload() // a child that runs a workload exits here
	testenv.Main(m)
}

// The same seed and options give the same schedule; another seed, another.
func TestGenerateReplaysASeed(t *testing.T) {
	o := Options{Duration: 10 * time.Minute}
	first, again := Generate(42, o), Generate(42, o)
	if !reflect.DeepEqual(first, again) {
		t.Fatalf("seed 42 twice:\n%s\n%s", first, again)
	}
	if len(first.Actions) < 10 {
		t.Fatalf("seed 42 drew %d faults in 10 minutes, want at least 10:\n%s", len(first.Actions), first)
	}
	if other := Generate(43, o); reflect.DeepEqual(first.Actions, other.Actions) {
		t.Fatalf("seeds 42 and 43 drew the same schedule:\n%s", first)
	}
	if s := first.String(); !strings.HasPrefix(s, "nemesis: seed 42,") ||
		strings.Count(s, "\n") != len(first.Actions)+1 {
		t.Fatalf("String: want a header and one line per fault, got:\n%s", s)
	}
}

// Over many seeds: at every moment at most one node is out and at most
// MaxActive faults are active; every fault ends within the duration and
// is held within its kind's range; every kind is drawn.
func TestGenerateKeepsTheBound(t *testing.T) {
	o := Options{Duration: 10 * time.Minute, MeanGap: 5 * time.Second}.withDefaults()
	drawn := map[Kind]int{}
	for seed := range uint64(200) {
		s := Generate(seed, o)
		for _, a := range s.Actions {
			drawn[a.Kind]++
			checkAction(t, s, a)
			// The moments the counts can peak: each start. A node
			// counts as out until its rejoin time after the heal.
			active, out := len(s.Active(a.Start)), 0
			for _, b := range s.Actions {
				if _, ok := b.out(); ok && b.Start <= a.Start && a.Start < b.End()+rejoin[b.Kind] {
					out++
				}
			}
			if active > o.MaxActive || out > 1 {
				t.Fatalf("seed %d at %v: %d active, %d nodes out; want ≤ %d and ≤ 1:\n%s",
					seed, a.Start, active, out, o.MaxActive, s)
			}
		}
	}
	for _, k := range Kinds {
		if drawn[k] == 0 {
			t.Errorf("kind %s never drawn in 200 seeds", k)
		}
	}
}

// checkAction checks one action's targets, hold and end.
func checkAction(t *testing.T, s Schedule, a Action) {
	t.Helper()
	lo, hi := holdRange(a.Kind, s.Options)
	if a.Hold < lo.Round(100*time.Millisecond) || a.Hold > hi.Round(100*time.Millisecond) || a.End() > s.Options.Duration {
		t.Fatalf("seed %d: %v: hold outside [%v, %v] or ends past %v", s.Seed, a, lo, hi, s.Options.Duration)
	}
	want := map[Kind]int{Bridge: 2, ClientLink: 0, FreezeClient: 0}
	n, ok := want[a.Kind]
	if !ok {
		n = 1
	}
	if len(a.Nodes) != n || (n == 0) != (a.Client != "") {
		t.Fatalf("seed %d: %v: %d nodes, client %q", s.Seed, a, len(a.Nodes), a.Client)
	}
	if n == 2 && a.Nodes[0] == a.Nodes[1] {
		t.Fatalf("seed %d: %v: a bridge between a node and itself", s.Seed, a)
	}
}

// A frozen node is held 1–20 s, a frozen client 2.5–5 heartbeats.
func TestHoldRanges(t *testing.T) {
	o := Options{Heartbeat: 2 * time.Second}.withDefaults()
	if lo, hi := holdRange(FreezeNode, o); lo != time.Second || hi != 20*time.Second {
		t.Errorf("freeze-node holds %v–%v, want 1s–20s", lo, hi)
	}
	if lo, hi := holdRange(FreezeClient, o); lo != 5*time.Second || hi != 10*time.Second {
		t.Errorf("freeze-client holds %v–%v, want 5s–10s", lo, hi)
	}
}

// A synthetic history: one message confirmed and never consumed is lost,
// with its story; the others are counted where they belong.
func TestCheckReportsALoss(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	s := Schedule{Options: Options{}.withDefaults(), Actions: []Action{
		{Kind: FreezeNode, Nodes: []cluster.Node{cluster.B}, Start: 10 * time.Second, Hold: 12 * time.Second},
		{Kind: ClientLink, Client: "workload/p1", Start: 40 * time.Second, Hold: 5 * time.Second},
	}}
	h := History{Start: t0, Stale: 2, Messages: []Message{
		{ID: "ok", Publisher: "p1", Publishes: []Publish{{at(1), cluster.B, "b/1"}}, Confirmed: true, ConfirmedAt: at(1.01), ConfirmedGen: "b/1", Deliveries: times(1)},
		{ID: "lost", Publisher: "p1", Publishes: []Publish{{at(11), cluster.B, "b/1"}, {at(13), cluster.C, "c/1"}},
			Confirmed: true, ConfirmedAt: at(17), ConfirmedGen: "c/2"},
		{ID: "mid", Publisher: "p1", Publishes: []Publish{{at(29.9), cluster.C, "c/2"}}, Confirmed: true, ConfirmedAt: at(30), ConfirmedGen: "c/2", Deliveries: times(1)},
		{ID: "dup", Publisher: "p1", Publishes: []Publish{{at(41), cluster.C, "c/2"}}, Confirmed: true, ConfirmedAt: at(46), ConfirmedGen: "c/3", Deliveries: times(3)},
		{ID: "gave-up", Publisher: "p1", Publishes: []Publish{{at(42), cluster.C, "c/2"}}, Err: "failover: gave up", Deliveries: times(1)},
		{ID: "nacked", Publisher: "p1", Publishes: []Publish{{at(43), cluster.C, "c/2"}}, Err: "failover: nacked"},
	}}
	h.Clients = map[string][]Event{"p1": {
		{Kind: "fo", T: at(12.5).UnixNano(), Err: "abandon: no confirmation"},
		{Kind: "dial", T: at(12.9).UnixNano(), Node: "c"},
		{Kind: "dial", T: at(50).UnixNano(), Node: "a"}, // after the confirm: not in the story
	}}
	rep := Check(h, s)
	if rep.Published != 6 || rep.Confirmed != 4 || rep.Lost != 1 || rep.Duplicates != 2 ||
		rep.UnconfirmedDelivered != 1 || rep.Stale != 2 || len(rep.Failed) != 2 {
		t.Fatalf("report %+v", rep)
	}
	want := "lost lost: published 11.00s on b (gen b/1), during freeze-node b 10.00s–22.00s;" +
		" published 13.00s on c (gen c/1), during freeze-node b 10.00s–22.00s;" +
		" confirmed 17.00s by gen c/2, during freeze-node b 10.00s–22.00s; never consumed;" +
		" 12.50s: p1 fo abandon: no confirmation; 12.90s: p1 dial c"
	if len(rep.LostHistories) != 1 || rep.LostHistories[0] != want {
		t.Fatalf("lost histories %q, want [%q]", rep.LostHistories, want)
	}
	// Confirms at 1.01, 17, 30 and 46 s: the freeze overlaps the first two
	// gaps, the cut link the third.
	if got := rep.LongestGap[FreezeNode]; got != 15990*time.Millisecond {
		t.Errorf("longest gap during freeze-node %v, want 15.99s", got)
	}
	if got := rep.LongestGap[ClientLink]; got != 16*time.Second {
		t.Errorf("longest gap during client-link %v, want 16s", got)
	}
}

// ReadHistory turns a workload's events into messages: publishes with
// their node and channel generation, how each Publish ended, deliveries;
// the end event's failed acks count as stale settlements.
func TestReadHistory(t *testing.T) {
	t0 := time.Unix(1000, 0)
	lines := strings.Join([]string{
		`{"k":"dial","t":999000000000,"c":"p1","n":"b","g":"1.0"}`,
		`{"k":"pub","id":"m-1","t":1000000000000,"c":"p1","n":"b","g":"1.1"}`,
		`{"k":"pub","id":"m-2","t":1001000000000,"c":"p1","n":"b","g":"1.1"}`,
		`{"k":"ok","id":"m-1","t":1002000000000,"c":"p1","n":"b","g":"1.1"}`,
		`{"k":"err","id":"m-2","t":1003000000000,"err":"failover: gave up"}`,
		`{"k":"got","id":"m-1","t":1004000000000,"c":"c1"}`,
		`{"k":"got","id":"m-1","t":1005000000000,"c":"drain"}`,
		`{"k":"end","t":1006000000000,"end":{"AckErrors":2,"GoroutinesBefore":3,"GoroutinesAfter":3}}`,
	}, "\n")
	h, err := ReadHistory(strings.NewReader(lines), t0)
	if err != nil {
		t.Fatal(err)
	}
	want := []Message{
		{ID: "m-1", Publisher: "p1", Publishes: []Publish{{At: t0, Node: cluster.B, Gen: "1.1"}}, Confirmed: true,
			ConfirmedAt: t0.Add(2 * time.Second), ConfirmedGen: "b/1.1",
			Deliveries: []time.Time{t0.Add(4 * time.Second), t0.Add(5 * time.Second)}},
		{ID: "m-2", Publisher: "p1", Publishes: []Publish{{At: t0.Add(time.Second), Node: cluster.B, Gen: "1.1"}}, Err: "failover: gave up"},
	}
	if !reflect.DeepEqual(h.Messages, want) {
		t.Fatalf("history %+v, want %+v", h.Messages, want)
	}
	if h.Stale != 2 || len(h.Ends) != 1 {
		t.Fatalf("stale %d, ends %+v; want 2 and the one end", h.Stale, h.Ends)
	}
	if _, err := ReadHistory(strings.NewReader("not json"), t0); err == nil {
		t.Fatal("a malformed line parsed")
	}
}

// times is n delivery times (their values do not matter to Check).
func times(n int) []time.Time { return make([]time.Time, n) }

// A workload's view of a schedule keeps the node faults and its own
// client faults, and drops the other workloads'.
func TestScheduleFor(t *testing.T) {
	s := Schedule{Actions: []Action{
		{Kind: Kill, Nodes: []cluster.Node{cluster.A}},
		{Kind: ClientLink, Client: "drainer/p1"},
		{Kind: ClientLink, Client: "upstream/p1"},
		{Kind: FreezeClient, Client: "drainer"},
		{Kind: FreezeClient, Client: "drainer-blocking"},
	}}
	var got []string
	for _, a := range s.For("drainer").Actions {
		got = append(got, string(a.Kind)+" "+a.target())
	}
	if want := "kill a, client-link drainer/p1, freeze-client drainer"; strings.Join(got, ", ") != want {
		t.Fatalf("For(drainer) = %q, want %q", strings.Join(got, ", "), want)
	}
}

// A gap counts for its fault's kind only when every fault it overlaps is
// of that kind; one that overlaps two kinds counts under Overlap.
func TestLongestGapPerKind(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	s := Schedule{Actions: []Action{
		{Kind: FreezeNode, Nodes: []cluster.Node{cluster.B}, Start: 2 * time.Second, Hold: 6 * time.Second},
		{Kind: Kill, Nodes: []cluster.Node{cluster.C}, Start: 12 * time.Second, Hold: 13 * time.Second},
		{Kind: ClientLink, Client: "workload", Start: 30 * time.Second, Hold: 2 * time.Second},
	}}
	var h History
	h.Start = t0
	for i, at := range []float64{0, 10, 22, 35} {
		h.Messages = append(h.Messages, Message{ID: fmt.Sprint(i), Confirmed: true,
			ConfirmedAt: t0.Add(time.Duration(at) * time.Second), Deliveries: times(1)})
	}
	got := Check(h, s).LongestGap
	want := map[Kind]time.Duration{FreezeNode: 10 * time.Second, Kill: 12 * time.Second, Overlap: 13 * time.Second}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("longest gaps %v, want %v", got, want)
	}
}

// Gaps are a publisher's: p1 stalls through the cut of its own link while
// p2 goes on confirming, and the cut of c1's link is not charged to p1.
func TestLongestGapPerPublisher(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	s := Schedule{Actions: []Action{
		{Kind: ClientLink, Client: "drainer/p1", Start: 5 * time.Second, Hold: 3 * time.Second},
		{Kind: ClientLink, Client: "drainer/c1", Start: 20 * time.Second, Hold: 3 * time.Second},
	}}
	h := History{Start: t0}
	confirm := func(pub string, at float64) {
		h.Messages = append(h.Messages, Message{ID: fmt.Sprintf("%s-%v", pub, at), Publisher: pub, Confirmed: true,
			ConfirmedAt: t0.Add(time.Duration(at * float64(time.Second))), Deliveries: times(1)})
	}
	for at := 0.0; at < 30; at++ {
		confirm("p2", at)
		if at < 4 || at > 10 && at < 19 || at > 25 {
			confirm("p1", at)
		}
	}
	got := Check(h, s).LongestGap
	if want := map[Kind]time.Duration{ClientLink: 8 * time.Second}; !reflect.DeepEqual(got, want) {
		t.Fatalf("longest gaps %v, want %v (p1's 3 s to 11 s; 18 s to 26 s overlaps only c1's cut)", got, want)
	}
}
