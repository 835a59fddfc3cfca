package scenario

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/hist"
	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/readmode"
)

// Reference benchmark 1: a goroutine loops DrainEvents(1 s) on the
// connection a publisher uses, as an idle consumer sharing a connection
// with a publisher does, and the publisher's latency is measured. In
// legacy mode each of those drains holds the transport lock for its whole
// blocking read, and a publish waits behind it.
func init() {
	Register(&Scenario{
		Name:  "stalled-consumer",
		Title: "1. Stalled consumer: publish latency while another goroutine drains",
		About: "One connection. A consumer waits on an empty queue while a goroutine loops " +
			"DrainEvents with a 1 s timeout on the connection; a publisher publishes a 43-byte " +
			"message every 2 ms to another queue for the run's duration. Publish-call latency " +
			"is recorded. On the pristine build, which has no DrainEvents, the drain goroutine " +
			"just waits, as an idle consumer does.",
		Timeout: time.Minute,
		Run:     runStalledConsumer,
		Report: Report{
			Columns: []Column{
				{Label: "publishes", Metric: "publish.n"},
				{Label: "P50 ms", Metric: "publish.p50_ms", Digits: 3},
				{Label: "P95 ms", Metric: "publish.p95_ms", Digits: 3},
				{Label: "P99 ms", Metric: "publish.p99_ms", Digits: 3},
				{Label: "max ms", Metric: "publish.max_ms", Digits: 3},
			},
			Ratios: []Ratio{
				{Label: "legacy P99 / drainer P99", Metric: "publish.p99_ms", Num: "legacy", Den: "drainer"},
				{Label: "pristine P99 / drainer P99", Metric: "publish.p99_ms", Num: "pristine", Den: "drainer"},
			},
			Targets: []Target{
				AtLeastRatio("drainer P99 at least 300× better than legacy",
					Ratio{Metric: "publish.p99_ms", Num: "legacy", Den: "drainer"}, 300),
			},
			Reference: "py-amqp/kombu: legacy P50 0.04 ms, P95 1001 ms, P99 1956 ms, max 1956 ms; " +
				"dedicated drainer P50 0.02 ms, P95 0.08 ms, P99 2.1 ms, max 2.1 ms (380×–1566× better).",
			Charts: []string{"publish"},
		},
	})
}

// seedBody is the reference message: "the quick brown fox", 43 bytes.
var seedBody = []byte("the quick brown fox jumps over the lazy dog")

func runStalledConsumer(ctx context.Context, env *Env, _ string) (*Result, error) {
	duration, interval := 4*time.Second, 2*time.Millisecond
	if env.Quick {
		duration = time.Second
	}
	idle, err := env.Queue()
	if err != nil {
		return nil, err
	}
	target, err := env.Queue()
	if err != nil {
		return nil, err
	}
	conn, err := env.Dial(amqp.Config{})
	if err != nil {
		return nil, err
	}
	defer conn.Close()

	cons, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if _, err := cons.Consume(idle, "", true, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	pub, err := conn.Channel()
	if err != nil {
		return nil, err
	}

	// The stalled consumer: a drain loop with a 1 s timeout.
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for runCtx.Err() == nil {
			dctx, cancel := context.WithTimeout(runCtx, time.Second)
			err := readmode.DrainEvents(dctx, conn)
			cancel()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				return
			}
		}
	})

	lat := hist.New()
	deadline := time.Now().Add(duration)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var pubErr error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		start := time.Now()
		pubErr = pub.PublishWithContext(ctx, "", target, false, false,
			amqp.Publishing{ContentType: "application/json", ContentEncoding: "utf-8", Body: seedBody})
		lat.Record(time.Since(start))
		if pubErr != nil {
			break
		}
		<-tick.C
	}
	stop()
	wg.Wait()
	if pubErr != nil {
		return nil, fmt.Errorf("publish: %w", pubErr)
	}
	res := NewResult()
	res.AddLatency("publish", lat.Summary())
	return res, ctx.Err()
}
