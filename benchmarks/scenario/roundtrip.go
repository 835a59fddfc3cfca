package scenario

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/hist"
	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/readmode"
)

// Issue #18's second measurement: one publisher and one consumer on one
// connection, so that the client's write path and read path run side by
// side on the same socket, as in a service that consumes and publishes.
// Consumption is auto-ack, as the C client's consumer example consumes
// (no_ack): the drain scenario covers manual acks, and here the figure is
// the path of a message through the client twice, published and then
// delivered. Without acks the broker pushes with no prefetch bound, so
// unpaced publishing would measure the backlog in the queue, not the
// client: the publisher keeps at most two batches of 100 in flight and
// waits for the consumer once per batch, which also keeps the pacing's
// own wake-ups to one per 100 messages. The latency is from just before
// the publish call to the delivery's arrival, from a timestamp in the
// body. In this closed loop a variant whose publisher outruns the broker
// keeps the window full, and its median latency is then about the window
// over the rate (Little's law), where a slower publisher finds the
// pipeline emptier: the median compares how full each keeps it, and the
// P99 and max, which stalls dominate, are what the goal judges.
func init() {
	Register(&Scenario{
		Name:  "roundtrip",
		Title: "12. Round trip: a publisher and a consumer on one connection",
		About: "One connection in the mode under test (legacy: with a DrainEvents loop, 50 ms per call; " +
			"a publish waits while the loop reads, contract point 4), a channel publishing 100,000 " +
			"messages of 4 KiB (no confirms) to a queue and another consuming it with auto-ack. The " +
			"publisher keeps at most 200 messages in flight, waiting for the consumer after each batch " +
			"of 100, the first of which, a warm-up, is not measured. Each body starts with the publish time (monotonic clock, just before the publish " +
			"call); the latency is publish to receive. Over the run, from after the warm-up to the " +
			"last delivery: msg/s, the process's CPU time (getrusage, every thread) per 100,000 " +
			"messages, read and write syscalls per message from /proc/self/io (syscr + syscw; futex " +
			"and epoll_wait are not counted there), and voluntary context switches per message " +
			"(getrusage nvcsw). A CPU profile of the run (runtime/pprof, its cost included) is saved " +
			"beside the results.",
		Cases:   []string{"size=4096"},
		Counted: true,
		Timeout: 2 * time.Minute,
		Run:     runRoundtrip,
		Report: Report{
			Columns: []Column{
				{Label: "msg/s", Metric: "msg_s"},
				{Label: "P50 ms", Metric: "roundtrip.p50_ms", Digits: 3},
				{Label: "P99 ms", Metric: "roundtrip.p99_ms", Digits: 3},
				{Label: "max ms", Metric: "roundtrip.max_ms", Digits: 1},
				{Label: "CPU-s / 100k", Metric: "cpu_s_per_100k", Digits: 3},
				{Label: "syscalls / msg", Metric: "syscalls_per_msg", Digits: 3},
				{Label: "vol. ctx switches / msg", Metric: "nvcsw_per_msg", Digits: 3},
			},
			Ratios: []Ratio{
				{Label: "drainer / pristine msg/s", Metric: "msg_s", Num: "drainer", Den: "pristine"},
				{Label: "legacy / pristine msg/s", Metric: "msg_s", Num: "legacy", Den: "pristine"},
				{Label: "pristine P99 / drainer P99", Metric: "roundtrip.p99_ms", Num: "pristine", Den: "drainer"},
				{Label: "pristine / drainer CPU-s per 100k", Metric: "cpu_s_per_100k", Num: "pristine", Den: "drainer"},
			},
			Targets: roundtripTargets(),
			Reference: "No measured reference: go-floor and the C client only drain. These are issue #18's " +
				"goals for the drainer at 4 KiB: 1.4× pristine upstream's rate and a P99 no worse than " +
				"pristine's; and its CPU goal, at most 2.5 CPU-s per 100,000 messages published and " +
				"delivered, which issue #29 restated as at most 0.75× pristine's CPU in the same run " +
				"(3.59 against 4.84, 0.74×, when it was set), since an absolute figure moves with the " +
				"machine's load.",
			Charts: []string{"roundtrip"},
		},
	})
}

// roundtripTargets are issue #18's goals for the drainer at 4 KiB, judged
// against pristine in the same run: go-floor and the C client only drain,
// so the round trip has no floor to divide by. Issue #18's absolute 2.5
// CPU-s per 100k judged the machine's load as much as the client; issue
// #29 restated it as at most 0.75× pristine's (0.74× when it was set). The
// rate stays a multiple of pristine's too: with no floor to hold it to,
// and clients' costs that tell here (drainer 1.55× pristine's in the full
// run of 2026-12-04), it is not one of the drain's rows that the broker
// bounds.
func roundtripTargets() []Target {
	return []Target{
		atMostRatio("drainer CPU-s per 100k at most 0.75× pristine upstream's (#29; #18's 2.5 CPU-s)",
			Ratio{Metric: "cpu_s_per_100k", Num: "drainer", Den: "pristine"}, 0.75).ForCases("size=4096"),
		AtLeastRatio("drainer msg/s at least 1.4× pristine upstream's",
			Ratio{Metric: "msg_s", Num: "drainer", Den: "pristine"}, 1.4).ForCases("size=4096"),
		AtLeastRatio("drainer P99 no worse than pristine upstream's (pristine P99 / drainer P99 ≥ 1.0)",
			Ratio{Metric: "roundtrip.p99_ms", Num: "pristine", Den: "drainer"}, 1.0).ForCases("size=4096"),
	}
}

const (
	// rtBatch is how many messages the publisher sends between looks
	// at the consumer's progress.
	rtBatch = 100
	// rtWindow is how many batches may be in flight at once.
	rtWindow = 2
)

// runRoundtrip measures one case, "size=B": a publisher and an auto-ack
// consumer on one connection in the mode under test.
func runRoundtrip(ctx context.Context, env *Env, c string) (*Result, error) {
	size, err := caseInt(c, "size")
	if err != nil {
		return nil, err
	}
	if size < 8 {
		return nil, fmt.Errorf("case %q: the body must hold an 8-byte timestamp", c)
	}
	batches := max(env.Count(100_000, 1_000)/rtBatch, 1)
	n := batches * rtBatch
	queue, err := env.Queue()
	if err != nil {
		return nil, err
	}
	conn, err := env.Dial(dialDefaults)
	if err != nil {
		return nil, err
	}
	defer closeWithin(conn, 5*time.Second)
	pub, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	cons, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	// The bodies are reused in turn: a body is written again only once
	// the batch that last carried it has been delivered, which the
	// window guarantees for a ring one batch longer than the window.
	bodies := make([][]byte, (rtWindow+1)*rtBatch)
	for i := range bodies {
		bodies[i] = make([]byte, size)
	}

	deliveries, err := cons.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	// Stopped before conn closes (defers run last first).
	defer StartDrainLoop(conn, env.Mode, drainLoopTimeout)()

	// One batch goes first, unmeasured, so that the broker's queue and
	// both channels are under way before the figures start. The consumer
	// records each later latency and wakes the publisher through
	// batchDone (never full: it holds every batch) once per whole batch.
	// It ends after the last message, or when the deliveries chan closes,
	// which closing conn does on every other path.
	total := n + rtBatch
	base := time.Now()
	lat := hist.New()
	batchDone := make(chan struct{}, batches+1)
	consumerGone := make(chan struct{})
	var consumerErr error
	go func() {
		defer close(consumerGone)
		received := 0
		for d := range deliveries {
			if len(d.Body) < 8 {
				consumerErr = fmt.Errorf("delivery %d: %d-byte body, no timestamp", received+1, len(d.Body))
				return
			}
			if received >= rtBatch {
				lat.Record(time.Since(base) - time.Duration(binary.LittleEndian.Uint64(d.Body)))
			}
			received++
			if received%rtBatch == 0 {
				batchDone <- struct{}{}
			}
			if received == total {
				return
			}
		}
		consumerErr = fmt.Errorf("deliveries closed after %d of %d", received, total)
	}()
	waited := 0
	wait := func() error {
		select {
		case <-batchDone:
		case <-consumerGone:
			// It sends a batch's signal before it returns.
			select {
			case <-batchDone:
			default:
				return fmt.Errorf("consumer: %w", consumerErr)
			}
		case <-ctx.Done():
			return fmt.Errorf("%d of %d batches delivered: %w", waited, batches+1, ctx.Err())
		}
		waited++
		return nil
	}

	msg := amqp.Publishing{ContentType: "application/octet-stream"}
	publish := func(b int) error {
		for j := range rtBatch {
			msg.Body = bodies[(b*rtBatch+j)%len(bodies)]
			binary.LittleEndian.PutUint64(msg.Body, uint64(time.Since(base)))
			if err := pub.PublishWithContext(ctx, "", queue, false, false, msg); err != nil {
				return fmt.Errorf("publish %d: %w", b*rtBatch+j+1, err)
			}
		}
		return nil
	}
	if err := publish(0); err != nil {
		return nil, err
	}
	if err := wait(); err != nil {
		return nil, err
	}

	res := NewResult()
	meter, err := startCost(env, res)
	if err != nil {
		return nil, err
	}
	defer meter.end()
	for b := 1; b <= batches; b++ {
		for b-waited >= rtWindow {
			if err := wait(); err != nil {
				return nil, err
			}
		}
		if err := publish(b); err != nil {
			return nil, err
		}
	}
	for waited <= batches {
		if err := wait(); err != nil {
			return nil, err
		}
	}
	wall, err := meter.stop(res, n)
	if err != nil {
		return nil, err
	}
	res.Set("msg_s", float64(n)/wall.Seconds())
	res.AddLatency("roundtrip", lat.Summary())
	if env.Mode == readmode.Legacy {
		res.Note("legacy: the connection is read by a DrainEvents loop (%v per call), whose cost is counted, as the whole process is; a publish waits while it reads", drainLoopTimeout)
	}
	return res, nil
}
