package scenario

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/hist"
	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/readmode"
)

// Publish, then wait for the confirm, one message at a time: the pattern
// of code that must know a message is safe before it goes on (an outbox
// relay, a request handler that publishes). Libraries that dial
// internally are written this way, so under legacy mode they need a drain
// loop (LegacyOptions.AutoDrain, AMQP091_READ_MODE=legacy-autodrain); this
// measures what that loop costs them, against DeferredConfirmation.Wait
// pumping frames itself (legacy without a loop) and against the modes
// where a goroutine reads anyway.
func init() {
	Register(&Scenario{
		Name:  "confirm-wait",
		Title: "10. Publish, then wait for its confirm, one message at a time",
		About: "One connection, one channel in confirm mode, one durable queue. Each " +
			"iteration publishes one 64-byte message with PublishWithDeferredConfirmWithContext " +
			"and waits for its confirm with WaitContext; the latency is the whole round trip. " +
			"Case wait: nothing else runs (in legacy mode WaitContext reads the frames itself). " +
			"Case drain-loop: the application loops DrainEvents with a 50 ms timeout " +
			"meanwhile; in legacy mode a publish takes the transport lock that the loop's read " +
			"holds, so it waits for that read to end (py-amqp's behaviour). Case auto-drain: " +
			"legacy mode is dialled with LegacyOptions.AutoDrain (AMQP091_READ_MODE=" +
			"legacy-autodrain, how a library that never calls DrainEvents runs in legacy " +
			"mode), whose loop (50 ms per call) yields the transport lock to a writer. In the " +
			"other modes the loops only wait for traffic, and auto-drain is the wait case.",
		Cases:   []string{"wait", "drain-loop", "auto-drain"},
		Timeout: 2 * time.Minute,
		Run:     runConfirmWait,
		Report: Report{
			Columns: []Column{
				{Label: "msg/s", Metric: "msg_s"},
				{Label: "P50 ms", Metric: "confirm.p50_ms", Digits: 3},
				{Label: "P95 ms", Metric: "confirm.p95_ms", Digits: 3},
				{Label: "P99 ms", Metric: "confirm.p99_ms", Digits: 3},
				{Label: "max ms", Metric: "confirm.max_ms", Digits: 1},
			},
			Ratios: []Ratio{
				{Label: "drainer / legacy msg/s", Metric: "msg_s", Num: "drainer", Den: "legacy"},
				{Label: "drainer / pristine msg/s", Metric: "msg_s", Num: "drainer", Den: "pristine"},
				{Label: "legacy P50 / drainer P50", Metric: "confirm.p50_ms", Num: "legacy", Den: "drainer"},
			},
			Reference: "No reference figure: this measures what a drain loop costs publish-then-wait " +
				"code in legacy mode (issue #16).",
		},
	})
}

// confirmWaitDrainTimeout is the drain loop's DrainEvents timeout, the one
// LegacyOptions.AutoDrain uses.
const confirmWaitDrainTimeout = 50 * time.Millisecond

func runConfirmWait(ctx context.Context, env *Env, c string) (*Result, error) {
	n := 2000
	if env.Quick {
		n = 100
	}
	queue, err := env.Queue()
	if err != nil {
		return nil, err
	}
	mode := env.Mode
	if c == "auto-drain" && mode == readmode.Legacy {
		mode = readmode.LegacyAutoDrain
	}
	conn, err := readmode.DialConfig(env.URL, amqp.Config{}, mode)
	if err != nil {
		return nil, fmt.Errorf("dial %s mode: %w", mode, err)
	}
	defer closeWithin(conn, 5*time.Second)
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	switch c {
	case "wait", "auto-drain":
	case "drain-loop":
		stop := StartDrainLoop(conn, env.Mode, confirmWaitDrainTimeout)
		defer stop()
	default:
		return nil, fmt.Errorf("confirm-wait: unknown case %q (want wait, drain-loop or auto-drain)", c)
	}

	msg := amqp.Publishing{Body: make([]byte, 64)}
	lat := hist.New()
	start := time.Now()
	for i := range n {
		t0 := time.Now()
		opCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		dc, err := ch.PublishWithDeferredConfirmWithContext(opCtx, "", queue, false, false, msg)
		if err == nil {
			var ok bool
			if ok, err = dc.WaitContext(opCtx); err == nil && !ok {
				err = errNacked
			}
		}
		cancel()
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", i+1, err)
		}
		lat.Record(time.Since(t0))
	}
	elapsed := time.Since(start)
	res := NewResult()
	res.Set("messages", float64(n))
	res.Set("msg_s", float64(n)/elapsed.Seconds())
	res.AddLatency("confirm", lat.Summary())
	return res, nil
}
