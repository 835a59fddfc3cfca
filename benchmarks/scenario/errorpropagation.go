package scenario

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/hist"
	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/readmode"
)

// Reference benchmark 3: workers wait on one connection when the broker's
// side is reset (Toxiproxy reset_peer), and the time until the last of
// them has seen the error is measured. In py-amqp's legacy mode each worker
// finds out only on its own turn at the transport lock; a drainer hits the
// error once and releases everyone together.
func init() {
	Register(&Scenario{
		Name:  "error-propagation",
		Title: "4. Error propagation: every worker sees a connection reset",
		About: "One connection through Toxiproxy, default Config. Each worker waits on it the " +
			"way natural to the mode: in legacy mode it loops DrainEvents with a 1 s timeout " +
			"(workers take turns at the transport lock); in the other modes it has its own " +
			"channel consuming its own empty queue and waits for the delivery chan to close. " +
			"Once every worker is waiting (a barrier, then 50 ms for the last of them to " +
			"park), a reset_peer toxic is added on the broker-to-client stream and a message " +
			"is published, on a separate direct connection, to a queue the proxied connection " +
			"consumes: its delivery is the data that fires the toxic, which resets the client's " +
			"socket (SO_LINGER 0, so a TCP RST). Measured from just before the toxic is added " +
			"until each worker has seen the error; a worker not released within 10 s is stuck. " +
			"In this legacy mode a worker that gets its turn after the failure finds the " +
			"connection dead without reading, so its serial discovery costs microseconds per " +
			"worker, where py-amqp's cost a read each.",
		Cases:   []string{"workers=10", "workers=50"},
		Timeout: 30 * time.Second,
		Run:     runErrorPropagation,
		Report: Report{
			Columns: []Column{
				{Label: "released", Metric: "workers_released"},
				{Label: "stuck", Metric: "stuck"},
				{Label: "first ms", Metric: "first_ms", Digits: 3},
				{Label: "last ms", Metric: "last_ms", Digits: 3},
				{Label: "spread ms", Metric: "spread_ms", Digits: 3},
				{Label: "inject ms", Metric: "inject_ms", Digits: 3},
			},
			Ratios: []Ratio{
				{Label: "legacy last / drainer last", Metric: "last_ms", Num: "legacy", Den: "drainer"},
				{Label: "pristine last / drainer last", Metric: "last_ms", Num: "pristine", Den: "drainer"},
			},
			Targets: []Target{
				AtMost("drainer: the last worker sees the error within 5 ms (the issue sets it at 50 workers)",
					"drainer", "last_ms", 5, "ms"),
				MetricIs("drainer: no worker stuck", "drainer", "stuck", 0),
			},
			Reference: "py-amqp/kombu, TCP RST via Toxiproxy reset_peer: legacy 468 ms (10 workers), " +
				"523 ms (50 workers); dedicated drainer 2.2 ms (10), 4.1 ms (50).",
			Charts: []string{"release"},
		},
	})
}

// Bounds of the error-propagation scenario.
const (
	// resetBound is how long a worker may wait for the error before it
	// counts as stuck.
	resetBound = 10 * time.Second
	// resetSettle lets the workers that passed the barrier park in their
	// receive or read: Done is the last thing a worker does before it
	// blocks, and there is no way to observe the block itself.
	resetSettle = 50 * time.Millisecond
	// legacyDrainTimeout is each legacy worker's DrainEvents timeout, the
	// reference's.
	legacyDrainTimeout = time.Second
)

func runErrorPropagation(ctx context.Context, env *Env, c string) (*Result, error) {
	workers, err := caseInt(c, "workers")
	if err != nil {
		return nil, err
	}
	proxy, proxyURL, err := env.Proxy()
	if err != nil {
		return nil, err
	}
	// Toxiproxy sets SO_LINGER 0 on a connection's sockets only if a
	// reset_peer toxic exists when the connection is made, and without it
	// the toxic ends the connection with a FIN. This one never fires
	// (toxicity 0): it is there so that the real toxic's close is the RST
	// of the reference.
	if _, err := proxy.AddToxic("linger", "reset_peer", "downstream", 0, toxiproxy.Attributes{"timeout": 0}); err != nil {
		return nil, fmt.Errorf("add the linger toxic: %w", err)
	}
	conn, err := env.DialURL(proxyURL, amqp.Config{})
	if err != nil {
		return nil, err
	}
	// After the reset Close returns at once in every mode; bounded anyway,
	// as a stuck worker may mean a wedged reader.
	defer closeWithin(conn, 2*time.Second)
	connErr := conn.NotifyClose(make(chan *amqp.Error, 1))

	fire, err := resetTrigger(env, conn)
	if err != nil {
		return nil, err
	}
	defer fire.close()

	// giveUp releases every worker still waiting resetBound after the
	// reset; it is armed when the toxic goes in.
	giveUp, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	waits := make([]func() bool, workers)
	for i := range waits {
		if waits[i], err = resetWaiter(giveUp, env.Mode, conn); err != nil {
			return nil, fmt.Errorf("worker %d: %w", i, err)
		}
	}
	released := make([]time.Time, workers)
	var ready, finished sync.WaitGroup
	ready.Add(workers)
	for i, wait := range waits {
		finished.Go(func() {
			ready.Done()
			if wait() {
				released[i] = time.Now()
			}
		})
	}
	ready.Wait()
	if err := sleepCtx(ctx, resetSettle); err != nil {
		return nil, err
	}

	t0 := time.Now()
	bound := time.AfterFunc(resetBound, stopWaiting)
	defer bound.Stop()
	if _, err := proxy.AddToxic("reset", "reset_peer", "downstream", 1, toxiproxy.Attributes{"timeout": 0}); err != nil {
		return nil, fmt.Errorf("add the reset_peer toxic: %w", err)
	}
	if err := fire.publish(ctx); err != nil {
		return nil, fmt.Errorf("trigger the reset: %w", err)
	}
	injected := time.Since(t0)
	finished.Wait()

	res := NewResult()
	res.Set("workers", float64(workers))
	res.Set("inject_ms", millis(injected))
	lat := hist.New()
	var times []time.Time
	for _, at := range released {
		if !at.IsZero() {
			times = append(times, at)
			lat.Record(at.Sub(t0))
		}
	}
	res.Set("workers_released", float64(len(times)))
	res.Set("stuck", float64(workers-len(times)))
	res.AddLatency("release", lat.Summary())
	if len(times) > 0 {
		first, last := slices.MinFunc(times, time.Time.Compare), slices.MaxFunc(times, time.Time.Compare)
		res.Set("first_ms", millis(first.Sub(t0)))
		res.Set("last_ms", millis(last.Sub(t0)))
		res.Set("spread_ms", millis(last.Sub(first)))
	}
	select {
	case err := <-connErr:
		res.Note("%s: the connection closed with %v", env.Mode, err)
	default:
		res.Note("%s: the connection did not report its close", env.Mode)
	}
	return res, ctx.Err()
}

// resetWaiter prepares one worker and returns its wait, which blocks until
// the worker sees the connection fail (true) or giveUp ends (false).
//
// In legacy mode a worker is a DrainEvents loop: the waiting that legacy
// offers, with each worker taking its turn at the transport lock. In the
// other modes a worker consumes its own empty queue on its own channel, as
// a consumer does, and sees the failure as its delivery chan closing.
func resetWaiter(giveUp context.Context, mode string, conn *amqp.Connection) (func() bool, error) {
	if mode == readmode.Legacy {
		return func() bool {
			for giveUp.Err() == nil {
				dctx, cancel := context.WithTimeout(giveUp, legacyDrainTimeout)
				err := readmode.DrainEvents(dctx, conn)
				cancel()
				if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
					return true
				}
			}
			return false
		}, nil
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	deliveries, err := consumeOwnQueue(ch)
	if err != nil {
		return nil, err
	}
	return func() bool {
		for {
			select {
			case _, ok := <-deliveries:
				if !ok {
					return true
				}
			case <-giveUp.Done():
				return false
			}
		}
	}, nil
}

// consumeOwnQueue consumes a fresh server-named queue on ch. The queue is
// exclusive, so the broker deletes it when the connection dies.
func consumeOwnQueue(ch *amqp.Channel) (<-chan amqp.Delivery, error) {
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return nil, fmt.Errorf("declare: %w", err)
	}
	d, err := ch.Consume(q.Name, "", true, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	return d, nil
}

// A trigger makes the broker send the proxied connection a frame on
// demand. A reset_peer toxic fires on the next data of its stream, and an
// idle connection has none for up to a heartbeat interval; a delivery to a
// queue it consumes is data within a millisecond. The publish goes through
// a separate, direct connection so that it waits on nothing of the
// connection under test (in legacy mode a publish on it would wait for a
// worker's read).
type trigger struct {
	direct *amqp.Connection
	ch     *amqp.Channel
	queue  string
}

// resetTrigger sets up a trigger for conn.
func resetTrigger(env *Env, conn *amqp.Connection) (*trigger, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return nil, fmt.Errorf("declare the trigger queue: %w", err)
	}
	if _, err := ch.Consume(q.Name, "", true, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("consume the trigger queue: %w", err)
	}
	direct, err := amqp.Dial(env.URL)
	if err != nil {
		return nil, fmt.Errorf("dial the trigger's connection: %w", err)
	}
	pub, err := direct.Channel()
	if err != nil {
		_ = direct.Close()
		return nil, err
	}
	return &trigger{direct: direct, ch: pub, queue: q.Name}, nil
}

// publish sends the message whose delivery fires the toxic.
func (t *trigger) publish(ctx context.Context) error {
	return t.ch.PublishWithContext(ctx, "", t.queue, false, false, seedPublishing())
}

func (t *trigger) close() { closeWithin(t.direct, 2*time.Second) }
