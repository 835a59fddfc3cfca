// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import "sync"

// deliveryAcct charges a channel's deliveries to its read path's budget.
type deliveryAcct struct {
	budget  *budget
	buffers *bufferSet
	channel uint16
	obs     *Observer
	closing <-chan struct{} // closed when Close begins (consumeloop.go)
	inboxes inboxes
}

// makeConsumers builds a channel's consumers, with the read path's budget.
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

// deliver passes d to tag's inbox (put), or drops it (Close begun, or no consumer).
func (subs *consumers) deliver(tag string, d *Delivery) {
	acct := subs.acct
	if acct.obs != nil && acct.obs.Delivered != nil {
		acct.obs.Delivered(d)
	}
	if isClosing(acct.closing) {
		return
	}
	subs.Lock()
	in, found := subs.chans[tag]
	if !found {
		subs.Unlock()
		return
	}
	box := acct.inboxOf(in, tag)
	queued := box.put(d, deliveryCost(d), acct.budget)
	subs.Unlock() // before the watcher, which may log (user code)
	if w := acct.buffers.watch; queued && w != nil {
		w.consumerQueued(box.st)
	}
}

// inbox is one consumer's queue: a put wakes the loop once per burst (#18).
type inbox struct {
	st      *bufferStat     // what Stats reads of it
	wake    chan struct{}   // a token when a put found the taker parked
	closing <-chan struct{} // closed when Close begins: no more direct hand-overs
	mu      sync.Mutex
	q       runQueue[inboxItem] // running: the taker is not parked
	out     chan Delivery       // the Consume chan while its loop runs; nil before and after (closed once nil again)
}

// inboxItem is a delivery, its charge, and its arrival (monoNow).
type inboxItem struct {
	d        *Delivery
	at, cost int64
}

// put hands d to a waiting Consume chan if nothing is queued (the loop takes
// out only what was received, so order holds), else queues and charges it.
func (b *inbox) put(d *Delivery, cost int64, budget *budget) (queued bool) {
	b.mu.Lock()
	if b.out != nil && len(b.q.queued()) == 0 && !isClosing(b.closing) {
		select {
		case b.out <- *d:
			b.mu.Unlock()
			recycleDelivery(d)
			return false
		default:
		}
	}
	budget.charge(cost)
	wake := b.q.put(inboxItem{d: d, at: monoNow(), cost: cost})
	b.st.moved(1, cost, b.q.queued()[0].at)
	b.mu.Unlock()
	if wake {
		select {
		case b.wake <- struct{}{}:
		default: // a token already waits
		}
	}
	return true
}

// attach sets the application's chan for direct hand-overs (nil: none).
func (b *inbox) attach(out chan Delivery) {
	b.mu.Lock()
	b.out = out
	b.mu.Unlock()
}

// front peeks at the next delivery; when empty, the next put wakes the taker.
func (b *inbox) front() (inboxItem, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.q.front()
}

// take removes and returns the next delivery; parks as front does.
func (b *inbox) take() (inboxItem, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	it, ok := b.q.front()
	if ok {
		b.q.drop()
		var oldest int64
		if rest := b.q.queued(); len(rest) > 0 {
			oldest = rest[0].at
		}
		b.st.moved(-1, -it.cost, oldest)
	}
	return it, ok
}

// clear empties the inbox and returns what its deliveries were charged.
func (b *inbox) clear() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var cost int64
	for it, ok := b.q.front(); ok; it, ok = b.q.front() { // the last front resets the slice
		cost += it.cost
		b.q.drop()
	}
	b.st.queued.Store(0) // Stats: it holds nothing
	b.st.bytes.Store(0)
	b.st.oldest.Store(0)
	return cost
}

// inboxes maps each consumer's inbound chan to its inbox.
type inboxes struct {
	mu     sync.Mutex
	all    map[chan *Delivery]*inbox
	direct map[string]chan startedConsumer // by tag: ConsumeFuncs about to serve their consumer (directconsume.go)
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
