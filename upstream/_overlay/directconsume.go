// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import "context"

// The hand-over from Consume to ConsumeFunc. ConsumeFunc calls Consume, whose consumer
// goroutine (bufferFor) must not run the loop itself: the loop runs on ConsumeFunc's
// goroutine. The registration below tells bufferFor so, by tag, before Consume starts
// that goroutine; the ready chan (capacity 1, so bufferFor never waits) carries the
// started consumer across.

// expectDirect registers tag for the calling ConsumeFunc, before its Consume.
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

// takeDirect unregisters and returns tag's ConsumeFunc, nil if none.
func (acct *deliveryAcct) takeDirect(tag string) chan startedConsumer {
	ib := &acct.inboxes
	ib.mu.Lock()
	defer ib.mu.Unlock()
	ready := ib.direct[tag]
	delete(ib.direct, tag)
	return ready
}

// withdrawDirect unregisters ready after a failed Consume, or ends its consumer. A failed
// Consume may still have started the consumer (its basic.consume-ok came, then the call
// failed): then bufferFor took the registration, and the consumer it sent must be ended
// here, or its inbox would keep a budget charge for ever.
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

// endDirect finishes a ConsumeFunc's consumer and closes its unread chan.
func (acct *deliveryAcct) endDirect(h startedConsumer) {
	h.finish(acct)
	close(h.out)
}

// directConsumer is a ConsumeFunc: its loop's handler, on its goroutine (#18).
//
// Why a ConsumeFunc reads the socket itself: a delivery that the reader queues for another
// goroutine costs a wake of that goroutine, and often of an idle P, per delivery. A
// ConsumeFunc with nothing queued instead takes the read turn (turn, readWithTurn): it
// reads, the frames it routes land in its own inbox, and its handler runs them with no
// hop. With a holder (the drainer, AutoDrain) the turn is lent and taken back when the
// socket goes quiet (readturn.go); in plain legacy the ConsumeFunc is one more caller that
// drives the read. Either way the turn keeps one reader at a time, so frames stay in order
// across all of the connection's channels.
type directConsumer struct {
	*consumerLoop
	ch             *Channel
	tag            string
	autoAck        bool
	handle         func(*Delivery) error
	pooled, poison bool // bodies from the pool (bodypool.go); ConsumeFuncOptions.PoisonRecycled
	ctx            context.Context
	cur            Delivery  // the one the handler gets, for the whole consumption
	rp             *readBase // the read path, while this goroutine may read (nil: never)
	gen            *readGen  // the generation whose read turn it takes
	// failed is the handler's error (the rest are requeued, or dropped if autoAck);
	// ended is ctx's, once it ended.
	failed, ended error
}

// consumeDirect runs ConsumeFunc's loop over a consumer it serves itself.
func (ch *Channel) consumeDirect(h startedConsumer, dc *directConsumer,
	closed <-chan *Error) error {
	defer ch.consumers.acct.endDirect(h)
	if rp := ch.connection.rp; rp != nil && rp.base().mode != nil {
		dc.rp = rp.base()
		dc.gen = dc.rp.mode.generation()
	}
	return dc.serve(ch.consumers.loop(h), closed)
}

// serve runs l with dc as its handler, and returns what ConsumeFunc returns.
func (dc *directConsumer) serve(l *consumerLoop, closed <-chan *Error) error {
	dc.consumerLoop = l
	l.fn = dc
	l.done = dc.ctx.Done()
	dc.run()
	switch {
	case dc.failed != nil:
		return dc.failed
	case dc.ended != nil:
		return dc.ended
	}
	return consumeEnded(closed)
}

// turn is the read turn to take (readTurn.offer), nil once ending (cancel-ok is read),
// for a nil dc, or where this ConsumeFunc reads no more.
func (dc *directConsumer) turn() chan struct{} {
	if dc == nil || dc.gen == nil || dc.ended != nil || dc.failed != nil || dc.dropping {
		return nil
	}
	return dc.gen.turn.offer()
}

// readWithTurn reads, the turn taken (after an error, others' reads bring the rest). As the
// loop looks at the inbox next, its own puts' wake token would only cost it a select.
func (dc *directConsumer) readWithTurn() {
	if err := dc.rp.consumerRead(dc.ctx, dc.gen, dc.box); err != nil {
		dc.gen = nil
	}
	if len(dc.box.wake) > 0 { // only this goroutine takes tokens: no wait
		<-dc.box.wake
	}
}

// ctxDone cancels the consumer; what arrived before cancel-ok is handled. ctx's end is
// not a drop: the broker may already have sent deliveries, which are the application's
// (unacked ones would be redelivered elsewhere only after the channel closes).
func (dc *directConsumer) ctxDone() {
	dc.ended = dc.ctx.Err()
	dc.cancel()
}

// deliver hands next to the handler, or drops it, or once failed requeues it (!autoAck).
// The handler gets dc.cur, one Delivery for the whole consumption, so that a delivery
// costs no allocation; a handler must not keep it past its return (ConsumeFunc's doc).
func (dc *directConsumer) deliver(next *Delivery, drop bool) {
	d := &dc.cur
	*d = *next
	var err error
	switch {
	case drop:
	case dc.failed != nil:
		if !dc.autoAck {
			_ = d.Nack(false, true)
		}
	default:
		err = dc.handle(d)
	}
	// The handler is done with d's body: take it back.
	if dc.pooled {
		recycleBody(d.Body, dc.poison)
	}
	d.Body = nil
	if err != nil {
		dc.failed = err
		dc.cancel()
	}
}

// cancel cancels the consumer, or drops the rest if the channel is gone: with no channel
// there is no cancel-ok to wait for, and nothing that arrives can be acknowledged.
func (dc *directConsumer) cancel() {
	if err := dc.ch.Cancel(dc.tag, false); err != nil {
		dc.dropping = true
	}
}
