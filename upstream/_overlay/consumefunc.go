// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"context"
	"errors"
	"time"
)

// Pooled consumption: Channel.ConsumeFunc.
//
// A Consume chan hands the application a Delivery whose Body it owns for
// ever, so every message costs a fresh body. ConsumeFunc calls a handler
// instead, and takes the body back when the handler returns: in the
// drainer and legacy modes the fast path (fastread.go) reads each body of
// such a consumer straight into a buffer from the body pool (bodypool.go),
// and ConsumeFunc puts it back once the handler is done with it. Its
// consumer runs the consumer loop (consumeloop.go) with ConsumeFunc's
// handler (directconsume.go).

// ConsumeFuncOptions are the options of Channel.ConsumeFunc; the zero
// value consumes with manual acknowledgement and a generated consumer tag.
// The fields mean what the arguments of Channel.Consume of the same names
// mean.
type ConsumeFuncOptions struct {
	Consumer  string
	AutoAck   bool
	Exclusive bool
	NoLocal   bool
	NoWait    bool
	Args      Table

	// PoisonRecycled overwrites each body with PoisonByte as soon as the
	// handler returns, and then drops it instead of reusing it, so that a
	// program keeping Body (or a slice of it) past its handler always
	// reads the poison, deterministically, instead of, now and then,
	// another message's bytes; under the race detector, a goroutine still
	// reading it while it is overwritten is reported. For tests: it costs
	// a write over every body, and the pool's savings.
	PoisonRecycled bool
}

// PoisonByte is what ConsumeFuncOptions.PoisonRecycled fills recycled
// bodies with.
const PoisonByte = 0xDB

// ErrConsumerCancelled is returned by ConsumeFunc when the broker
// cancelled the consumer (the queue was deleted, say) while the channel
// stayed open.
var ErrConsumerCancelled = errors.New("amqp: consumer cancelled by the broker")

// ConsumeFunc consumes queue as Consume does, but calls handler for each
// delivery, one at a time, in order, on the calling goroutine, and blocks
// until the consumption ends.
//
// THE BODY IS ONLY VALID INSIDE THE HANDLER, AND SO IS d. In the drainer
// and legacy read modes, d.Body comes from a pool and is recycled for
// another message as soon as handler returns: a program that keeps d.Body,
// or any slice of it, after handler returned reads another message's
// bytes. d itself is reused for the next delivery. Copy what must outlive
// the handler: bytes.Clone(d.Body), and the Delivery by value (kept :=
// *d), whose other fields (strings, Headers, tags) stay valid, so that
// kept.Ack works later. Set ConsumeFuncOptions.PoisonRecycled in tests to
// catch a body kept too long.
// In upstream mode (no read path) the bodies are upstream's, allocated per
// message and never recycled; the rule stands all the same, so that code
// does not depend on the mode.
//
// Acknowledgement is the application's, as with Consume: without AutoAck,
// call d.Ack, d.Nack or d.Reject, inside the handler or later.
//
// ConsumeFunc returns:
//   - ctx.Err() once ctx ends: the consumer is cancelled (basic.cancel),
//     and the deliveries that arrived before the broker confirmed the
//     cancel are still handed to handler first, so none is lost;
//   - the handler's error, as soon as it returns one: the consumer is
//     cancelled, and deliveries already in flight are not handed to the
//     handler: without AutoAck they are rejected with requeue (Nack), with
//     AutoAck they are dropped, as the unread deliveries of a cancelled
//     Consume chan are;
//   - the channel's or the connection's close error (a *Error, or
//     ErrClosed) when either closes, and ErrConsumerCancelled when the
//     broker cancels the consumer.
//
// In the drainer and legacy modes there is no Consume chan in between:
// ConsumeFunc takes the deliveries straight from the consumer's queue,
// every delivery of a burst per wake-up (directconsume.go). In legacy
// mode it also reads the socket itself while it waits for a delivery and
// nobody else is reading, as rabbitmq-c's amqp_consume_message does, so a
// consumer needs no DrainEvents loop beside it; where one runs (or
// AutoDrain's), whoever reads hands the deliveries over. Nobody asked
// ConsumeFunc's own reads to block, so a write from another goroutine (a
// publish) cuts them short, as with AutoDrain, even in plain legacy mode,
// where a write still waits for a DrainEvents read in progress.
func (ch *Channel) ConsumeFunc(ctx context.Context, queue string, opts ConsumeFuncOptions, handler func(d *Delivery) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tag := opts.Consumer
	if tag == "" {
		tag = uniqueConsumerTag()
	}
	closed := ch.NotifyClose(make(chan *Error, 1))
	defer ch.forgetClose(closed)
	c := ch.connection
	pooled := c != nil && c.rp != nil
	if pooled {
		// Before basic.consume: deliveries may follow consume-ok at once.
		pooledConsumers.add(ch, tag)
		defer pooledConsumers.remove(ch, tag)
	}
	var ready chan startedConsumer
	if acct := ch.consumers.acct; acct != nil {
		// Served by this goroutine, without a chan (directconsume.go).
		ready = acct.expectDirect(tag)
	}
	deliveries, err := ch.Consume(queue, tag, opts.AutoAck, opts.Exclusive, opts.NoLocal, opts.NoWait, opts.Args)
	if err != nil {
		if ready != nil {
			ch.consumers.acct.withdrawDirect(tag, ready)
		}
		return err
	}
	dc := &directConsumer{ch: ch, tag: tag, autoAck: opts.AutoAck, handle: observed(c, handler),
		pooled: pooled, poison: opts.PoisonRecycled, ctx: ctx}
	if ready != nil {
		return ch.consumeDirect(<-ready, dc, closed)
	}
	// Upstream mode: upstream's buffer feeds the Consume chan.
	return dc.serve(&consumerLoop{box: new(inbox), src: deliveries}, closed)
}

// observed returns handler, timed for Observer.Handled if c's read path
// has one that wants it.
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

// forgetClose unregisters a NotifyClose listener that ConsumeFunc
// registered, so that consumers started and ended one after another on a
// long-lived channel do not pile up listeners (and a send to each at the
// channel's close). Upstream has no way to unregister a listener; a
// channel that has closed has already dropped them all.
func (ch *Channel) forgetClose(c chan *Error) {
	ch.notifyM.Lock()
	defer ch.notifyM.Unlock()
	kept := make([]chan *Error, 0, len(ch.closes))
	for _, l := range ch.closes {
		if l != c {
			kept = append(kept, l)
		}
	}
	ch.closes = kept
}

// consumeEnded says why a consumer's deliveries ended: the channel's close
// error, if it closed, else the broker's cancel.
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
