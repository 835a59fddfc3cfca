package soak

import (
	"context"
	"flag"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/internal/toxi"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/ledger"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/queue"
)

var (
	duration = flag.Duration("soak.duration", 0, "how long TestSoak runs; 0 means 20s at the short level, 5m at the full level")
	seed     = flag.Uint64("soak.seed", 0, "seed of TestSoak's fault and churn schedule; 0 picks one (it is logged)")
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The soak's shape. Publishers are paced so that the run measures the
// client under steady load for its whole length, not the broker's disk,
// and leaves the two shared cores some room.
const (
	publishers = 2
	consumers  = 2
	pace       = 4 * time.Millisecond // per publisher: up to 250 new messages a second
	window     = 32
	prefetch   = 64
	maxOpen    = 16 // channels the churner keeps open at most
	// drainBound bounds each stage of the teardown: publishers finishing
	// their retries, the other workers stopping, goroutines exiting.
	drainBound = 2 * time.Minute
)

// TestSoak runs publishers with confirms, consumers with manual acks and a
// channel churner, all in drainer mode through Toxiproxy, and resets their
// connections at random intervals. Every few seconds it samples the live
// heap (HeapAlloc after runtime.GC) and the goroutine count, and prints
// them as a table. It fails if either keeps growing (see levelOff), if a
// kind of work stalls (see progress), if the goroutines do not return to
// their baseline after the teardown, or if a positively confirmed message
// is lost or a confirmation never comes.
func TestSoak(t *testing.T) {
	lvl := level.Require(t)
	d := level.Pick(lvl, 20*time.Second, 5*time.Minute)
	if *duration > 0 {
		d = *duration
	}
	s := *seed
	if s == 0 {
		s = rand.Uint64()
	}
	t.Logf("soak: %v, seed %d (-soak.seed %d to replay the schedule)", d, s, s)
	rng := rand.New(rand.NewPCG(s, s))
	// Faults come every gapMin..gapMax and each toxic stays holdMin..holdMax,
	// long enough that redials meet it, short enough that work continues.
	gapMin, gapMax := level.Pick(lvl, time.Second, 2*time.Second), level.Pick(lvl, 3*time.Second, 8*time.Second)
	const holdMin, holdMax = 20 * time.Millisecond, 300 * time.Millisecond
	every := min(max(d/60, time.Second), 10*time.Second) // about 60 samples, 1 to 10 s apart

	q := queue.Durable(t, "reliability-soak-")
	proxy := toxi.NewProxy(t, testenv.AMQPAddr(t))
	proxy.ArmResets()
	url := proxy.URL()

	// The baseline: everything the test itself holds (the direct
	// connection, the toxiproxy client's idle keep-alive) before any
	// worker starts.
	base := take(0, nil)

	led, found := ledger.New(), ledger.NewFound()
	ctx, cancel := context.WithCancel(context.Background())
	var pubWG, wg sync.WaitGroup // publishers; consumers and churner
	errs := make(chan error, publishers+consumers+1)
	goWorker := func(wg *sync.WaitGroup, run func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(); err != nil {
				errs <- err
			}
		}()
	}
	// If the test fails and returns early, abort every worker and wait for
	// them, so that none outlives it.
	t.Cleanup(func() {
		cancel()
		if !waitGroup(&pubWG, drainBound) || !waitGroup(&wg, drainBound) {
			t.Errorf("workers still running %v after being aborted", drainBound)
		}
	})

	pubStop, stop := make(chan struct{}), make(chan struct{})
	pubs := make([]*publisher, publishers)
	for i := range pubs {
		p := &publisher{idx: i, url: url, queue: q, led: led, pace: pace, window: window}
		pubs[i] = p
		goWorker(&pubWG, func() error { return p.run(ctx, pubStop) })
	}
	cons := make([]*consumer, consumers)
	for i := range cons {
		c := &consumer{idx: i, url: url, queue: q, found: found, prefetch: prefetch}
		cons[i] = c
		goWorker(&wg, func() error { return c.run(ctx, stop) })
	}
	ch := &churner{url: url, queue: q, rng: rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())), maxOpen: maxOpen}
	goWorker(&wg, func() error { return ch.run(ctx, stop) })

	losses := func() int64 {
		var n int64
		for _, p := range pubs {
			n += p.losses.Load()
		}
		for _, c := range cons {
			n += c.losses.Load()
		}
		return n + ch.losses.Load()
	}

	// The schedule runs in the test goroutine: toxi must be called from
	// it. Timers pace the faults and the samples; nothing waits on time
	// for a condition.
	var (
		samples []sample
		resets  int
		toxic   string // the reset toxic in place, if any
	)
	start := time.Now()
	sampleTick := time.NewTicker(every)
	defer sampleTick.Stop()
	fault := time.NewTimer(between(rng, gapMin, gapMax))
	defer fault.Stop()
	lift := time.NewTimer(time.Hour)
	lift.Stop()
	end := time.NewTimer(d)
	defer end.Stop()
	t.Logf("%s", header)
	record := func() {
		s := take(time.Since(start), func(s *sample) {
			c := led.Counts()
			s.published, s.acked, s.consumed = c.Published, c.Acked, found.Total()
			s.resets, s.losses = resets, losses()
			s.chans = ch.opened.Load()
		})
		samples = append(samples, s)
		t.Logf("%s", s)
	}
	record()
loop:
	for {
		select {
		case <-sampleTick.C:
			record()
		case <-fault.C:
			stream := toxi.Upstream
			if rng.IntN(2) == 0 {
				stream = toxi.Downstream // resets the consumers first, and the publishers at their next ack
			}
			toxic = proxy.ResetPeer(stream, 0)
			resets++
			lift.Reset(between(rng, holdMin, holdMax))
		case <-lift.C:
			proxy.RemoveToxic(toxic)
			toxic = ""
			fault.Reset(between(rng, gapMin, gapMax))
		case err := <-errs:
			t.Fatalf("a worker stopped during the soak: %v", err)
		case <-end.C:
			break loop
		}
	}
	if toxic != "" {
		proxy.RemoveToxic(toxic)
	}
	record()

	// Teardown: publishers finish their retries first, so that every ID
	// they published is settled; then the consumers and the churner stop;
	// what the consumers left in the queue is read directly.
	close(pubStop)
	if !waitGroup(&pubWG, drainBound) {
		t.Fatalf("publishers did not finish their retries within %v", drainBound)
	}
	close(stop)
	if !waitGroup(&wg, drainBound) {
		t.Fatalf("consumers and churner did not stop within %v", drainBound)
	}
	close(errs)
	for err := range errs {
		t.Errorf("worker: %v", err)
	}
	queue.Drain(t, q, func(d amqp.Delivery) { found.Add(d.MessageId) })

	// Goroutines return to the baseline once every connection is closed.
	// Their goroutines exit asynchronously, hence the polling.
	var after int
	settled := waitFor(func() bool {
		runtime.GC()
		after = runtime.NumGoroutine()
		return after <= base.goroutines+goroutineSlack
	}, drainBound)
	final := take(time.Since(start), nil)
	t.Logf("after teardown: %d goroutines (baseline %d), heap %.1f MiB (baseline %.1f MiB)",
		after, base.goroutines, mib(final.heap), mib(base.heap))
	if !settled {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines %v after teardown, want at most %d (baseline %d + %d); stacks:\n%s",
			after, drainBound, base.goroutines+goroutineSlack, base.goroutines, goroutineSlack, buf[:runtime.Stack(buf, true)])
	}

	summarize(t, samples)
	for _, p := range levelOff(samples) {
		t.Error(p)
	}
	for _, p := range progress(samples) {
		t.Error(p)
	}

	rep := led.Check(found)
	t.Logf("messages: %v", rep)
	t.Logf("resets injected: %d; connection losses seen by workers: %d; channels opened %d, closed %d, churn errors %d",
		resets, losses(), ch.opened.Load(), ch.closed.Load(), ch.errs.Load())
	for _, p := range rep.Problems() {
		t.Error(p)
	}
	if rep.Unacked > 0 {
		t.Errorf("%d IDs were never acked, though publishers retry until they are", rep.Unacked)
	}
	if resets == 0 || losses() == 0 {
		t.Errorf("%d resets injected and %d losses seen: the soak did not exercise the workers' redials", resets, losses())
	}
}

// goroutineSlack is how far above its baseline the goroutine count may be
// after the teardown: short-lived helpers (a state notification or a
// timer callback) that have yet to exit.
const goroutineSlack = 3

// between returns a random duration in [lo, hi).
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// waitGroup waits for wg within bound.
func waitGroup(wg *sync.WaitGroup, bound time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(bound):
		return false
	}
}

// waitFor polls cond until it holds or bound passes.
func waitFor(cond func() bool, bound time.Duration) bool {
	deadline := time.Now().Add(bound)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}
