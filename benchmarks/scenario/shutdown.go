package scenario

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/hist"
	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/readmode"
)

// Reference benchmark 4: Close on a connection that has an active
// consumer and an active publisher, on fresh connections, counting the
// Close calls that never return. kombu's legacy mode deadlocked here
// 10/10 until its Close stopped holding the transport lock while it
// waited for close-ok. Upstream amqp091-go has the same shape of hazard
// in the variant this scenario adds: a publisher blocked in a socket write
// holds the connection's write lock, and Close needs that lock to send
// connection.close, so a broker that stops reading turns Close into a
// wait without end.

// The cases.
const (
	shutdownLoad         = "load"                 // sequential trials, messages flowing
	shutdownStopsReading = "broker-stops-reading" // concurrent trials, publisher stuck in a write
	shutdownSaturating   = "saturating"           // sequential trials, publisher without pause (issue #17)
)

const (
	// loadCloseBound is how long a Close under ordinary load may take
	// before it counts as deadlocked. It is far beyond any close handshake
	// on loopback (the reference's slowest is 2 s) yet keeps 20 trials
	// within the suite's budget.
	loadCloseBound = 10 * time.Second
	// stuckCloseBound is the same bound for the broker-stops-reading case.
	// It must exceed the drainer's and legacy's default CloseTimeout (5 s),
	// which is what frees their stuck publisher: a Close bounded by that
	// watchdog then counts as completed, and only a Close that waits for
	// the publisher's write lock forever counts as deadlocked.
	stuckCloseBound = 8 * time.Second
	// stuckBody is the publisher's body in the broker-stops-reading case:
	// large, so that a few dozen publishes fill the socket buffers and the
	// next one blocks in its write.
	stuckBody = 64 << 10
	// blockedAfter is how long a publish call must have been running for
	// its publisher to count as blocked in a write. A publish into a
	// reading broker takes microseconds.
	blockedAfter = 200 * time.Millisecond
	// activeFor is how long a load trial's publisher runs, with at least
	// one message published and one delivered, before Close: long enough
	// that Close meets a connection under way rather than one starting
	// up. It is a time, not a message count, because legacy mode's
	// publisher gets only a few messages a second past the drain loop's
	// blocking reads (stalled-consumer measures that), and would never
	// reach a count the others reach in 100 ms.
	activeFor = 100 * time.Millisecond
	// loadInterval paces the load case's publisher: 1,000 messages a
	// second, steady background traffic. An unpaced publisher fills the
	// socket buffers with megabytes of publishes that the broker must work
	// through before it answers connection.close (AMQP answers in order),
	// so Close would time the broker's backlog: 0.4–0.9 s at P95 and up to
	// 2 s in every variant alike on the suite's machine.
	loadInterval = time.Millisecond
	// saturatingTrials is how many connections the saturating case
	// closes, one after another; the issue judged the worst of 10.
	saturatingTrials = 10
	// saturatingBody is the saturating publisher's body: 1 KiB.
	saturatingBody = 1 << 10
	// saturatingFor is how long the saturating publisher runs before
	// Close: enough to fill the socket buffers and the broker's queues
	// with the backlog that Close then waits behind.
	saturatingFor = 200 * time.Millisecond
)

func init() {
	Register(&Scenario{
		Name:  "bounded-shutdown",
		Title: "5. Bounded shutdown: Close with an active consumer and publisher",
		About: "Each trial opens a fresh connection with a consumer (auto-ack) and a publisher " +
			"publishing into the consumer's queue; in legacy mode a goroutine loops DrainEvents " +
			"with a 1 s timeout, as the reference's background consumer does. \"load\": 20 trials " +
			"in sequence; the publisher publishes a 43-byte message every 1 ms, and once it has " +
			"run for 100 ms and a message has been delivered, Close is timed; one not back within 10 s " +
			"counts as deadlocked. \"broker-stops-reading\": 20 connections through Toxiproxy, " +
			"whose client-to-broker direction is then throttled to 1 KB/s; each publisher publishes " +
			"64 KiB bodies without pause until it has been blocked in a write for 200 ms, then all " +
			"20 connections are closed at once, and a Close not back within 8 s (beyond the default " +
			"5 s CloseTimeout of legacy and drainer modes) counts as deadlocked. \"saturating\" (issue #17): " +
			"10 trials in sequence, each on a fresh connection whose consumer drains a server-named queue; " +
			"the publisher publishes 1 KiB bodies into it without pause, and after 200 ms Close is timed " +
			"(10 s bound). Close then waits for the broker to work through the publishes ahead of " +
			"connection.close, so the publish rate (messages published before Close, over the time " +
			"they took) says how much backlog each variant built; \"delivered after Close\" counts the " +
			"deliveries the application received from its Consume chan once Close had begun, over all trials.",
		Cases:   []string{shutdownLoad, shutdownStopsReading, shutdownSaturating},
		Timeout: 150 * time.Second,
		Run:     runShutdown,
		Report: Report{
			Columns: []Column{
				{Label: "trials", Metric: "trials"},
				{Label: "completed", Metric: "completed"},
				{Label: "deadlocked", Metric: "deadlocked"},
				{Label: "Close errors", Metric: "close_errors"},
				{Label: "publisher blocked", Metric: "blocked"},
				{Label: "published before Close", Metric: "published_before_close"},
				{Label: "publish msg/s", Metric: "publish_rate"},
				{Label: "delivered after Close", Metric: "delivered_after_close"},
				{Label: "P50 ms", Metric: "close.p50_ms", Digits: 1},
				{Label: "P95 ms", Metric: "close.p95_ms", Digits: 1},
				{Label: "max ms", Metric: "close.max_ms", Digits: 1},
			},
			Ratios: []Ratio{
				{Label: "legacy P95 / drainer P95", Metric: "close.p95_ms", Num: "legacy", Den: "drainer"},
				{Label: "pristine P95 / drainer P95", Metric: "close.p95_ms", Num: "pristine", Den: "drainer"},
				{Label: "drainer P95 / upstream P95", Metric: "close.p95_ms", Num: "drainer", Den: "upstream"},
			},
			Targets: []Target{
				maxEverywhere("0 deadlocks in every variant", "deadlocked", 0).ForCases(shutdownLoad, shutdownSaturating),
				maxIn([]string{readmode.Legacy, readmode.Drainer}, "0 deadlocks in legacy and drainer modes "+
					"(upstream's Close waits for the blocked writes: the bug they bound)", "deadlocked", 0).ForCases(shutdownStopsReading),
				loadOnly(AtMost("drainer Close P95 at most 50 ms under load",
					"drainer", "close.p95_ms", 50, "ms")).ForCases(shutdownLoad, shutdownStopsReading),
				atMostRatio("drainer Close P95 at most upstream's under a saturating publisher",
					Ratio{Metric: "close.p95_ms", Num: "drainer", Den: "upstream"}, 1).ForCases(shutdownSaturating),
				// The count starts just before Close is called, so a few
				// deliveries handed over before Close takes effect are in it.
				atMostRatio("drainer: deliveries received once Close has begun at most 1% of upstream's",
					Ratio{Metric: "delivered_after_close", Num: "drainer", Den: "upstream"}, 0.01).ForCases(shutdownSaturating),
			},
			Reference: "py-amqp/kombu, Close under load, 10 fresh connections per mode: legacy 10/10 " +
				"completed, 0 deadlocks, P50 1952 ms, P95 1990 ms; dedicated drainer 10/10, 0 deadlocks, " +
				"P50 508 ms, P95 513 ms. Legacy deadlocked 10/10 before kombu-pyamqp-threadsafe 0.7.1. " +
				"The broker-stops-reading case has no reference figure.",
			Charts: []string{"close"},
		},
	})
}

// loadOnly confines t to the load case. The broker-stops-reading case,
// recognised by its "blocked" count, measures a Close that is meant to
// last until CloseTimeout, so a latency goal means nothing there.
func loadOnly(t Target) Target {
	check := t.Check
	t.Check = func(a Agg) (string, bool) {
		if _, stuck := a.Get("drainer", "blocked"); stuck {
			return "n/a in this case: CloseTimeout bounds it", true
		}
		return check(a)
	}
	return t
}

func runShutdown(ctx context.Context, env *Env, c string) (*Result, error) {
	switch c {
	case shutdownLoad:
		return runShutdownLoad(ctx, env)
	case shutdownStopsReading:
		return runShutdownStuck(ctx, env)
	case shutdownSaturating:
		return runShutdownSaturating(ctx, env)
	default:
		return nil, fmt.Errorf("bounded-shutdown: unknown case %q", c)
	}
}

// runShutdownLoad closes 20 fresh connections under load, one at a time,
// so that each Close is timed on an otherwise quiet client.
func runShutdownLoad(ctx context.Context, env *Env) (*Result, error) {
	trials := 20
	if env.Quick {
		trials = 3
	}
	queue, err := env.Queue()
	if err != nil {
		return nil, err
	}
	var tally closeTally
	var published, delivered int64
	for i := 0; i < trials && ctx.Err() == nil; i++ {
		b, err := openBusyConn(env, env.URL, queue)
		if err != nil {
			return nil, fmt.Errorf("trial %d: %w", i, err)
		}
		b.startPublisher(ctx, seedBody, loadInterval)
		active := waitFor(ctx, 5*time.Second, func() bool {
			return b.published.Load() > 0 && b.delivered.Load() > 0 && time.Since(b.started) >= activeFor
		})
		if !active {
			tally.inactive++
		}
		o := timedClose(b.conn, loadCloseBound)
		tally.add(o)
		published += b.published.Load()
		delivered += b.delivered.Load()
		if o.returned && !stopDrainWithin(b) {
			tally.drainLoopsRunning++
		} // a Close that did not return is abandoned, with its goroutines, until the process exits
	}
	res := tally.result()
	res.Set("published", float64(published))
	res.Set("delivered", float64(delivered))
	return res, ctx.Err()
}

// runShutdownSaturating closes fresh connections whose publisher
// publishes without pause, one at a time (issue #17). Unlike the load
// case's, the publisher is not paced: the socket buffers and the broker's
// queues fill with publishes, which the broker works through before it
// answers connection.close, so Close measures that backlog as much as the
// client; the publish rate and the count published before Close say how
// big a backlog each variant built. Each trial has a server-named queue of
// its own, so that no trial's leftovers feed the next.
func runShutdownSaturating(ctx context.Context, env *Env) (*Result, error) {
	trials := saturatingTrials
	if env.Quick {
		trials = 2
	}
	body := make([]byte, saturatingBody)
	var tally closeTally
	var published, delivered, afterClose int64
	var rate float64
	for i := 0; i < trials && ctx.Err() == nil; i++ {
		b, err := openBusyConn(env, env.URL, "")
		if err != nil {
			return nil, fmt.Errorf("trial %d: %w", i, err)
		}
		b.startPublisher(ctx, body, 0)
		active := waitFor(ctx, 5*time.Second, func() bool {
			return b.published.Load() > 0 && b.delivered.Load() > 0 && time.Since(b.started) >= saturatingFor
		})
		if !active {
			tally.inactive++
		}
		b.closing.Store(true)
		n, ran := b.published.Load(), time.Since(b.started)
		o := timedClose(b.conn, loadCloseBound)
		tally.add(o)
		published += n
		rate += float64(n) / ran.Seconds()
		delivered += b.delivered.Load()
		if o.returned && !stopDrainWithin(b) {
			tally.drainLoopsRunning++
		}
		if o.returned {
			// Every delivery the application will ever get has been
			// counted once its chan is closed, which Close ends with.
			within(time.Second, func() { <-b.consumed })
		}
		afterClose += b.afterClose.Load()
	}
	res := tally.result()
	if tally.trials > 0 {
		res.Set("published_before_close", float64(published)/float64(tally.trials))
		res.Set("publish_rate", rate/float64(tally.trials))
	}
	res.Set("delivered", float64(delivered))
	res.Set("delivered_after_close", float64(afterClose))
	return res, ctx.Err()
}

// runShutdownStuck closes 20 connections whose publishers are blocked in a
// write because the broker stopped reading. The trials run at once: those
// that deadlock each cost the whole bound, and 20 × 8 s in sequence would
// not fit the suite's budget. Concurrent Close calls on separate
// connections share nothing but the process.
func runShutdownStuck(ctx context.Context, env *Env) (*Result, error) {
	trials := 20
	if env.Quick {
		trials = 3
	}
	queue, err := env.Queue()
	if err != nil {
		return nil, err
	}
	proxy, proxyURL, err := env.Proxy()
	if err != nil {
		return nil, err
	}
	conns := make([]*busyConn, trials)
	for i := range conns {
		if conns[i], err = openBusyConn(env, proxyURL, queue); err != nil {
			return nil, fmt.Errorf("trial %d: %w", i, err)
		}
	}

	// The broker stops reading. A "timeout" toxic would not do: it reads
	// and discards, so the client's writes never block. A bandwidth toxic
	// holds each chunk until its time comes and reads nothing meanwhile,
	// so the proxy stops draining the client's socket and, once the
	// kernel's buffers are full, the publisher's write blocks. At 1 KB/s
	// a 64 KiB publish would take a minute.
	if _, err := proxy.AddToxic("broker-stops-reading", "bandwidth", "upstream", 1,
		toxiproxy.Attributes{"rate": 1}); err != nil {
		return nil, fmt.Errorf("add toxic: %w", err)
	}
	body := make([]byte, stuckBody)
	for _, b := range conns {
		b.startPublisher(ctx, body, 0)
	}
	waitFor(ctx, 15*time.Second, func() bool {
		for _, b := range conns {
			if b.stuckFor() < blockedAfter {
				return false
			}
		}
		return true
	})

	var tally closeTally
	outcomes := make([]closeOutcome, len(conns))
	loopsRunning := make([]bool, len(conns))
	var wg sync.WaitGroup
	for i, b := range conns {
		if b.stuckFor() >= blockedAfter {
			tally.blocked++
		}
		// Each drain loop is stopped as soon as its Close returns, so
		// that loops of closed connections cannot take CPU from the
		// Close calls still running.
		wg.Go(func() {
			outcomes[i] = timedClose(b.conn, stuckCloseBound)
			loopsRunning[i] = outcomes[i].returned && !stopDrainWithin(b)
		})
	}
	wg.Wait()
	for i, o := range outcomes {
		tally.add(o)
		if loopsRunning[i] {
			tally.drainLoopsRunning++
		}
	}
	res := tally.result()
	res.Set("blocked", float64(tally.blocked))
	if tally.blocked < len(conns) {
		res.Note("only %d of %d publishers were blocked in a write when Close was called", tally.blocked, len(conns))
	}
	return res, ctx.Err()
}

// A busyConn is one trial's connection: a consumer on the trial's queue,
// and, once started, a publisher publishing into it.
type busyConn struct {
	env       *Env
	conn      *amqp.Connection
	pub       *amqp.Channel
	queue     string
	delivered atomic.Int64
	published atomic.Int64
	// closing is set just before Close is called; afterClose counts the
	// deliveries the consumer received from then on, and consumed is
	// closed when its deliveries chan has closed.
	closing    atomic.Bool
	afterClose atomic.Int64
	consumed   chan struct{}
	inFlight   atomic.Int64 // when the publish call in progress began, in Unix ns; 0 between calls
	started    time.Time    // when the publisher started
	stopDrain  func()       // ends the legacy drain loop; a no-op in the other modes
}

// openBusyConn dials url in the mode under test and starts consuming
// queue, or a server-named queue it declares if queue is empty. Nothing
// is delivered yet in legacy mode: its drain loop starts with the
// publisher.
func openBusyConn(env *Env, url, queue string) (*busyConn, error) {
	conn, err := env.DialURL(url, amqp.Config{})
	if err != nil {
		return nil, err
	}
	b := &busyConn{env: env, conn: conn, queue: queue, stopDrain: func() {}, consumed: make(chan struct{})}
	if err := b.consume(); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return b, nil
}

func (b *busyConn) consume() error {
	cons, err := b.conn.Channel()
	if err != nil {
		return err
	}
	if b.queue == "" {
		// Exclusive: it goes with the connection.
		q, err := cons.QueueDeclare("", false, true, true, false, nil)
		if err != nil {
			return fmt.Errorf("declare a server-named queue: %w", err)
		}
		b.queue = q.Name
	}
	deliveries, err := cons.Consume(b.queue, "", true, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	go func() {
		defer close(b.consumed)
		for range deliveries {
			b.delivered.Add(1)
			if b.closing.Load() {
				b.afterClose.Add(1)
			}
		}
	}()
	if b.pub, err = b.conn.Channel(); err != nil {
		return err
	}
	return nil
}

// startPublisher publishes body in a loop, every interval or without
// pause if it is zero, until a publish fails, which Close brings about.
// The legacy drain loop starts only once the first
// publish is out (or after a second): started before it, the loop's first
// read would find nothing to read and hold the transport lock for its
// whole 1 s timeout while the publisher waited, a stall that is
// stalled-consumer's subject, not this scenario's.
func (b *busyConn) startPublisher(ctx context.Context, body []byte, interval time.Duration) {
	b.started = time.Now()
	go func() {
		var tick <-chan time.Time
		if interval > 0 {
			t := time.NewTicker(interval)
			defer t.Stop()
			tick = t.C
		}
		for {
			b.inFlight.Store(time.Now().UnixNano())
			err := b.pub.PublishWithContext(context.Background(), "", b.queue, false, false,
				amqp.Publishing{Body: body})
			b.inFlight.Store(0)
			if err != nil {
				return
			}
			b.published.Add(1)
			if tick != nil {
				<-tick
			}
		}
	}()
	waitFor(ctx, time.Second, func() bool { return b.published.Load() > 0 })
	b.stopDrain = StartDrainLoop(b.conn, b.env.Mode, time.Second)
}

// stuckFor is how long the publish call in progress has been running; 0
// between calls.
func (b *busyConn) stuckFor() time.Duration {
	began := b.inFlight.Load()
	if began == 0 {
		return 0
	}
	return time.Since(time.Unix(0, began))
}

// A closeOutcome is one timed Close.
type closeOutcome struct {
	took     time.Duration
	err      error
	returned bool // false: Close was still running at the bound, and was abandoned
}

// timedClose calls conn.Close and waits at most bound for it. A Close
// still running then is abandoned: its goroutine leaks, which a benchmark
// process that exits after its run can afford.
func timedClose(conn *amqp.Connection, bound time.Duration) closeOutcome {
	start := time.Now()
	done := make(chan error, 1) // buffered: an abandoned Close still ends
	if !within(bound, func() { done <- conn.Close() }) {
		return closeOutcome{took: bound}
	}
	return closeOutcome{took: time.Since(start), err: <-done, returned: true}
}

// closeTally sums up a case's trials.
type closeTally struct {
	lat                        *hist.Recorder
	trials, completed, errs    int
	deadlocked, inactive       int
	blocked, drainLoopsRunning int
	firstErr                   error
}

// add counts o. Only completed Close calls enter the latency
// distribution: a deadlocked one has no duration, only the bound it
// exceeded.
func (t *closeTally) add(o closeOutcome) {
	if t.lat == nil {
		t.lat = hist.New()
	}
	t.trials++
	if !o.returned {
		t.deadlocked++
		return
	}
	t.completed++
	t.lat.Record(o.took)
	if o.err != nil {
		t.errs++
		if t.firstErr == nil {
			t.firstErr = o.err
		}
	}
}

// stopDrainWithin ends a closed connection's legacy drain loop, which
// Close must have woken, and reports whether it ended within a second. A
// loop still running then is left behind.
func stopDrainWithin(b *busyConn) bool {
	return within(time.Second, b.stopDrain)
}

func (t *closeTally) result() *Result {
	res := NewResult()
	res.Set("trials", float64(t.trials))
	res.Set("completed", float64(t.completed))
	res.Set("deadlocked", float64(t.deadlocked))
	res.Set("close_errors", float64(t.errs))
	if t.completed > 0 { // a distribution of nothing would print as 0 ms
		res.AddLatency("close", t.lat.Summary())
	}
	if t.firstErr != nil {
		res.Note("%d Close calls returned an error; the first: %v", t.errs, t.firstErr)
	}
	if t.inactive > 0 {
		res.Note("%d trials closed before publisher and consumer had each handled a message (5 s wait)",
			t.inactive)
	}
	if t.drainLoopsRunning > 0 {
		res.Set("drain_loops_running", float64(t.drainLoopsRunning))
		res.Note("%d drain loops were still in DrainEvents 1 s after Close returned", t.drainLoopsRunning)
	}
	if t.deadlocked > 0 {
		res.Note("%d of %d Close calls had not returned at the bound and were abandoned", t.deadlocked, t.trials)
	}
	return res
}
