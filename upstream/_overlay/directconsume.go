// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"context"
)

// ConsumeFunc without a buffer goroutine (issue #18).
//
// A Consume chan costs a goroutine hop per delivery: the read path hands
// each delivery to the consumer's buffer goroutine or, when the
// application already waits, straight to it on the chan, and either way
// the receiving goroutine is woken once per delivery. ConsumeFunc owns
// its chan, so in the drainer and legacy modes it does without one: its
// own goroutine takes the deliveries out of the consumer's inbox
// (inbox.go), every delivery of a burst per wake-up. In legacy mode it
// goes further, as rabbitmq-c's amqp_consume_message does: when its inbox
// is empty and nobody is reading the socket, the ConsumeFunc goroutine
// takes the read turn and reads itself, so that a consumer that is the
// only reader costs no goroutine switch at all; while another goroutine
// reads (a DrainEvents loop, an RPC caller, AutoDrain's loop), it waits
// for what that one hands over.
//
// Nothing else changes. The budget counts a delivery until the handler
// gets it; the order is the inbox's; a cancel still hands over what
// arrived before the broker's cancel-ok; a channel close drops what is
// queued, as upstream's buffer does; once Close has begun the deliveries
// are dropped (closedrop.go). Consume's buffer start (bufferFor) hands the
// consumer over instead of running a buffer goroutine, and gives back its
// place in the consumers' wait group at once: the handler runs on the
// application's goroutine, and a channel's shutdown must never wait for
// it.

// directHandoff is a consumer that Consume started for the ConsumeFunc
// that serves it: its inbound chan (closed by a cancel or the channel's
// close), the Consume chan that ConsumeFunc never reads and closes at the
// end, and its inbox.
type directHandoff struct {
	in  chan *Delivery
	out chan Delivery
	box *inbox
}

// expectDirect registers tag as served by the calling ConsumeFunc, before
// its Consume: the returned chan receives the consumer once Consume
// starts it.
func (acct *deliveryAcct) expectDirect(tag string) chan directHandoff {
	ib := &acct.inboxes
	ib.mu.Lock()
	defer ib.mu.Unlock()
	if ib.direct == nil {
		ib.direct = map[string]chan directHandoff{}
	}
	ready := make(chan directHandoff, 1)
	ib.direct[tag] = ready
	return ready
}

// takeDirect returns, and unregisters, the ConsumeFunc waiting to serve
// tag; nil when none does.
func (acct *deliveryAcct) takeDirect(tag string) chan directHandoff {
	ib := &acct.inboxes
	ib.mu.Lock()
	defer ib.mu.Unlock()
	ready := ib.direct[tag]
	delete(ib.direct, tag)
	return ready
}

// withdrawDirect unregisters ready after a failed Consume. If the
// consumer's start already took it, the consumer is on its way to ready,
// and withdrawDirect waits for it and ends it (as its buffer would have
// at the cancel that the failed Consume made).
func (acct *deliveryAcct) withdrawDirect(tag string, ready chan directHandoff) {
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

// endDirect releases what a served consumer still holds and closes its
// Consume chan. The consumer has ended (its inbound chan closed, or the
// channel closed): no delivery can reach its inbox any more, so
// forgetting the inbox cannot leave a delivery charged to the budget.
func (acct *deliveryAcct) endDirect(h directHandoff) {
	acct.budget.release(h.box.clear())
	acct.forget(h.in, h.box)
	close(h.out)
}

// handOver is bufferFor for a consumer that a ConsumeFunc serves: it
// hands the consumer to it and leaves the wait group at once.
func (subs *consumers) handOver(ready chan directHandoff, tag string, in chan *Delivery, out chan Delivery) {
	defer subs.Done()
	ready <- directHandoff{in: in, out: out, box: subs.acct.inboxOf(in, tag)}
}

// take removes the next delivery and returns it. When the inbox is empty
// it reports false, and the taker counts as parked: the next put wakes it.
func (b *inbox) take() (inboxItem, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	it, ok := b.q.front()
	if !ok {
		return it, false
	}
	b.q.drop()
	var oldest int64
	if rest := b.q.queued(); len(rest) > 0 {
		oldest = rest[0].at
	}
	b.st.popped(it.cost, oldest)
	return it, true
}

// directConsumer is the state of one ConsumeFunc serving its consumer.
type directConsumer struct {
	ch      *Channel
	tag     string
	autoAck bool
	handle  func(*Delivery) error
	recycle func(*Delivery)

	box    *inbox
	in     chan *Delivery  // nil once the consumer ended
	done   <-chan struct{} // ctx.Done(), nil once seen (or if it has none)
	legacy consumerReader  // legacy mode, while this goroutine may read

	failed   error // the handler's error: the rest is requeued
	ended    error // ctx's error once it ended
	dropping bool  // the channel closed, or the cancel could not be sent
}

// consumeDirect runs ConsumeFunc's loop over a consumer it serves itself,
// and returns what ConsumeFunc returns (see there).
func (ch *Channel) consumeDirect(ctx context.Context, h directHandoff, dc *directConsumer, closed <-chan *Error) error {
	acct := ch.consumers.acct
	defer acct.endDirect(h)
	dc.box, dc.in, dc.done = h.box, h.in, ctx.Done()
	if rp := ch.connection.rp; rp != nil {
		dc.legacy = rp.base().mode.consumerReader()
	}
	d := new(Delivery) // one for the whole consumption, as on the chan path
	for {
		if it, ok := h.box.take(); ok {
			acct.budget.release(it.cost)
			dc.deliver(d, it.d, isClosing(acct.closing))
			continue
		}
		if dc.in == nil {
			break // ended, and everything it had queued is handled
		}
		// Nothing queued: wait for a delivery or the end. In legacy mode,
		// read the socket meanwhile, but only when nothing else is ready
		// (a select picks at random among ready cases, and a read may
		// wait long for a frame that nobody will send any more), and only
		// while the consumption runs: a cancel under way has read its
		// cancel-ok already.
		if dc.legacy == nil || dc.ended != nil || dc.failed != nil || dc.dropping {
			dc.wait(ctx, nil)
			continue
		}
		if !dc.poll(ctx) {
			dc.wait(ctx, dc.legacy.readTurn())
		}
	}
	switch {
	case dc.failed != nil:
		return dc.failed
	case dc.ended != nil:
		return dc.ended
	}
	return consumeEnded(closed)
}

// poll takes one event that is ready, without waiting, and reports
// whether there was one.
func (dc *directConsumer) poll(ctx context.Context) bool {
	select {
	case <-dc.ch.consumers.closed:
		dc.channelClosed()
	case <-dc.box.wake:
	case d, ok := <-dc.in:
		dc.inbound(d, ok)
	case <-dc.done:
		dc.ctxDone(ctx)
	default:
		return false
	}
	return true
}

// wait waits for one event; with turn set (legacy mode) taking the read
// turn is one, and reads the socket.
func (dc *directConsumer) wait(ctx context.Context, turn chan struct{}) {
	select {
	case <-dc.ch.consumers.closed:
		dc.channelClosed()
	case <-dc.box.wake:
	case d, ok := <-dc.in:
		dc.inbound(d, ok)
	case <-dc.done:
		dc.ctxDone(ctx)
	case turn <- struct{}{}:
		if err := dc.legacy.pumpFor(ctx, dc.box); err != nil {
			// Close pumps for its close-ok, or the connection ended:
			// from now on wait for what others read, and for the
			// channel's end, which either brings.
			dc.legacy = nil
		}
	}
}

// channelClosed: upstream's buffer drops what is queued when the channel
// closes, and so does this.
func (dc *directConsumer) channelClosed() { dc.in, dc.dropping = nil, true }

// inbound takes what upstream's send handed over on the inbound chan (the
// read paths deliver through the inbox instead); a closed chan is the
// consumer's cancel.
func (dc *directConsumer) inbound(d *Delivery, ok bool) {
	if !ok {
		dc.in = nil
		return
	}
	dc.box.put(d, deliveryCost(d), dc.ch.consumers.acct.budget)
}

// ctxDone cancels the consumer; what arrived before the cancel-ok is
// still handled.
func (dc *directConsumer) ctxDone(ctx context.Context) {
	dc.done = nil
	dc.ended = ctx.Err()
	dc.cancel()
}

// deliver hands one delivery to the handler, or requeues or drops it once
// the consumption is ending.
func (dc *directConsumer) deliver(d, next *Delivery, closing bool) {
	switch {
	case closing || dc.dropping:
		// Close has begun (closedrop.go), or the channel is gone.
	case dc.failed != nil:
		if !dc.autoAck {
			_ = next.Nack(false, true)
		}
	default:
		*d = *next
		err := dc.handle(d)
		dc.recycle(d)
		if err != nil {
			dc.failed = err
			dc.cancel()
		}
		return
	}
	dc.recycle(next)
}

// cancel asks the broker to cancel the consumer. When it cannot (the
// channel is gone), the deliveries still queued are dropped, as those of
// a closed channel are.
func (dc *directConsumer) cancel() {
	if err := dc.ch.Cancel(dc.tag, false); err != nil {
		dc.dropping = true
	}
}
