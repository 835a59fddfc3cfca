package clusterfaults

import (
	"context"
	"errors"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
)

// judge turns each run's books into its Result, without a cluster: the
// resume and gap from the fault, the ledger, the consumer's resume from
// the injection, the timed Close of its own variant, and the repair's
// note and error in every Result.
func TestCellJudge(t *testing.T) {
	legacy := Variant{Name: "legacy"}
	cfg := Config{Variants: []Variant{upstream, drainer, legacy}}
	cfg.defaults()
	f := Fault{ID: "5+7", CloseDuring: true}
	k := newCell(cfg, f, 3)
	k.tInject = at(-100)
	k.tFault = at(0)
	k.tRepair = at(5000)
	k.repairNote = "restarted b's app"
	k.repairErr = errors.New("b did not come back")

	up, dr, le := k.runs[0], k.runs[1], k.runs[2]
	// upstream: resumed at +1.2 s with a 4 s gap before the repair; one
	// message lost, one nack.
	up.b = bookOf(map[string]int{"u1": -500, "u2": 200, "u3": 300},
		map[string]int{"u1": -400, "u2": 1200, "u3": 1300}, map[string]int{"u1": 1, "u3": 1})
	up.b.confirms = []time.Time{at(-400), at(1000), at(1200)}
	up.b.nacks = 1
	// drainer: never resumed; its consumer consumed again at +300 ms and
	// got a delivery at +700 ms.
	dr.b = bookOf(map[string]int{"d1": -500}, map[string]int{"d1": -400}, map[string]int{"d1": 2})
	dr.cl.consuming = []time.Time{at(-9000), at(300)}
	dr.cl.delivered = []time.Time{at(-50), at(700)}
	// legacy: failed on its own.
	le.err = errors.New("consumer: gone")
	k.closers = []*stalledConn{{r: dr, took: 2100 * time.Millisecond, errText: "closed"}}

	res := k.judge()
	if len(res) != 3 {
		t.Fatalf("%d results, want 3", len(res))
	}
	for i, r := range res {
		if r.Fault.ID != "5+7" || r.Round != 3 || r.Variant != cfg.Variants[i] {
			t.Errorf("result %d is for fault %s round %d %s", i, r.Fault.ID, r.Round, r.Variant.Name)
		}
		if r.RepairNote != "restarted b's app" || !errors.Is(r.Err, k.repairErr) {
			t.Errorf("%s: repair note %q, error %v; want the repair's", r.Variant.Name,
				r.RepairNote, r.Err)
		}
		if r.Timeline != "" {
			t.Errorf("%s: a timeline without a failover publisher: %q", r.Variant.Name, r.Timeline)
		}
	}
	u, d, l := res[0], res[1], res[2]
	if !u.Resumed || u.Resume != 1200*time.Millisecond || u.MaxGap != 3800*time.Millisecond {
		t.Errorf("upstream: resumed %v after %v, gap %v; want +1.2 s, 3.8 s",
			u.Resumed, u.Resume, u.MaxGap)
	}
	if u.Published != 3 || u.Confirmed != 3 || u.Lost != 1 ||
		!reflect.DeepEqual(u.LostIDs, []string{"u2"}) || u.Nacks != 1 {
		t.Errorf("upstream's ledger: %d of %d confirmed, %d lost %v, %d nacks; want 3 of 3, 1 [u2], 1",
			u.Confirmed, u.Published, u.Lost, u.LostIDs, u.Nacks)
	}
	if d.Resumed || d.MaxGap != 5*time.Second || d.Duplicates != 1 {
		t.Errorf("drainer: resumed %v, gap %v, %d duplicates; want no resume, the whole window, 1",
			d.Resumed, d.MaxGap, d.Duplicates)
	}
	if !d.ConsumerResumed || d.ConsumerResume != 800*time.Millisecond || d.ConsumerReconnects != 1 {
		t.Errorf("drainer's consumer: resumed %v after %v, %d reconsumes; want +800 ms from the "+
			"injection, 1", d.ConsumerResumed, d.ConsumerResume, d.ConsumerReconnects)
	}
	if d.Close != 2100*time.Millisecond || d.CloseErr != "closed" || u.Close != 0 || l.Close != 0 {
		t.Errorf("Close: %v %q for drainer, %v and %v for the others; want only drainer's",
			d.Close, d.CloseErr, u.Close, l.Close)
	}
	if !errors.Is(l.Err, le.err) || errors.Is(d.Err, le.err) {
		t.Errorf("legacy's own failure: %v in legacy, %v in drainer", l.Err, d.Err)
	}
}

// A cell that could not declare its queues fails every variant with the
// same error, and measures nothing.
func TestCellFailAll(t *testing.T) {
	cfg := Config{}
	cfg.defaults()
	k := newCell(cfg, Fault{ID: "1"}, 1)
	err := errors.New("declaring on a: refused")
	for _, r := range k.failAll(err) {
		if r.Err != err || r.Resumed || r.Published != 0 {
			t.Errorf("%s: %+v", r.Variant.Name, r)
		}
	}
}

// Every variant of every cell gets a queue of its own, named for the fault
// (its "+" dropped), the round and the variant.
func TestQueueName(t *testing.T) {
	got := queueName(Fault{ID: "5+7"}, 2, drainer)
	if !strings.HasPrefix(got, "clusterfaults-57-r2-drainer-") {
		t.Fatalf("queueName = %q", got)
	}
	cfg := Config{}
	cfg.defaults()
	k := newCell(cfg, Fault{ID: "1"}, 1)
	seen := map[string]bool{}
	for _, r := range k.runs {
		if seen[r.queue] {
			t.Fatalf("two variants share queue %s", r.queue)
		}
		seen[r.queue] = true
	}
}

// urlsFrom starts the dial list at the fault's chosen node and keeps the
// cluster's order after it; nodeOf finds the node a connection landed on.
func TestURLsFromAndNodeOf(t *testing.T) {
	var c cluster.Cluster // the URLs are fixed: a zero Cluster knows them
	all := c.URLs()
	for _, tc := range []struct {
		first cluster.Node
		want  []string
	}{
		{cluster.A, all},
		{cluster.B, []string{all[1], all[2], all[0]}},
		{cluster.C, []string{all[2], all[0], all[1]}},
	} {
		if got := urlsFrom(&c, tc.first); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("urlsFrom(%s) = %v, want %v", tc.first, got, tc.want)
		}
	}
	for _, n := range cluster.Nodes {
		host := strings.TrimSuffix(strings.TrimPrefix(c.URL(n), "amqp://guest:guest@"), "/")
		addr, err := net.ResolveTCPAddr("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		if got := nodeOf(&c, addr); got != n {
			t.Errorf("nodeOf(%v) = %q, want %s", addr, got, n)
		}
	}
	if got := nodeOf(&c, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5672}); got != "" {
		t.Errorf("nodeOf(the system broker) = %q", got)
	}
	if got := nodeOf(&c, nil); got != "" {
		t.Errorf("nodeOf(nil) = %q", got)
	}
}

// WaitFor reports whether its condition came to hold: at once, after a
// few polls, or not before its bound or its context's end.
func TestWaitFor(t *testing.T) {
	ctx := context.Background()
	if !WaitFor(ctx, time.Minute, func() bool { return true }) {
		t.Error("a condition that holds at once was not seen")
	}
	polls := 0
	if !WaitFor(ctx, time.Minute, func() bool { polls++; return polls == 3 }) || polls != 3 {
		t.Errorf("held at the 3rd poll: WaitFor saw it after %d", polls)
	}
	if WaitFor(ctx, 50*time.Millisecond, func() bool { return false }) {
		t.Error("a condition that never holds was reported held")
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	t0 := time.Now()
	if WaitFor(cancelled, time.Minute, func() bool { return false }) {
		t.Error("held after its context ended")
	}
	if d := time.Since(t0); d > 30*time.Second {
		t.Errorf("an ended context kept WaitFor for %v", d)
	}
}
