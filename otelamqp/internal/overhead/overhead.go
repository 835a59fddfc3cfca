// Package overhead measures what an Observer costs the publish and the
// consume paths: it publishes with confirms, or drains a queue, over a
// drainer-mode connection with no Observer, with one whose funcs do
// nothing, and with otelamqp's over a real SDK. BenchmarkPublish and
// cmd/overhead share it.
package overhead

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/amqp091-drainer/amqp091-drainer/otelamqp"
)

// Variant is one way of observing a connection.
type Variant struct {
	Name string
	// New returns the Observer for a connection (nil for none) and what
	// releases what it made.
	New func() (*amqp.Observer, func())
}

// Variants are the three the overhead is measured for, "none" first: it
// is the baseline the others are compared with.
func Variants() []Variant {
	return []Variant{
		{Name: "none", New: func() (*amqp.Observer, func()) { return nil, func() {} }},
		{Name: "noop", New: func() (*amqp.Observer, func()) { return Noop(), func() {} }},
		{Name: "otel", New: OTel},
	}
}

// Noop returns an Observer with every func set to one that does nothing:
// what the read path pays for calling hooks at all.
func Noop() *amqp.Observer {
	return &amqp.Observer{
		BeforePublish:   func(ctx context.Context, _ amqp.PublishInfo, _ *amqp.Publishing) context.Context { return ctx },
		Published:       func(context.Context, amqp.PublishInfo, error) {},
		Confirmed:       func(amqp.ConfirmInfo) {},
		Returned:        func(*amqp.Return) {},
		Delivered:       func(*amqp.Delivery) {},
		Handled:         func(*amqp.Delivery, time.Duration, error) {},
		Settled:         func(amqp.SettleInfo) {},
		RPC:             func(amqp.RPCInfo) {},
		BudgetPaused:    func(amqp.BudgetInfo) {},
		BudgetResumed:   func(amqp.BudgetInfo) {},
		ListenerDropped: func(amqp.ListenerStats) {},
		Connection:      func(amqp.ConnectionEvent) {},
	}
}

// OTel returns otelamqp's Observer over a real SDK: a TracerProvider with
// the default sampler (parent-based, always on) and no exporter, so spans
// are made in full and then dropped, and a MeterProvider with a
// ManualReader nobody collects, so instruments aggregate in full.
func OTel() (*amqp.Observer, func()) {
	tp := sdktrace.NewTracerProvider()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	obs := otelamqp.NewObserver(
		otelamqp.WithTracerProvider(tp),
		otelamqp.WithMeterProvider(mp),
		otelamqp.WithPropagators(propagation.TraceContext{}))
	return obs, func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	}
}

// Publisher publishes in confirm mode on one connection.
type Publisher struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	confirms chan amqp.Confirmation
	exchange string
	key      string
	msg      amqp.Publishing
	release  func()
	sent     uint64
}

// RoutingKey is where the publishes go: amq.direct with a key no queue is
// bound to. The broker drops such messages and confirms them at once, so
// the measure is the client's cost and the round trip, with nothing piling
// up in a queue.
const RoutingKey = "otelamqp.overhead.unrouted"

// Dial opens a drainer-mode connection observed as v says, and a confirm
// channel on it.
func Dial(url string, v Variant, size int) (*Publisher, error) {
	obs, release := v.New()
	conn, err := amqp.DialConfig(url, amqp.Config{ReadPath: amqp.Drainer(amqp.DrainerOptions{Observer: obs})})
	if err != nil {
		release()
		return nil, err
	}
	return newPublisher(conn, release, "amq.direct", RoutingKey, amqp.Publishing{Body: make([]byte, size)})
}

// newPublisher opens a confirm channel on conn, which it owns from then
// on: it closes it, and calls release, if it fails.
func newPublisher(conn *amqp.Connection, release func(), exchange, key string, msg amqp.Publishing) (*Publisher, error) {
	p := &Publisher{conn: conn, release: release, exchange: exchange, key: key, msg: msg}
	var err error
	if p.ch, err = conn.Channel(); err != nil {
		p.Close()
		return nil, err
	}
	if err = p.ch.Confirm(false); err != nil {
		p.Close()
		return nil, err
	}
	// The drainer queues confirmations for a listener that lags, so a
	// small buffer does not stall the publishes; Publish reads them all.
	p.confirms = p.ch.NotifyPublish(make(chan amqp.Confirmation, 1024))
	return p, nil
}

// Publish publishes n messages and waits for their confirms: the
// confirms are read as they come, by the calling goroutine between
// publishes, and the rest at the end.
func (p *Publisher) Publish(ctx context.Context, n int) error {
	target := p.sent + uint64(n)
	var acked uint64
	drain := func(block bool) error {
		for {
			if block {
				select {
				case c, ok := <-p.confirms:
					if !ok {
						return errors.New("overhead: confirmations closed")
					}
					if !c.Ack {
						return fmt.Errorf("overhead: publish %d nacked", c.DeliveryTag)
					}
					acked = c.DeliveryTag
				case <-ctx.Done():
					return ctx.Err()
				}
				return nil
			}
			select {
			case c, ok := <-p.confirms:
				if !ok {
					return errors.New("overhead: confirmations closed")
				}
				if !c.Ack {
					return fmt.Errorf("overhead: publish %d nacked", c.DeliveryTag)
				}
				acked = c.DeliveryTag
			default:
				return nil
			}
		}
	}
	for i := 0; i < n; i++ {
		if err := p.ch.PublishWithContext(ctx, p.exchange, p.key, false, false, p.msg); err != nil {
			return err
		}
		p.sent++
		if i%256 == 255 {
			if err := drain(false); err != nil {
				return err
			}
		}
	}
	for acked < target {
		if err := drain(true); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the connection and releases the variant's SDK.
func (p *Publisher) Close() error {
	err := p.conn.Close()
	p.release()
	return err
}

// Consume-path settings: the broker pushes up to Prefetch unacked
// deliveries, and the consumer acks every AckEvery-th with multiple set,
// as a consumer that cares for throughput does. Manual acks rather than
// autoAck, so that the otel variant records its settlements (Settled) as
// it would in production.
const (
	Prefetch = 1000
	AckEvery = 100
)

// Fill publishes n messages of size bytes to queue, through the default
// exchange, with confirms, over a connection of its own in upstream mode
// with no Observer: what it costs is no variant's. It returns once the
// broker confirmed them all, when they are in the queue.
//
// The messages carry no headers, as a plain producer's: the otel
// variant's receive spans are made in full but have no producer to link
// to, and every variant is spared the decoding of a header table, which
// would make the baseline dearer and the Observers' share look smaller.
func Fill(ctx context.Context, url, queue string, n, size int) error {
	conn, err := amqp.DialConfig(url, amqp.Config{ReadPath: amqp.Upstream()})
	if err != nil {
		return err
	}
	p, err := newPublisher(conn, func() {}, "", queue, amqp.Publishing{Body: make([]byte, size)})
	if err != nil {
		return err
	}
	err = p.Publish(ctx, n)
	return errors.Join(err, p.Close())
}

// Consumer consumes from a queue of its own on one drainer-mode
// connection.
type Consumer struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	queue   string
	release func()
}

// consumerTag names the consumer, so that Drain can cancel it.
const consumerTag = "otelamqp.overhead"

// DialConsumer opens a drainer-mode connection observed as v says, a
// channel with a prefetch of Prefetch, and a server-named exclusive queue
// on it: the broker deletes the queue with the connection, even one that
// a crash left open.
func DialConsumer(url string, v Variant) (*Consumer, error) {
	obs, release := v.New()
	conn, err := amqp.DialConfig(url, amqp.Config{ReadPath: amqp.Drainer(amqp.DrainerOptions{Observer: obs})})
	if err != nil {
		release()
		return nil, err
	}
	c := &Consumer{conn: conn, release: release}
	if c.ch, err = conn.Channel(); err != nil {
		c.Close()
		return nil, err
	}
	if err = c.ch.Qos(Prefetch, 0, false); err != nil {
		c.Close()
		return nil, err
	}
	q, err := c.ch.QueueDeclare("", false, false, true, false, nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	c.queue = q.Name
	return c, nil
}

// Queue is the name the broker gave the consumer's queue, for Fill.
func (c *Consumer) Queue() string { return c.queue }

// Drain consumes total deliveries from the queue, which must hold them
// already, acking every AckEvery-th with multiple set and the last one,
// then cancels the consumer. It calls mark(i) as it receives the i-th
// delivery (from 0), before acking it: the caller times what it likes
// between two marks.
func (c *Consumer) Drain(ctx context.Context, total int, mark func(i int)) error {
	// A queue short of messages would leave the loop waiting forever:
	// check first. The queue is exclusive, so nothing else takes any.
	q, err := c.ch.QueueDeclarePassive(c.queue, false, false, true, false, nil)
	if err != nil {
		return err
	}
	if q.Messages < total {
		return fmt.Errorf("overhead: queue %s holds %d messages, want %d", c.queue, q.Messages, total)
	}
	deliveries, err := c.ch.Consume(c.queue, consumerTag, false, false, false, false, nil)
	if err != nil {
		return err
	}
	for i := 0; i < total; i++ {
		var d amqp.Delivery
		var ok bool
		select {
		case d, ok = <-deliveries:
			if !ok {
				return errors.New("overhead: deliveries closed")
			}
		case <-ctx.Done():
			return ctx.Err()
		}
		mark(i)
		if (i+1)%AckEvery == 0 || i == total-1 {
			if err := c.ch.Ack(d.DeliveryTag, true); err != nil {
				return err
			}
		}
	}
	return c.ch.Cancel(consumerTag, false)
}

// Close deletes the queue, closes the connection and releases the
// variant's SDK. The queue would go with the connection anyway, being
// exclusive; deleting it says so, and reports a broker that did not.
func (c *Consumer) Close() error {
	var err error
	if c.queue != "" {
		_, err = c.ch.QueueDelete(c.queue, false, false, false)
	}
	err = errors.Join(err, c.conn.Close())
	c.release()
	return err
}
