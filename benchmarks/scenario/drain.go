package scenario

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/readmode"
)

// Issue #18 ("Consume at the C client's CPU cost"): a consumer that only
// drains a full queue is where a client's read path is all there is to
// measure. The broker is never the bottleneck (the messages are already
// in the queue, prefetch keeps a thousand in flight), so what the client
// spends per delivery (CPU, system calls, goroutine wake-ups) decides the
// rate. The queue is filled by another connection before anything is
// sampled, so that the figures are the consumer's alone; the CPU profile
// of the drain says where its time went (scheduler, futex, decoding).
func init() {
	Register(&Scenario{
		Name:  "drain",
		Title: "11. Drain a full queue: client CPU per delivery",
		About: "A plain upstream connection fills a queue with 200,000 messages of 512 B and closes " +
			"before anything is sampled. Then one consumer in the mode under test (legacy: with a " +
			"DrainEvents loop, 50 ms per call), basic.qos prefetch 1,000 and manual acks, acking " +
			"multiple every 100 deliveries, drains it. Over the drain alone, from before basic.consume " +
			"to the last delivery: msg/s; the process's CPU time (getrusage user + system, every " +
			"thread) per 100,000 deliveries; read and write system calls per delivery, from syscr + " +
			"syscw of /proc/self/io (futex and epoll_wait are not counted there); voluntary context " +
			"switches per delivery (getrusage nvcsw: each is a thread going to sleep, a proxy for " +
			"goroutine wake-ups). A CPU profile of the drain (runtime/pprof, 100 Hz, its cost " +
			"included) is saved beside the results.",
		Timeout: 2 * time.Minute,
		Run:     runDrain,
		Report: Report{
			Columns: []Column{
				{Label: "msg/s", Metric: "msg_s"},
				{Label: "CPU-s / 100k", Metric: "cpu_s_per_100k", Digits: 3},
				{Label: "syscalls / delivery", Metric: "syscalls_per_msg", Digits: 3},
				{Label: "vol. ctx switches / delivery", Metric: "nvcsw_per_msg", Digits: 3},
				{Label: "drain s", Metric: "phase_s", Digits: 2},
				{Label: "deliveries", Metric: "messages"},
			},
			Ratios: []Ratio{
				{Label: "drainer / pristine msg/s", Metric: "msg_s", Num: "drainer", Den: "pristine"},
				{Label: "legacy / pristine msg/s", Metric: "msg_s", Num: "legacy", Den: "pristine"},
				{Label: "pristine / drainer CPU-s per 100k", Metric: "cpu_s_per_100k", Num: "pristine", Den: "drainer"},
				{Label: "pristine / drainer syscalls per delivery", Metric: "syscalls_per_msg", Num: "pristine", Den: "drainer"},
			},
			Targets: []Target{
				AtMost("drainer CPU-s per 100k deliveries at most 0.8", "drainer", "cpu_s_per_100k", 0.8, "CPU-s"),
				AtMost("drainer syscalls per delivery at most 0.6", "drainer", "syscalls_per_msg", 0.6, "syscalls"),
				AtLeastRatio("drainer msg/s at least 1.25× pristine upstream's",
					Ratio{Metric: "msg_s", Num: "drainer", Den: "pristine"}, 1.25),
			},
			Reference: "No measured reference: these are issue #18's goals for the drainer, at most " +
				"0.8 CPU-s per 100,000 deliveries and 0.6 read/write syscalls per delivery, and 1.25× " +
				"pristine upstream's rate. For scale, the C client (librabbitmq) published ~102,000 msg/s " +
				"where py-amqp managed ~18,000 in reference benchmark 4.",
		},
	})
}

const (
	// drainBody is the size of every message of the drain.
	drainBody = 512
	// drainPrefetch is the consumer's basic.qos prefetch count.
	drainPrefetch = 1000
	// drainAckEvery is how many deliveries one multiple ack settles.
	drainAckEvery = 100
	// drainLoopTimeout is the legacy drain loop's DrainEvents timeout:
	// in plain legacy mode an ack waits while the loop reads, and when
	// nothing arrives (every prefetched delivery read, the ack that
	// would release more still waiting) the read ends only with this.
	// It is AutoDrain's, as in confirm-wait.
	drainLoopTimeout = confirmWaitDrainTimeout
)

// runDrain fills a queue, then drains it with one consumer in the mode
// under test, measuring the drain alone.
func runDrain(ctx context.Context, env *Env, _ string) (*Result, error) {
	n := env.Count(200_000, 2_000)
	queue, err := env.Queue()
	if err != nil {
		return nil, err
	}
	if err := fillQueue(ctx, env, queue, n, drainBody); err != nil {
		return nil, err
	}

	conn, err := env.Dial(dialDefaults)
	if err != nil {
		return nil, err
	}
	defer closeWithin(conn, 5*time.Second)
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Qos(drainPrefetch, 0, false); err != nil {
		return nil, fmt.Errorf("qos: %w", err)
	}

	res := NewResult()
	meter, err := startCost(env, res)
	if err != nil {
		return nil, err
	}
	defer meter.end()
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	// Stopped before conn closes (defers run last first).
	defer StartDrainLoop(conn, env.Mode, drainLoopTimeout)()

	received := 0
	for received < n {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return nil, fmt.Errorf("deliveries closed after %d of %d", received, n)
			}
			received++
			if received%drainAckEvery == 0 || received == n {
				if err := d.Ack(true); err != nil {
					return nil, fmt.Errorf("ack delivery %d: %w", received, err)
				}
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("%d of %d delivered: %w", received, n, ctx.Err())
		}
	}
	wall, err := meter.stop(res, received)
	if err != nil {
		return nil, err
	}
	res.Set("msg_s", float64(received)/wall.Seconds())
	if env.Mode == readmode.Legacy {
		res.Note("legacy: the connection is read by a DrainEvents loop (%v per call), whose cost is counted, as the whole process is", drainLoopTimeout)
	}
	return res, nil
}

// fillQueue publishes n messages of size bytes to queue over a plain
// upstream connection of its own (in both builds: filling is not under
// test), waits until the broker holds them all, and closes it, so that
// nothing of the filling runs while the consumer is measured.
func fillQueue(ctx context.Context, env *Env, queue string, n, size int) error {
	conn, err := amqp.DialConfig(env.URL, dialDefaults)
	if err != nil {
		return fmt.Errorf("dial filler: %w", err)
	}
	defer closeWithin(conn, 5*time.Second)
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	msg := amqp.Publishing{ContentType: "application/octet-stream", Body: make([]byte, size)}
	for i := range n {
		if err := ch.PublishWithContext(ctx, "", queue, false, false, msg); err != nil {
			return fmt.Errorf("fill message %d: %w", i+1, err)
		}
	}
	if _, err := awaitEnqueued(ctx, env, map[string]int{queue: n}, enqueueBound); err != nil {
		return fmt.Errorf("fill: %w", err)
	}
	return nil
}
