// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"context"
)

// ConsumeFunc's handler of the consumer loop (consumeloop.go): ConsumeFunc
// without a buffer goroutine (issue #18).
//
// A Consume chan wakes the goroutine that receives once per delivery.
// ConsumeFunc owns its chan, so in the drainer and legacy modes it does
// without one: its own goroutine runs the consumer loop over the
// consumer's inbox (inbox.go), every delivery of a burst per wake-up. In
// legacy mode, as rabbitmq-c's amqp_consume_message, when its inbox is
// empty and nobody reads the socket, it takes the read turn and reads
// itself, so a consumer that is the only reader costs no goroutine switch;
// while another goroutine reads (a DrainEvents loop, an RPC caller,
// AutoDrain's), it waits for what that one hands over. In upstream mode
// the loop takes the deliveries from the Consume chan (consumerLoop.src).
// The loop's rules hold as for a Consume chan; ConsumeFunc's own (a
// handler's error, ctx's end) are directConsumer's.

// expectDirect registers tag as served by the calling ConsumeFunc, before
// its Consume: the returned chan receives the consumer once Consume
// starts it (bufferFor).
func (acct *deliveryAcct) expectDirect(tag string) chan startedConsumer {
	ib := &acct.inboxes
	ib.mu.Lock()
	defer ib.mu.Unlock()
	if ib.direct == nil {
		ib.direct = map[string]chan startedConsumer{}
	}
	ready := make(chan startedConsumer, 1)
	ib.direct[tag] = ready
	return ready
}

// takeDirect returns, and unregisters, the ConsumeFunc waiting to serve
// tag; nil when none does.
func (acct *deliveryAcct) takeDirect(tag string) chan startedConsumer {
	ib := &acct.inboxes
	ib.mu.Lock()
	defer ib.mu.Unlock()
	ready := ib.direct[tag]
	delete(ib.direct, tag)
	return ready
}

// withdrawDirect unregisters ready after a failed Consume. If the
// consumer's start already took it, the consumer is on its way to ready,
// and withdrawDirect waits for it and ends it (as its loop would have at
// the cancel that the failed Consume made).
func (acct *deliveryAcct) withdrawDirect(tag string, ready chan startedConsumer) {
	ib := &acct.inboxes
	ib.mu.Lock()
	mine := ib.direct[tag] == ready
	if mine {
		delete(ib.direct, tag)
	}
	ib.mu.Unlock()
	if !mine {
		acct.endDirect(<-ready)
	}
}

// endDirect ends a consumer that a ConsumeFunc served (or would have):
// its inbox is released and forgotten, and its Consume chan, which
// ConsumeFunc never reads, closed.
func (acct *deliveryAcct) endDirect(h startedConsumer) {
	h.finish(acct)
	close(h.out)
}

// directConsumer is the state of one ConsumeFunc: the handler of its
// consumer loop, which runs on the ConsumeFunc's goroutine in every mode.
type directConsumer struct {
	*consumerLoop
	ch      *Channel
	tag     string
	autoAck bool
	handle  func(*Delivery) error
	pooled  bool // the bodies come from the pool (bodypool.go)
	poison  bool // ConsumeFuncOptions.PoisonRecycled
	ctx     context.Context
	cur     Delivery       // the one the handler gets, for the whole consumption
	legacy  consumerReader // legacy mode, while this goroutine may read

	failed error // the handler's error: the rest is requeued
	ended  error // ctx's error once it ended
}

// consumeDirect runs ConsumeFunc's loop over a consumer it serves itself,
// and returns what ConsumeFunc returns (see there).
func (ch *Channel) consumeDirect(h startedConsumer, dc *directConsumer, closed <-chan *Error) error {
	defer ch.consumers.acct.endDirect(h)
	if rp := ch.connection.rp; rp != nil {
		dc.legacy = rp.base().mode.consumerReader()
	}
	return dc.serve(ch.consumers.loop(h), closed)
}

// serve runs l with dc as its handler, and returns what ConsumeFunc
// returns.
func (dc *directConsumer) serve(l *consumerLoop, closed <-chan *Error) error {
	dc.consumerLoop, l.fn, l.done = l, dc, dc.ctx.Done()
	dc.run()
	switch {
	case dc.failed != nil:
		return dc.failed
	case dc.ended != nil:
		return dc.ended
	}
	return consumeEnded(closed)
}

// turn is the legacy read turn for the loop to take while it waits: only
// in legacy mode, and only while the consumption runs (a cancel under way
// has read its cancel-ok already); nil otherwise.
func (dc *directConsumer) turn() chan struct{} {
	if dc.legacy == nil || dc.ended != nil || dc.failed != nil || dc.dropping {
		return nil
	}
	return dc.legacy.readTurn()
}

// readTurn reads the socket with the turn the loop took.
func (dc *directConsumer) readTurn() {
	if err := dc.legacy.pumpFor(dc.ctx, dc.box); err != nil {
		// Close pumps for its close-ok, or the connection ended: from
		// now on wait for what others read, and for the channel's end,
		// which either brings.
		dc.legacy = nil
	}
}

// ctxDone cancels the consumer; what arrived before the cancel-ok is
// still handled.
func (dc *directConsumer) ctxDone() {
	dc.ended = dc.ctx.Err()
	dc.cancel()
}

// deliver hands one delivery to the handler or, once the handler failed,
// requeues it (dropped with AutoAck); with drop (the loop's rules) it
// drops it.
func (dc *directConsumer) deliver(next *Delivery, drop bool) {
	d := &dc.cur
	*d = *next
	switch {
	case drop:
	case dc.failed != nil:
		if !dc.autoAck {
			_ = d.Nack(false, true)
		}
	default:
		err := dc.handle(d)
		dc.recycle(d)
		if err != nil {
			dc.failed = err
			dc.cancel()
		}
		return
	}
	dc.recycle(d)
}

// recycle takes d's body back once the handler is done with it.
func (dc *directConsumer) recycle(d *Delivery) {
	if dc.pooled {
		recycleBody(d.Body, dc.poison)
	}
	d.Body = nil
}

// cancel asks the broker to cancel the consumer. When it cannot (the
// channel is gone), the deliveries still queued are dropped, as those of
// a closed channel are.
func (dc *directConsumer) cancel() {
	if err := dc.ch.Cancel(dc.tag, false); err != nil {
		dc.dropping = true
	}
}
