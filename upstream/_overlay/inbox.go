// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import "sync"

// A consumer's deliveries, in a read path with a budget, wait in an inbox
// between the read path and the consumer's loop (issue #18,
// consumeloop.go), which runs on the consumer's buffer goroutine or on
// its ConsumeFunc's. Upstream hands each delivery over on an unbuffered
// chan, so every delivery is a goroutine switch, and a wake-up whenever
// the buffer goroutine was parked. The read path instead appends to the
// inbox under a lock, which never waits for the application, and wakes
// the loop only when that found the inbox empty and parked: one wake-up
// per burst (the deliveries of one socket read), not one per delivery.
// The inbox also keeps each delivery's arrival, for Stats and warnings.

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
