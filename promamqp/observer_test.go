package promamqp_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/amqp091-drainer/amqp091-drainer/promamqp"
)

// observerMetrics are the families the Observer feeds; the unit tests
// compare exactly these, so that the Stats families (absent here: nothing
// is watched) do not need listing.
var observerMetrics = []string{
	"amqp091_published_total",
	"amqp091_publish_errors_total",
	"amqp091_confirmed_total",
	"amqp091_confirm_latency_seconds",
	"amqp091_returned_total",
	"amqp091_delivered_total",
	"amqp091_handler_seconds",
	"amqp091_handler_errors_total",
	"amqp091_settled_total",
	"amqp091_rpc_seconds",
	"amqp091_rpc_errors_total",
	"amqp091_budget_pauses_total",
	"amqp091_budget_pause_duration_seconds",
	"amqp091_listeners_dropped_total",
	"amqp091_connection_events_total",
}

// runWorkload calls every Observer func a known number of times, with
// durations chosen to land in known buckets of 1ms, 10ms, 100ms.
func runWorkload(obs *amqp.Observer) {
	ctx := context.Background()
	failed := errors.New("failed")
	pi := amqp.PublishInfo{Channel: 1, RoutingKey: "q", BodySize: 10}

	for range 5 {
		obs.Published(ctx, pi, nil)
	}
	obs.Published(ctx, pi, failed)
	obs.Published(ctx, pi, amqp.ErrClosed)

	obs.Confirmed(amqp.ConfirmInfo{DeliveryTag: 1, Ack: true, Latency: 500 * time.Microsecond}) // le 0.001
	obs.Confirmed(amqp.ConfirmInfo{DeliveryTag: 2, Ack: true, Latency: 5 * time.Millisecond})   // le 0.01
	obs.Confirmed(amqp.ConfirmInfo{DeliveryTag: 3, Ack: true, Latency: 50 * time.Millisecond})  // le 0.1
	obs.Confirmed(amqp.ConfirmInfo{DeliveryTag: 4, Ack: false})                                 // latency unknown: not observed

	obs.Returned(&amqp.Return{ReplyCode: 312})

	d := &amqp.Delivery{DeliveryTag: 1, Body: []byte("x")}
	for range 4 {
		obs.Delivered(d)
	}
	obs.Handled(d, 2*time.Millisecond, nil)      // le 0.01
	obs.Handled(d, 200*time.Millisecond, failed) // +Inf

	obs.Settled(amqp.SettleInfo{Kind: amqp.SettleAck, DeliveryTag: 1})
	obs.Settled(amqp.SettleInfo{Kind: amqp.SettleAck, DeliveryTag: 3, Multiple: true})
	obs.Settled(amqp.SettleInfo{Kind: amqp.SettleNack, DeliveryTag: 4, Requeue: true})
	obs.Settled(amqp.SettleInfo{Kind: amqp.SettleReject, DeliveryTag: 5})

	obs.RPC(amqp.RPCInfo{Channel: 1, Method: "queue.declare", Latency: time.Millisecond})             // le 0.001 (bounds are inclusive)
	obs.RPC(amqp.RPCInfo{Channel: 1, Method: "queue.declare", Latency: 2 * time.Second, Err: failed}) // +Inf
	obs.RPC(amqp.RPCInfo{Channel: 1, Method: "", Latency: 20 * time.Millisecond, Err: failed})        // other, le 0.1

	info := amqp.BudgetInfo{Limit: 1 << 20, Used: 1 << 20}
	obs.BudgetPaused(info)
	info.Paused = 30 * time.Millisecond // le 0.1
	obs.BudgetResumed(info)
	obs.BudgetPaused(info)

	obs.ListenerDropped(amqp.ListenerStats{Kind: amqp.KindNotifyPublish, Channel: 1})

	obs.Connection(amqp.ConnectionEvent{Kind: amqp.ConnectionOpened, Mode: "drainer"})
	obs.Connection(amqp.ConnectionEvent{Kind: amqp.ConnectionFailed, Mode: "drainer", Err: failed})
	obs.Connection(amqp.ConnectionEvent{Kind: amqp.ConnectionRecovered, Mode: "drainer"})
	obs.Connection(amqp.ConnectionEvent{Kind: amqp.ConnectionClosed, Mode: "drainer"})
}

// wantWorkload is runWorkload's exposition, worked out by hand from the
// calls' comments (the HELP lines are the Collector's own).
const wantWorkload = `
# HELP amqp091_budget_pause_duration_seconds How long each pause of reading for the budget lasted, observed when reading resumed.
# TYPE amqp091_budget_pause_duration_seconds histogram
amqp091_budget_pause_duration_seconds_bucket{le="0.001"} 0
amqp091_budget_pause_duration_seconds_bucket{le="0.01"} 0
amqp091_budget_pause_duration_seconds_bucket{le="0.1"} 1
amqp091_budget_pause_duration_seconds_bucket{le="+Inf"} 1
amqp091_budget_pause_duration_seconds_sum 0.03
amqp091_budget_pause_duration_seconds_count 1
# HELP amqp091_budget_pauses_total Times the drainer stopped reading the socket because its memory budget was full.
# TYPE amqp091_budget_pauses_total counter
amqp091_budget_pauses_total 2
# HELP amqp091_confirm_latency_seconds Time from writing a publish to its confirm arriving; publishes whose latency the client does not know are left out.
# TYPE amqp091_confirm_latency_seconds histogram
amqp091_confirm_latency_seconds_bucket{le="0.001"} 1
amqp091_confirm_latency_seconds_bucket{le="0.01"} 2
amqp091_confirm_latency_seconds_bucket{le="0.1"} 3
amqp091_confirm_latency_seconds_bucket{le="+Inf"} 3
amqp091_confirm_latency_seconds_sum 0.0555
amqp091_confirm_latency_seconds_count 3
# HELP amqp091_confirmed_total Publishes the broker confirmed in confirm mode, one per delivery tag, by outcome (ack or nack).
# TYPE amqp091_confirmed_total counter
amqp091_confirmed_total{outcome="ack"} 3
amqp091_confirmed_total{outcome="nack"} 1
# HELP amqp091_connection_events_total Events in the lives of connections: opened, recovered, closed (by the application), failed.
# TYPE amqp091_connection_events_total counter
amqp091_connection_events_total{kind="closed"} 1
amqp091_connection_events_total{kind="failed"} 1
amqp091_connection_events_total{kind="opened"} 1
amqp091_connection_events_total{kind="recovered"} 1
# HELP amqp091_delivered_total Consumer deliveries (basic.deliver) read from the socket, counted as they are decoded, before they are queued for the application.
# TYPE amqp091_delivered_total counter
amqp091_delivered_total 4
# HELP amqp091_handler_errors_total ConsumeFunc handler runs that returned an error.
# TYPE amqp091_handler_errors_total counter
amqp091_handler_errors_total 1
# HELP amqp091_handler_seconds How long ConsumeFunc handlers ran; its _count is the number of deliveries handled, errors included.
# TYPE amqp091_handler_seconds histogram
amqp091_handler_seconds_bucket{le="0.001"} 0
amqp091_handler_seconds_bucket{le="0.01"} 1
amqp091_handler_seconds_bucket{le="0.1"} 1
amqp091_handler_seconds_bucket{le="+Inf"} 2
amqp091_handler_seconds_sum 0.202
amqp091_handler_seconds_count 2
# HELP amqp091_listeners_dropped_total Listeners closed by the stall policy (DrainerOptions.DropStalledListener).
# TYPE amqp091_listeners_dropped_total counter
amqp091_listeners_dropped_total 1
# HELP amqp091_publish_errors_total Publishes that returned an error (closed channel, cancelled context, failed write).
# TYPE amqp091_publish_errors_total counter
amqp091_publish_errors_total 2
# HELP amqp091_published_total Messages written to the socket by PublishWithContext and PublishWithDeferredConfirmWithContext; failed publishes are in amqp091_publish_errors_total instead.
# TYPE amqp091_published_total counter
amqp091_published_total 5
# HELP amqp091_returned_total Messages the broker returned as unroutable (basic.return).
# TYPE amqp091_returned_total counter
amqp091_returned_total 1
# HELP amqp091_rpc_errors_total Synchronous methods that failed (timeout, cancelled context, closed channel or connection), by method.
# TYPE amqp091_rpc_errors_total counter
amqp091_rpc_errors_total{method="other"} 1
amqp091_rpc_errors_total{method="queue.declare"} 1
# HELP amqp091_rpc_seconds Time from writing a synchronous method to its reply, by the request's method; its _count includes the failed calls.
# TYPE amqp091_rpc_seconds histogram
amqp091_rpc_seconds_bucket{method="other",le="0.001"} 0
amqp091_rpc_seconds_bucket{method="other",le="0.01"} 0
amqp091_rpc_seconds_bucket{method="other",le="0.1"} 1
amqp091_rpc_seconds_bucket{method="other",le="+Inf"} 1
amqp091_rpc_seconds_sum{method="other"} 0.02
amqp091_rpc_seconds_count{method="other"} 1
amqp091_rpc_seconds_bucket{method="queue.declare",le="0.001"} 1
amqp091_rpc_seconds_bucket{method="queue.declare",le="0.01"} 1
amqp091_rpc_seconds_bucket{method="queue.declare",le="0.1"} 1
amqp091_rpc_seconds_bucket{method="queue.declare",le="+Inf"} 2
amqp091_rpc_seconds_sum{method="queue.declare"} 2.001
amqp091_rpc_seconds_count{method="queue.declare"} 2
# HELP amqp091_settled_total Ack, Nack and Reject frames written, by kind; a call with multiple=true counts once.
# TYPE amqp091_settled_total counter
amqp091_settled_total{kind="ack"} 2
amqp091_settled_total{kind="nack"} 1
amqp091_settled_total{kind="reject"} 1
`

func TestObserverCounters(t *testing.T) {
	c := promamqp.New(promamqp.WithBuckets(0.001, 0.01, 0.1))
	runWorkload(c.Observer())
	if err := testutil.CollectAndCompare(c, strings.NewReader(wantWorkload), observerMetrics...); err != nil {
		t.Fatal(err)
	}
}

// TestObserverAllocs checks the promise the Observer's funcs make to the
// client's fast paths: no allocation per event, whatever the event.
func TestObserverAllocs(t *testing.T) {
	obs := promamqp.New().Observer()
	ctx := context.Background()
	failed := errors.New("failed")
	pi := amqp.PublishInfo{Channel: 1}
	d := &amqp.Delivery{DeliveryTag: 1}
	ret := &amqp.Return{}

	calls := []struct {
		name string
		f    func()
	}{
		{"Published", func() { obs.Published(ctx, pi, nil) }},
		{"Published/err", func() { obs.Published(ctx, pi, failed) }},
		{"Confirmed/ack", func() { obs.Confirmed(amqp.ConfirmInfo{Ack: true, Latency: time.Millisecond}) }},
		{"Confirmed/nack", func() { obs.Confirmed(amqp.ConfirmInfo{}) }},
		{"Returned", func() { obs.Returned(ret) }},
		{"Delivered", func() { obs.Delivered(d) }},
		{"Handled", func() { obs.Handled(d, time.Millisecond, nil) }},
		{"Handled/err", func() { obs.Handled(d, time.Second, failed) }},
		{"Settled/ack", func() { obs.Settled(amqp.SettleInfo{Kind: amqp.SettleAck}) }},
		{"Settled/reject", func() { obs.Settled(amqp.SettleInfo{Kind: amqp.SettleReject}) }},
		{"Settled/unknown-kind", func() { obs.Settled(amqp.SettleInfo{Kind: 200}) }},
		{"RPC", func() { obs.RPC(amqp.RPCInfo{Method: "basic.qos", Latency: time.Millisecond}) }},
		{"RPC/other", func() { obs.RPC(amqp.RPCInfo{Method: "no.such-method", Err: failed}) }},
		{"BudgetPaused", func() { obs.BudgetPaused(amqp.BudgetInfo{Limit: 1}) }},
		{"BudgetResumed", func() { obs.BudgetResumed(amqp.BudgetInfo{Paused: time.Second}) }},
		{"ListenerDropped", func() { obs.ListenerDropped(amqp.ListenerStats{Kind: amqp.KindNotifyReturn}) }},
		{"Connection", func() { obs.Connection(amqp.ConnectionEvent{Kind: amqp.ConnectionRecovered}) }},
		{"Connection/unknown-kind", func() { obs.Connection(amqp.ConnectionEvent{Kind: 99}) }},
	}
	for _, c := range calls {
		if n := testing.AllocsPerRun(1000, c.f); n != 0 {
			t.Errorf("%s: %v allocations per call, want 0", c.name, n)
		}
	}
	if obs.BeforePublish != nil {
		t.Error("BeforePublish is set: it would cost every publish a call for nothing")
	}
	// Stats counts these per connection (collectStats): an Observer func
	// would count each event a second time.
	if obs.SettleRefused != nil || obs.Refreshed != nil {
		t.Error("SettleRefused or Refreshed is set: Stats already counts their events")
	}
}

// TestObserverConcurrent hammers one Observer from several goroutines, as
// connections sharing it do, while scrapes run: the counts must come out
// exact and the race detector quiet.
func TestObserverConcurrent(t *testing.T) {
	c := promamqp.New()
	obs := c.Observer()
	const workers, per = 8, 2000
	done := make(chan struct{})
	scraped := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-done:
				scraped <- n
				return
			default:
				testutil.CollectAndCount(c)
				n++
			}
		}
	}()
	finished := make(chan struct{})
	for range workers {
		go func() {
			defer func() { finished <- struct{}{} }()
			ctx := context.Background()
			pi := amqp.PublishInfo{}
			for i := range per {
				obs.Published(ctx, pi, nil)
				obs.Confirmed(amqp.ConfirmInfo{Ack: true, Latency: time.Duration(i) * time.Microsecond})
				obs.RPC(amqp.RPCInfo{Method: "queue.declare", Latency: time.Millisecond})
			}
		}()
	}
	for range workers {
		<-finished
	}
	close(done)
	if n := <-scraped; n == 0 {
		t.Log("no scrape overlapped the workload")
	}

	const total = workers * per
	want := `
# HELP amqp091_published_total Messages written to the socket by PublishWithContext and PublishWithDeferredConfirmWithContext; failed publishes are in amqp091_publish_errors_total instead.
# TYPE amqp091_published_total counter
amqp091_published_total ` + itoa(total) + `
# HELP amqp091_confirmed_total Publishes the broker confirmed in confirm mode, one per delivery tag, by outcome (ack or nack).
# TYPE amqp091_confirmed_total counter
amqp091_confirmed_total{outcome="ack"} ` + itoa(total) + `
amqp091_confirmed_total{outcome="nack"} 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "amqp091_published_total", "amqp091_confirmed_total"); err != nil {
		t.Fatal(err)
	}
	// Latency 0 (i == 0) is "unknown" and not observed.
	if got := histogramCount(t, c, "amqp091_confirm_latency_seconds", nil); got != total-workers {
		t.Errorf("confirm latency count %d, want %d", got, total-workers)
	}
	if got := histogramCount(t, c, "amqp091_rpc_seconds", map[string]string{"method": "queue.declare"}); got != total {
		t.Errorf("rpc count %d, want %d", got, total)
	}
}

func TestNewPanicsOnBadBuckets(t *testing.T) {
	for _, b := range [][]float64{{}, {0}, {0.1, 0.1}, {1, 0.5}, {-1}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("WithBuckets(%v): no panic", b)
				}
			}()
			promamqp.New(promamqp.WithBuckets(b...))
		}()
	}
}

func TestWatchNilPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Watch(nil): no panic")
		}
	}()
	promamqp.New().Watch("x", nil)
}
