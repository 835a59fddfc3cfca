// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"errors"
	"slices"
	"time"
)

// ConsumeFuncOptions are Consume's arguments; the zero value: manual acks, a generated tag.
type ConsumeFuncOptions struct {
	Consumer  string
	AutoAck   bool
	Exclusive bool
	NoLocal   bool
	NoWait    bool
	Args      Table

	// PoisonRecycled fills each body with PoisonByte when the handler
	// returns, and drops it: a body kept too long reads as poison (and the
	// race detector reports a late reader). For tests: it forgoes the pool.
	// Upstream mode pools and recycles no body, so there it does nothing.
	PoisonRecycled bool
}

// PoisonByte is what ConsumeFuncOptions.PoisonRecycled fills bodies with.
const PoisonByte = 0xDB

// ErrConsumerCancelled is ConsumeFunc's error when the broker cancels the consumer.
var ErrConsumerCancelled = errors.New("amqp: consumer cancelled by the broker")

// ConsumeFunc consumes queue as Consume does, but calls handler for each delivery, one at a
// time, in order, on the calling goroutine, and blocks until the consumption ends.
// Acknowledgement is the application's, as with Consume: without AutoAck, d.Ack, d.Nack or
// d.Reject, in handler or later.
//
// THE BODY IS ONLY VALID INSIDE THE HANDLER, AND SO IS d. In the drainer and legacy read
// modes d.Body is pooled and reused once handler returns, and d is reused for the next
// delivery. Copy what must outlive it: bytes.Clone(d.Body), and kept := *d (kept.Ack works
// later). Set PoisonRecycled in tests to catch a body kept too long. The rule stands in
// upstream mode too (bodies not recycled), so code is mode-agnostic.
//
// ConsumeFunc returns:
//   - ctx.Err() once ctx ends: the consumer is cancelled, and what arrived before the broker
//     confirmed the cancel is still handled first;
//   - the handler's error, once the consumer it cancels has ended: the deliveries in flight
//     were requeued (Nack) unhandled, or dropped with AutoAck;
//   - the channel's or connection's close error (a *Error, or ErrClosed), or
//     ErrConsumerCancelled when the broker cancels the consumer.
//
// While it waits with nothing queued, ConsumeFunc reads the socket itself. Legacy: when nobody
// else reads (no DrainEvents loop needed; another's write cuts the read short). Drainer: while
// bytes flow, the drainer lends it the read, taking it back about 10 ms into a handler running
// long, and at once for a reply or a confirm awaited.
func (ch *Channel) ConsumeFunc(
	ctx context.Context, queue string, opts ConsumeFuncOptions, handler func(d *Delivery) error,
) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tag := opts.Consumer
	if tag == "" {
		tag = uniqueConsumerTag()
	}
	// Registered before the consume, so that the channel's close is told from the broker's
	// cancel when the consumption ends (consumeEnded).
	closed := ch.NotifyClose(make(chan *Error, 1))
	defer ch.forgetClose(closed)
	c := ch.connection
	pooled := c != nil && c.rp != nil // the drainer and legacy modes; upstream's pools nothing
	if pooled {
		// Before basic.consume: deliveries may follow consume-ok at once, and the reader
		// decides at each header whether the body is pooled (bodypool.go).
		pooledConsumers.add(ch, tag)
		defer pooledConsumers.remove(ch, tag)
	}
	// In the drainer and legacy modes this goroutine serves the consumer itself: Consume hands
	// the started consumer over through ready instead of starting a loop goroutine for it.
	var ready chan startedConsumer
	if acct := ch.consumers.acct; acct != nil {
		ready = acct.expectDirect(tag) // served by this goroutine (directconsume.go)
	}
	deliveries, err := ch.Consume(queue, tag, opts.AutoAck, opts.Exclusive, opts.NoLocal,
		opts.NoWait, opts.Args)
	if err != nil {
		if ready != nil {
			ch.consumers.acct.withdrawDirect(tag, ready)
		}
		return err
	}
	dc := &directConsumer{
		ch:      ch,
		tag:     tag,
		autoAck: opts.AutoAck,
		handle:  observed(c, handler),
		pooled:  pooled,
		poison:  opts.PoisonRecycled,
		ctx:     ctx,
	}
	if ready != nil {
		return ch.consumeDirect(<-ready, dc, closed)
	}
	// Upstream mode: the Consume chan feeds the same loop and handler.
	return dc.serve(&consumerLoop{box: new(inbox), src: deliveries}, closed)
}

// observed returns handler, timed for Observer.Handled if c has one.
func observed(c *Connection, handler func(*Delivery) error) func(*Delivery) error {
	obs := c.obsOf()
	if obs == nil || obs.Handled == nil {
		return handler
	}
	return func(d *Delivery) error {
		start := time.Now()
		err := handler(d)
		obs.Handled(d, time.Since(start), err)
		return err
	}
}

// forgetClose unregisters ConsumeFunc's NotifyClose listener, so that a channel consumed from
// again and again does not pile up listeners (upstream has no way to unregister one).
func (ch *Channel) forgetClose(c chan *Error) {
	ch.notifyM.Lock()
	defer ch.notifyM.Unlock()
	ch.closes = slices.DeleteFunc(ch.closes, func(l chan *Error) bool { return l == c })
}

// consumeEnded is what ConsumeFunc returns when neither ctx nor the handler ended it: the
// channel's close error if the close listener holds one (ErrClosed if it was closed without
// one), else ErrConsumerCancelled, the broker's cancel.
func consumeEnded(closed <-chan *Error) error {
	select {
	case e, ok := <-closed:
		if ok && e != nil {
			return e
		}
		return ErrClosed
	default:
		return ErrConsumerCancelled
	}
}
