package failover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ConsumerOptions configure a Consumer. Dial and Queue are required.
type ConsumerOptions struct {
	Dial        DialFunc
	Queue       string
	Prefetch    int    // basic.qos prefetch count; default 100
	ConsumerTag string // "" lets the broker name it
	Backoff     Backoff
	// CloseTimeout bounds closing a connection when Run returns. Default 5s.
	CloseTimeout time.Duration
	// ProbeAfter: when no delivery has come for this long, the consumer
	// asks its node a question (basic.qos, with the same prefetch) and
	// abandons a node that does not answer within ProbeAfter. Why: a
	// frozen node (its VM stopped, stalled on its disk, paused by its
	// hypervisor) stays alive to TCP and silent to AMQP, and only the
	// heartbeat's timeout would tell, 1.5 × the heartbeat in amqp091-go
	// (the cluster suite's fault 8c: 3.0 s at a heartbeat of 2 s). With
	// the default, half the connection's negotiated heartbeat, such a
	// node is left within about one heartbeat, at the cost of one small
	// RPC per half heartbeat while the queue is idle. Negative turns the
	// probe off; so does a connection without heartbeats.
	ProbeAfter time.Duration
	Logger     *slog.Logger
	OnEvent    func(Event)
}

// ConsumerStats are cumulative counts.
type ConsumerStats struct {
	Deliveries  uint64 // handed to the handler
	Acked       uint64
	Nacked      uint64 // the handler failed: nacked with requeue
	Redelivered uint64 // deliveries with Redelivered set
	AckErrors   uint64 // acks or nacks that failed (the connection was gone)
	Connects    uint64 // basic.consume succeeded
	Failovers   uint64 // connections or channels lost while consuming
	// Cancels counts the broker's basic.cancel of the consumer (its queue
	// deleted, a quorum queue's consumer timeout, ...). Each is followed,
	// after a backoff, by a basic.consume on the same channel; one that
	// fails (the queue is gone) ends the session like a lost channel.
	Cancels uint64
}

// Consumer consumes one queue with manual acks, re-consuming on a new
// connection after every loss.
type Consumer struct {
	o  ConsumerOptions
	n  notifier
	mu sync.Mutex
	st ConsumerStats
}

// NewConsumer checks o and returns a Consumer; Run does the work.
func NewConsumer(o ConsumerOptions) (*Consumer, error) {
	if o.Dial == nil {
		return nil, errors.New("failover: ConsumerOptions.Dial is required")
	}
	if o.Queue == "" {
		return nil, errors.New("failover: ConsumerOptions.Queue is required")
	}
	if o.Prefetch <= 0 {
		o.Prefetch = 100
	}
	if o.CloseTimeout <= 0 {
		o.CloseTimeout = 5 * time.Second
	}
	o.Backoff = o.Backoff.withDefaults()
	return &Consumer{o: o, n: newNotifier(o.Logger, o.OnEvent)}, nil
}

// Consume is NewConsumer(o) then Run(ctx, handler).
func Consume(ctx context.Context, o ConsumerOptions, handler func(ctx context.Context, d amqp.Delivery) error) error {
	c, err := NewConsumer(o)
	if err != nil {
		return err
	}
	return c.Run(ctx, handler)
}

// Stats returns a snapshot of the counters.
func (c *Consumer) Stats() ConsumerStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st
}

func (c *Consumer) count(f func(*ConsumerStats)) {
	c.mu.Lock()
	f(&c.st)
	c.mu.Unlock()
}

// Run consumes until ctx ends, and returns ctx's error. handler runs for
// one delivery at a time; nil acks the delivery, an error nacks it with
// requeue. On a lost connection or channel Run redials, re-applies Qos and
// consumes again; deliveries not acked before the loss are redelivered by
// the broker (Redelivered set), so handlers must tolerate duplicates, which
// the publisher's MessageId lets them detect.
//
// A basic.cancel from the broker (amqp.Channel.NotifyCancel) is not a
// loss: the connection and channel are healthy. Run counts it (Cancels),
// emits EventCancelled, waits Backoff's delay for the number of cancels
// in a row (a delivery resets it), and consumes again on the same channel.
func (c *Consumer) Run(ctx context.Context, handler func(ctx context.Context, d amqp.Delivery) error) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	failures := 0
	for {
		conn, err := dialLoop(ctx, c.o.Dial, c.o.Backoff, c.n)
		if err != nil {
			return err
		}
		drain := startDrainLoop(conn, &wg)
		err = c.session(ctx, conn, drain, handler)
		// On a loss, abandon; the broker requeues what was not acked.
		deadline := time.Now()
		if ctx.Err() != nil {
			deadline = deadline.Add(c.o.CloseTimeout)
		}
		closeConn(conn, drain, deadline)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c.count(func(s *ConsumerStats) { s.Failovers++ })
		c.n.log.Warn("failover: consumer lost its connection", "err", err)
		c.n.emit(Event{Kind: EventConnectionLost, Err: err})
		if errors.Is(err, errSetup) {
			failures++
			if !sleepCtx(ctx, c.o.Backoff.delay(failures)) {
				return ctx.Err()
			}
		} else {
			failures = 0
		}
	}
}

var errSetup = errors.New("failover: consumer setup failed")

// setupTimeout bounds channel.open, basic.qos and basic.consume.
const setupTimeout = 10 * time.Second

// session consumes on conn until the deliveries end or ctx does.
func (c *Consumer) session(ctx context.Context, conn *amqp.Connection, drain *drainLoop, handler func(ctx context.Context, d amqp.Delivery) error) error {
	ch, deliveries, cancels, err := c.start(ctx, conn, drain)
	if err != nil {
		return fmt.Errorf("%w: %w", errSetup, err)
	}
	c.count(func(s *ConsumerStats) { s.Connects++ })
	c.n.emit(Event{Kind: EventConsuming})
	cancelled := 0 // broker cancels since the last delivery
	idle, silence := c.idleTimer(conn)
	defer idle.Stop()
	for {
		var d amqp.Delivery
		var ok bool
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-idle.C:
			if err := c.probe(conn, drain, ch, silence); err != nil {
				return err
			}
			idle.Reset(silence)
			continue
		case d, ok = <-deliveries:
		}
		if silence > 0 {
			idle.Reset(silence)
		}
		if !ok {
			// The broker's cancel reaches NotifyCancel before the
			// deliveries chan closes, in every read mode.
			select {
			case tag, was := <-cancels:
				if was {
					cancelled++
					if deliveries, err = c.reconsume(ctx, conn, drain, ch, tag, cancelled); err != nil {
						return err
					}
					continue
				}
			default:
			}
			return fmt.Errorf("failover: deliveries ended: %w", amqp.ErrClosed)
		}
		cancelled = 0
		c.deliver(ctx, drain, d, handler)
	}
}

// idleTimer returns the timer of the session's probe (ProbeAfter) and its
// period; a timer that never fires, and 0, when the probe is off.
func (c *Consumer) idleTimer(conn *amqp.Connection) (*time.Timer, time.Duration) {
	silence := c.o.ProbeAfter
	if silence == 0 {
		silence = conn.Config.Heartbeat / 2
	}
	if silence <= 0 {
		t := time.NewTimer(time.Hour)
		t.Stop()
		return t, 0
	}
	return time.NewTimer(silence), silence
}

// probe asks the node a question after silence with no delivery: basic.qos
// with the consumer's own prefetch, a no-op for the broker. A node that
// does not answer within silence is abandoned (the connection closed
// without waiting), which fails the RPC and ends the session.
func (c *Consumer) probe(conn *amqp.Connection, drain *drainLoop, ch *amqp.Channel, silence time.Duration) error {
	timer := time.AfterFunc(silence, func() { closeConn(conn, drain, time.Now()) })
	release := drain.hold()
	err := ch.Qos(c.o.Prefetch, 0, false)
	release()
	if !timer.Stop() {
		return fmt.Errorf("failover: no delivery for %v, and the node did not answer a probe within %v: %w",
			silence, silence, amqp.ErrClosed)
	}
	return err
}

// start opens the session's channel, with its Qos and its cancel
// listener, and consumes on it, bounded by setupTimeout and by ctx: either
// abandons the connection, which fails the RPC.
func (c *Consumer) start(ctx context.Context, conn *amqp.Connection, drain *drainLoop) (*amqp.Channel, <-chan amqp.Delivery, chan string, error) {
	stop := context.AfterFunc(ctx, func() { closeConn(conn, drain, time.Now()) })
	timer := time.AfterFunc(setupTimeout, func() { closeConn(conn, drain, time.Now()) })
	release := drain.hold()
	ch, err := c.setup(conn)
	var deliveries <-chan amqp.Delivery
	var cancels chan string
	if err == nil {
		// One listener for the channel's life: the broker cancels only
		// this channel's one consumer.
		cancels = ch.NotifyCancel(make(chan string, 1))
		deliveries, err = c.consume(ch)
	}
	release()
	stop()
	timer.Stop()
	return ch, deliveries, cancels, err
}

// deliver hands d to handler, then acks it (handler returned nil) or nacks
// it with requeue, and counts both.
func (c *Consumer) deliver(ctx context.Context, drain *drainLoop, d amqp.Delivery, handler func(ctx context.Context, d amqp.Delivery) error) {
	c.count(func(s *ConsumerStats) {
		s.Deliveries++
		if d.Redelivered {
			s.Redelivered++
		}
	})
	if d.Redelivered {
		c.n.emit(Event{Kind: EventRedelivered, MessageID: d.MessageId})
	}
	herr := handler(ctx, d)
	release := drain.hold()
	var err error
	if herr == nil {
		err = d.Ack(false)
	} else {
		err = d.Nack(false, true)
	}
	release()
	c.count(func(s *ConsumerStats) {
		switch {
		case err != nil:
			s.AckErrors++
		case herr == nil:
			s.Acked++
		default:
			s.Nacked++
		}
	})
}

// setup opens the consumer's channel with its Qos.
func (c *Consumer) setup(conn *amqp.Connection) (*amqp.Channel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Qos(c.o.Prefetch, 0, false); err != nil {
		return nil, err
	}
	return ch, nil
}

// consume starts the consumer on ch.
func (c *Consumer) consume(ch *amqp.Channel) (<-chan amqp.Delivery, error) {
	return ch.Consume(c.o.Queue, c.o.ConsumerTag, false, false, false, false, nil)
}

// reconsume is what follows the broker's n-th cancel in a row of consumer
// tag: counted and reported, a backoff, and basic.consume again on ch,
// bounded by setupTimeout as the first one is. Its error ends the session:
// ctx's, or errSetup's (the queue is gone, say), after which Run redials
// with its own backoff.
func (c *Consumer) reconsume(ctx context.Context, conn *amqp.Connection, drain *drainLoop, ch *amqp.Channel, tag string, n int) (<-chan amqp.Delivery, error) {
	c.count(func(s *ConsumerStats) { s.Cancels++ })
	c.n.log.Warn("failover: the broker cancelled the consumer", "queue", c.o.Queue, "consumer_tag", tag, "in_a_row", n)
	c.n.emit(Event{Kind: EventCancelled, Count: n})
	if !sleepCtx(ctx, c.o.Backoff.delay(n)) {
		return nil, ctx.Err()
	}
	timer := time.AfterFunc(setupTimeout, func() { closeConn(conn, drain, time.Now()) })
	defer timer.Stop()
	release := drain.hold()
	defer release()
	deliveries, err := c.consume(ch)
	if err != nil {
		return nil, fmt.Errorf("%w: consume again after a broker cancel: %w", errSetup, err)
	}
	c.count(func(s *ConsumerStats) { s.Connects++ })
	c.n.emit(Event{Kind: EventConsuming})
	return deliveries, nil
}
