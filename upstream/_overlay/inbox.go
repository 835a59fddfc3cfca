// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import "sync"

// A consumer's inbox and the budget behind it.
//
// Deliveries wait for the application (its Consume chan, or ConsumeFunc's
// handler); upstream's buffer has no bound and hands each delivery over
// on an unbuffered chan, a goroutine switch per delivery. A read path
// instead appends each delivery to its consumer's inbox under a lock,
// which never waits for the application, and wakes the consumer loop
// (consumeloop.go) only when it found the inbox empty and parked: one
// wake-up per burst (the deliveries of one socket read). Each delivery
// is charged to the read path's budget from the moment it is dispatched
// until the loop hands it over or drops it, so a consumer that stops
// reading makes the drainer stop reading the socket instead of growing
// the heap (legacy mode keeps the count for Stats and never pauses). The
// inbox also keeps each delivery's arrival, for Stats and warnings.

// deliveryAcct is a channel's tie to its read path's accounting.
type deliveryAcct struct {
	budget  *budget
	buffers *bufferSet
	channel uint16
	obs     *Observer
	closing <-chan struct{} // closed when Close begins (consumeloop.go)
	inboxes inboxes         // each consumer's queue of deliveries
}

// makeConsumers builds a channel's consumer registry, tied to the read
// path's budget when it keeps one.
func (c *Connection) makeConsumers(id uint16) *consumers {
	subs := makeConsumers()
	if c != nil && c.rp != nil {
		if rb := c.rp.base(); rb.deliveries != nil {
			subs.acct = &deliveryAcct{budget: rb.deliveries, buffers: &rb.buffers, channel: id, obs: rb.obs, closing: rb.calledC}
		}
	}
	return subs
}

// deliveryCost is what a buffered delivery is charged.
func deliveryCost(d *Delivery) int64 { return frameCost + int64(len(d.Body)) }

// deliver hands a delivery to the application if it waits for one, else
// to its consumer's inbox, charged to the budget until the application
// receives it. It never waits for the application.
func (subs *consumers) deliver(tag string, d *Delivery) {
	acct := subs.acct
	if acct.obs != nil && acct.obs.Delivered != nil {
		acct.obs.Delivered(d)
	}
	if isClosing(acct.closing) {
		return // Close has begun: dropped (consumeloop.go)
	}
	subs.Lock()
	in, found := subs.chans[tag]
	if !found {
		// No such consumer (cancelled with deliveries in flight): dropped,
		// as upstream drops it.
		subs.Unlock()
		return
	}
	box := acct.inboxOf(in, tag)
	queued := box.put(d, deliveryCost(d), acct.budget)
	subs.Unlock()
	// The watcher may log, and the Logger is user code: not under the
	// consumers' lock, which Cancel, Consume and the teardown take.
	if w := acct.buffers.watch; queued && w != nil {
		w.consumerQueued(box.st)
	}
}

// inbox is one consumer's queue of deliveries not yet handed over.
type inbox struct {
	st      *bufferStat     // what Stats reads of it
	wake    chan struct{}   // a token when a put found the taker parked
	closing <-chan struct{} // closed when Close begins: no more direct hand-overs (consumeloop.go)

	mu sync.Mutex
	q  runQueue[inboxItem] // running: the taker is not parked
	// out is the application's Consume chan while its consumer loop
	// runs, nil before and after (out closes once it is nil again).
	out chan Delivery
}

// inboxItem is a delivery, what it is charged, and when it arrived
// (monoNow).
type inboxItem struct {
	d    *Delivery
	at   int64
	cost int64
}

// put hands d over, in order after what is queued: straight to the
// application when nothing is queued and it waits on its Consume chan
// (no hop through the consumer loop, no charge), else into the queue,
// charged cost to budget until handed over, waking the taker if it is
// parked. It reports whether d was queued.
//
// The direct hand-over keeps the order: with nothing queued, the loop is
// not sending (it takes a delivery out of the queue only once the
// application has received it), and it cannot take one while put holds
// the lock.
func (b *inbox) put(d *Delivery, cost int64, budget *budget) (queued bool) {
	b.mu.Lock()
	if b.out != nil && len(b.q.queued()) == 0 && !isClosing(b.closing) {
		select {
		case b.out <- *d:
			b.mu.Unlock()
			return false
		default:
		}
	}
	budget.charge(cost)
	wake := b.q.put(inboxItem{d: d, at: monoNow(), cost: cost})
	b.st.pushed(cost, b.q.queued()[0].at)
	b.mu.Unlock()
	if wake {
		select {
		case b.wake <- struct{}{}:
		default: // a token already waits
		}
	}
	return true
}

// attach and detach set the application's chan for direct hand-overs.
func (b *inbox) attach(out chan Delivery) {
	b.mu.Lock()
	b.out = out
	b.mu.Unlock()
}

func (b *inbox) detach() { b.attach(nil) }

// front returns the next delivery, leaving it in the inbox. When the
// inbox is empty it reports false, and the taker counts as parked: the
// next put wakes it.
func (b *inbox) front() (inboxItem, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.q.front()
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

// clear empties the inbox and returns what its deliveries were charged.
func (b *inbox) clear() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var cost int64
	for _, it := range b.q.queued() {
		cost += it.cost
	}
	for len(b.q.queued()) > 0 {
		b.q.drop()
	}
	b.q.front() // empty: resets the slice
	b.st.cleared()
	return cost
}

// inboxes maps each budgeted consumer's inbound chan (upstream's key for
// a consumer's buffer) to its inbox. The read path looks the chan up
// under the consumers' lock, so a cancelled consumer gets nothing more;
// the inbox is made by whichever comes first, the first delivery or the
// consumer's start (bufferFor), and removed when its consumer ends.
type inboxes struct {
	mu  sync.Mutex
	all map[chan *Delivery]*inbox
	// direct holds, by consumer tag, the ConsumeFuncs about to serve
	// their consumer themselves (directconsume.go).
	direct map[string]chan startedConsumer
}

// inboxOf returns in's inbox, making it if needed.
func (acct *deliveryAcct) inboxOf(in chan *Delivery, tag string) *inbox {
	ib := &acct.inboxes
	ib.mu.Lock()
	defer ib.mu.Unlock()
	if b := ib.all[in]; b != nil {
		return b
	}
	if ib.all == nil {
		ib.all = map[chan *Delivery]*inbox{}
	}
	b := &inbox{st: acct.buffers.add(acct.channel, tag), wake: make(chan struct{}, 1), closing: acct.closing}
	ib.all[in] = b
	return b
}

// forget removes in's inbox, once its consumer ended.
func (acct *deliveryAcct) forget(in chan *Delivery, b *inbox) {
	ib := &acct.inboxes
	ib.mu.Lock()
	delete(ib.all, in)
	ib.mu.Unlock()
	acct.buffers.remove(b.st)
}
