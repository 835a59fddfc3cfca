// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

// consumerLoop hands a consumer's deliveries in order to its handler (out or
// fn), or drops them, releasing each from the budget. A cancel hands over what
// came before it; the channel's close, and in the drainer and legacy modes an
// intentional Close's start (#17: its backlog is no longer ackable), drop all.
type consumerLoop struct {
	box    *inbox
	budget *budget
	// in is closed by a cancel (only upstream's send sends on it); nil once closed, or
	// once the channel closed.
	in chan *Delivery
	// closed is the channel's close (consumers.closed); closing is Close's start, nil
	// once seen.
	closed, closing <-chan struct{}
	// dropping: drop instead of handing over (consumerLoop's doc says when, and
	// directConsumer.cancel).
	dropping bool
	// src, in upstream mode only, is the Consume chan feeding a ConsumeFunc; nil
	// otherwise or once closed.
	src  <-chan Delivery
	done <-chan struct{} // a ConsumeFunc's ctx.Done(), nil once seen (or if it has none)
	out  chan Delivery   // the Consume chan handler; nil for ConsumeFunc's
	fn   *directConsumer // ConsumeFunc's handler; nil for the Consume chan's
}

// startedConsumer is a consumer as Consume starts it.
type startedConsumer struct {
	in  chan *Delivery // the inbound chan, upstream's key for the consumer
	out chan Delivery  // the application's Consume chan
	box *inbox
}

// loop returns the consumer loop over c, for a handler to be set.
func (subs *consumers) loop(c startedConsumer) *consumerLoop {
	return &consumerLoop{box: c.box, budget: subs.acct.budget, closed: subs.closed, in: c.in,
		closing: subs.acct.closing}
}

// finish releases and forgets an ended consumer's inbox. It runs only once nothing can
// reach the inbox any more (its inbound chan or channel closed), so no delivery arrives
// after its budget charge was released: that charge would never be released again.
func (c startedConsumer) finish(acct *deliveryAcct) {
	c.box.attach(nil) // before close(out): no hand-over may follow it
	acct.budget.release(c.box.clear())
	acct.forget(c.in, c.box)
}

// bufferFor runs the loop, upstream's buffer (no budget), or hands over to ConsumeFunc.
//
// It runs on the goroutine upstream starts per consumer (consumers.add). A ConsumeFunc
// takes the consumer over instead (takeDirect), and this goroutine leaves the consumers'
// wait group at once: a channel's shutdown waits for that group, and must never wait for
// a handler that the application's goroutine runs.
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

// run runs until the consumer ended and all queued before the end left.
//
// The Consume chan's deliveries leave only when the application receives them (wait's out
// case), so a delivery is charged to the budget until the application has it: a slow
// reader of the chan holds budget, and over the budget the drainer stops reading the
// socket (TCP backpressure) instead of buffering without bound. ConsumeFunc's handler runs
// on this goroutine, so its deliveries leave as it is called.
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
				recycleDelivery(it.d)
				continue
			}
		} else if next, ok := l.box.front(); ok {
			l.wait(next.d) // the Consume chan takes it once received
			continue
		}
		if l.in == nil && l.src == nil {
			return
		}
		l.wait(nil)
	}
}

// wait waits for one event, such as the Consume chan taking next (if set). One select
// over every event the loop reacts to, so that a delivery offered on out never blocks the
// loop's view of a close, a cancel, ctx's end or a new delivery: each of those changes
// what the loop may hand over next.
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
			l.src = nil
		} else {
			l.fn.deliver(&d, l.dropping)
		}
	case <-l.done:
		l.done = nil
		l.fn.ctxDone()
	case out <- v:
		it, _ := l.box.take()
		l.budget.release(it.cost)
		recycleDelivery(it.d)
	case turn <- struct{}{}:
		l.fn.readWithTurn()
	}
}

// turnToTake returns the read turn for wait's select if no other event is ready; took: it
// did one itself (l.in read, or a read made with the turn). While deliveries stream the
// turn is usually free, and taking it here saves wait a select of nine cases.
func (l *consumerLoop) turnToTake() (turn chan struct{}, took bool) {
	if turn = l.fn.turn(); turn == nil { // no ConsumeFunc (nil l.fn), or it reads no more
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
	select {
	case turn <- struct{}{}: // free while streaming: wait's select costs more than the read
		l.fn.readWithTurn()
		return nil, true
	default:
		return turn, false
	}
}

// inbound queues what upstream's send handed over; a closed chan is a cancel. Upstream
// closes a consumer's inbound chan as its cancel completes (consumers.cancel), and the
// loop hands over what was queued by then before it ends: a cancel loses nothing that
// came before it.
func (l *consumerLoop) inbound(d *Delivery, ok bool) {
	if !ok {
		l.in = nil
		return
	}
	l.box.put(d, deliveryCost(d), l.budget)
}

// isClosing reports whether closing (only ever closed) has; false for nil.
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

// cancelFedBy cancels tag only if in still feeds it: a consumer tag may be reused by a
// later Consume, whose consumer a late cancel of the first must not end.
func (subs *consumers) cancelFedBy(tag string, in chan *Delivery) {
	if subs.inboundChan(tag) == in {
		subs.cancel(tag)
	}
}
