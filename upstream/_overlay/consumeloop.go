// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

// The consumer rules, in one place: consumerLoop. They are upstream's
// buffer's (consumers.buffer) and issue #17's:
//   - a cancel (the inbound chan closed) hands over what came before it,
//     then the consumer ends;
//   - the channel's close drops what is queued, and the consumer ends;
//   - in the drainer and legacy modes, once the application has called
//     Close, nothing more is handed over: what is queued or still arrives
//     is dropped until the consumer ends (cancelled, or the teardown), so
//     a Consume chan still closes at the teardown, as upstream's.
//
// Why Close drops: Close waits for the broker's close-ok, which the broker
// sends only once it has worked through everything the client wrote
// before connection.close: under a publisher that saturates the socket,
// megabytes of publishes that it routes, and delivers, while Close waits.
// Upstream hands every one of those deliveries to the application until
// the teardown, and drops whatever is still buffered then. In the drainer
// and legacy modes the application gets no delivery it could no longer
// acknowledge (an ack written after connection.close is discarded, and
// the broker requeues what was unacknowledged), and the client stops
// spending the CPU that the broker needs for the backlog Close waits on.
// Nothing else changes: RPC replies, confirmations, returns and every
// other notification keep their order and reach their listeners as
// documented. Upstream mode, which has no delivery budget, is upstream's.
// The chan that says Close has begun is the read path's
// closeIntent.calledC (makeConsumers), closed by an intentional Close
// only, never by the library's own close after a protocol error or by a
// failure.

// consumerLoop runs one consumer: it takes the deliveries out of the
// consumer's inbox (inbox.go) in order, and hands each to its handler,
// the application's Consume chan (out, sent to in the loop's select) or
// ConsumeFunc's (fn, called on the ConsumeFunc's goroutine), or, under
// the rules above, drops it. Whatever leaves the inbox, handed over or
// dropped, is released from the budget.
type consumerLoop struct {
	box    *inbox
	budget *budget
	closed <-chan struct{} // the channel's close: the consumers' closed
	// in is the inbound chan, closed by a cancel; nil once it was, or
	// once the channel closed. Only upstream's send sends on it (the read
	// paths deliver through the inbox).
	in       chan *Delivery
	closing  <-chan struct{} // closed when Close begins; nil once seen
	dropping bool            // drop instead of handing over: see the rules, and directConsumer.cancel

	// src is, in upstream mode, the Consume chan that upstream's buffer
	// feeds a ConsumeFunc through (which applies the rules itself); nil
	// otherwise, and once it closed.
	src  <-chan Delivery
	done <-chan struct{} // a ConsumeFunc's ctx.Done(), nil once seen (or if it has none)

	out chan Delivery   // the Consume chan handler; nil for ConsumeFunc's
	fn  *directConsumer // ConsumeFunc's handler; nil for the Consume chan's
}

// startedConsumer is a consumer as Consume starts it: its inbound chan
// (upstream's key for it), the application's Consume chan, and its inbox.
type startedConsumer struct {
	in  chan *Delivery
	out chan Delivery
	box *inbox
}

// loop returns the consumer loop over c, for a handler to set.
func (subs *consumers) loop(c startedConsumer) *consumerLoop {
	acct := subs.acct
	return &consumerLoop{box: c.box, budget: acct.budget, closed: subs.closed, in: c.in, closing: acct.closing}
}

// finish releases what the consumer's inbox still holds and forgets it.
// The consumer has ended (its inbound chan closed, or the channel
// closed): no delivery can reach its inbox any more, so forgetting it
// cannot leave a delivery charged to the budget.
func (c startedConsumer) finish(acct *deliveryAcct) {
	c.box.detach() // before close(out): no hand-over may follow it
	acct.budget.release(c.box.clear())
	acct.forget(c.in, c.box)
}

// bufferFor runs the buffer between the dispatcher and the application's
// chan: upstream's without a budget; else the consumer loop with the
// Consume chan as its handler, or, for a ConsumeFunc, the hand-over of
// the consumer to it. The hand-over leaves the consumers' wait group at
// once: the handler runs on the application's goroutine, and a channel's
// shutdown must never wait for it.
func (subs *consumers) bufferFor(tag string, in chan *Delivery, out chan Delivery) {
	acct := subs.acct
	if acct == nil {
		subs.buffer(in, out)
		return
	}
	c := startedConsumer{in: in, out: out, box: acct.inboxOf(in, tag)}
	if ready := acct.takeDirect(tag); ready != nil {
		defer subs.Done()
		ready <- c
		return
	}
	defer close(out)
	defer subs.Done()
	defer c.finish(acct)
	c.box.attach(out)
	l := subs.loop(c)
	l.out = out
	l.run()
}

// run takes the deliveries until the consumer ended and every delivery
// queued before the end has left.
func (l *consumerLoop) run() {
	for {
		if isClosing(l.closing) {
			l.closing, l.dropping = nil, true
		}
		if l.dropping || l.fn != nil {
			if it, ok := l.box.take(); ok {
				l.budget.release(it.cost)
				if l.fn != nil {
					l.fn.deliver(it.d, l.dropping)
				}
				continue
			}
		} else if next, ok := l.box.front(); ok {
			l.wait(next.d) // the Consume chan takes it once received
			continue
		}
		if l.in == nil && l.src == nil {
			return // ended, and everything queued before was handled
		}
		l.wait(nil)
	}
}

// wait waits for one event. With next set, the Consume chan taking it is
// one; for a ConsumeFunc in legacy mode, so is taking the read turn
// (turnToTake), which reads the socket.
func (l *consumerLoop) wait(next *Delivery) {
	var out chan Delivery
	var v Delivery
	if next != nil {
		out, v = l.out, *next
	}
	turn, took := l.turnToTake()
	if took {
		return
	}
	select {
	case <-l.closed:
		l.in, l.dropping = nil, true
	case <-l.closing:
	case <-l.box.wake:
	case d, ok := <-l.in:
		l.inbound(d, ok)
	case d, ok := <-l.src:
		if !ok {
			l.src = nil // the consumer ended
		} else {
			l.fn.deliver(&d, l.dropping)
		}
	case <-l.done:
		l.done = nil
		l.fn.ctxDone()
	case out <- v:
		it, _ := l.box.take()
		l.budget.release(it.cost)
	case turn <- struct{}{}:
		l.fn.readTurn()
	}
}

// turnToTake returns ConsumeFunc's read turn (legacy mode) for wait to
// take, nil if it has none or an event is ready: a select picks at random
// among ready cases, and a read may wait long for a frame that nobody
// will send any more. What waits on the inbound chan cannot be looked at
// without taking it: when turnToTake took it, it says so, and wait
// returns at once.
func (l *consumerLoop) turnToTake() (turn chan struct{}, took bool) {
	if l.fn == nil || l.fn.turn() == nil {
		return nil, false
	}
	select {
	case d, ok := <-l.in:
		l.inbound(d, ok)
		return nil, true
	default:
	}
	if isClosing(l.closed) || isClosing(l.closing) || isClosing(l.done) || len(l.box.wake) > 0 {
		return nil, false
	}
	return l.fn.turn(), false
}

// inbound takes what upstream's send handed over on the inbound chan; a
// closed chan is the consumer's cancel.
func (l *consumerLoop) inbound(d *Delivery, ok bool) {
	if !ok {
		l.in = nil
		return
	}
	l.box.put(d, deliveryCost(d), l.budget)
}

// isClosing reports whether closing, a chan that is only ever closed, has
// closed (for the most part: whether Close has begun); false for nil.
func isClosing(closing <-chan struct{}) bool {
	select {
	case <-closing:
		return true
	default:
		return false
	}
}

// inboundChan returns the chan that feeds tag's buffer, nil if there is none.
func (subs *consumers) inboundChan(tag string) chan *Delivery {
	subs.Lock()
	defer subs.Unlock()
	return subs.chans[tag]
}

// cancelFedBy is upstream's consumers.cancel for the consumer whose buffer
// in feeds, and only for it: when the cancel runs late (after notifications
// the user has not read yet), the tag may since have been cancelled by the
// application, or even reused by a new Consume, which this must not end.
func (subs *consumers) cancelFedBy(tag string, in chan *Delivery) {
	subs.Lock()
	same := subs.chans[tag] == in
	subs.Unlock()
	if same {
		subs.cancel(tag)
	}
}
