package nemesis

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

func TestMain(m *testing.M) {
	if cfg := os.Getenv(workloadEnv); cfg != "" {
		os.Exit(runWorkload(cfg)) // the frozen-client test's child
	}
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
			// The moments the count can peak: each start.
			active, out := 0, 0
			for _, b := range s.Active(a.Start) {
				active++
				if _, ok := b.out(); ok {
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
		{Kind: ClientLink, Client: "workload", Start: 40 * time.Second, Hold: 5 * time.Second},
	}}
	h := History{Start: t0, Stale: 2, Messages: []Message{
		{ID: "ok", Publishes: []Publish{{at(1), cluster.B, "b/1"}}, Confirmed: true, ConfirmedAt: at(1.01), ConfirmedGen: "b/1", Deliveries: 1},
		{ID: "lost", Publishes: []Publish{{at(11), cluster.B, "b/1"}, {at(13), cluster.C, "c/1"}},
			Confirmed: true, ConfirmedAt: at(17), ConfirmedGen: "c/2"},
		{ID: "mid", Publishes: []Publish{{at(29.9), cluster.C, "c/2"}}, Confirmed: true, ConfirmedAt: at(30), ConfirmedGen: "c/2", Deliveries: 1},
		{ID: "dup", Publishes: []Publish{{at(41), cluster.C, "c/2"}}, Confirmed: true, ConfirmedAt: at(46), ConfirmedGen: "c/3", Deliveries: 3},
		{ID: "gave-up", Publishes: []Publish{{at(42), cluster.C, "c/2"}}, Err: "failover: gave up", Deliveries: 1},
		{ID: "nacked", Publishes: []Publish{{at(43), cluster.C, "c/2"}}, Err: "failover: nacked"},
	}}
	rep := Check(h, s)
	if rep.Published != 6 || rep.Confirmed != 4 || rep.Lost != 1 || rep.Duplicates != 2 ||
		rep.UnconfirmedDelivered != 1 || rep.Stale != 2 || len(rep.Failed) != 2 {
		t.Fatalf("report %+v", rep)
	}
	want := "lost lost: published 11.00s on b (gen b/1), during freeze-node b 10.00s–22.00s;" +
		" published 13.00s on c (gen c/1), during freeze-node b 10.00s–22.00s;" +
		" confirmed 17.00s by gen c/2, during freeze-node b 10.00s–22.00s; never consumed"
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

// A workload's events become a History: publishes, the end of each
// Publish, deliveries; the stats line is not a message.
func TestReadHistory(t *testing.T) {
	t0 := time.Unix(1000, 0)
	lines := strings.Join([]string{
		`{"k":"pub","id":"m-1","t":1000000000000}`,
		`{"k":"pub","id":"m-2","t":1001000000000}`,
		`{"k":"ok","id":"m-1","t":1002000000000}`,
		`{"k":"err","id":"m-2","t":1003000000000,"err":"failover: gave up"}`,
		`{"k":"got","id":"m-1","t":1004000000000}`,
		`{"k":"got","id":"m-1","t":1005000000000}`,
		`{"k":"stats","t":1006000000000,"err":"publisher {...}"}`,
	}, "\n")
	h, err := ReadHistory(strings.NewReader(lines), t0)
	if err != nil {
		t.Fatal(err)
	}
	want := []Message{
		{ID: "m-1", Publishes: []Publish{{At: t0}}, Confirmed: true, ConfirmedAt: t0.Add(2 * time.Second), Deliveries: 2},
		{ID: "m-2", Publishes: []Publish{{At: t0.Add(time.Second)}}, Err: "failover: gave up"},
	}
	if !reflect.DeepEqual(h.Messages, want) {
		t.Fatalf("history %+v, want %+v", h.Messages, want)
	}
	if _, err := ReadHistory(strings.NewReader("not json"), t0); err == nil {
		t.Fatal("a malformed line parsed")
	}
}
