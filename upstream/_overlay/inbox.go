// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import "sync"

// deliveryAcct charges a channel's deliveries to its read path's budget, and keeps the channel's
// consumer inboxes. It exists only in the drainer and legacy modes (consumers.acct is nil in
// upstream's, whose consumers.buffer runs as upstream wrote it).
//
// Why deliveries are charged: a delivery waiting for its consumer is memory the broker has
// already sent. In the drainer the budget is the one at whose high mark the drainer stops
// reading the socket, so a consumer that falls behind slows the connection through TCP instead
// of growing the heap without limit. Legacy's budget has no limit (it never pauses: nothing
// reads unless the caller drives it), so there the charge only feeds Stats.
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
			subs.acct = &deliveryAcct{
				budget:  rb.deliveries,
				buffers: &rb.buffers,
				channel: id,
				obs:     rb.obs,
				closing: rb.calledC,
			}
		}
	}
	return subs
}

// deliveryCost is what a buffered delivery is charged: its body and a frame's overhead, so that
// empty bodies are not free.
func deliveryCost(d *Delivery) int64 { return frameCost + int64(len(d.Body)) }

// deliver passes d to tag's inbox (put), or drops it (Close begun, or no consumer). It runs on
// whoever hands the delivery on: the read turn's holder, or the channel's dispatcher when jobs
// wait before it. Locks: the consumers' mutex (so that a cancel cannot end the consumer between
// the lookup and the put), then inboxes.mu (inboxOf), then inbox.mu and budget.mu (put). User
// code runs under none of them: Observer.Delivered before, the watcher's warnings after.
//
// A put never waits for the consumer: it queues, or hands over only to a Consume chan ready to
// receive. That is what lets the turn's holder deliver inline: a consumer that does not read
// costs budget, not the holder's time.
func (subs *consumers) deliver(tag string, d *Delivery) {
	acct := subs.acct
	if acct.obs != nil && acct.obs.Delivered != nil {
		acct.obs.Delivered(d)
	}
	// Once Close began, the backlog can no longer be acked (#17): nobody gets it.
	if isClosing(acct.closing) {
		return
	}
	subs.Lock()
	in, found := subs.chans[tag]
	if !found { // cancelled or never started: upstream drops it too
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

// inbox is one consumer's queue, charged to the budget, in place of upstream's unbounded
// consumers.buffer. Its taker is the consumer loop (consumeloop.go), on a goroutine of its own
// for a Consume chan, or ConsumeFunc's caller.
//
// A put wakes the taker once per burst (#18): the runQueue's running flag says whether the
// taker may be parked, and only then does put leave a token in wake (cap 1). When nothing is
// queued and the Consume chan's reader is waiting, put hands the delivery straight to it (out),
// without queueing or waking anyone: order holds, since the loop sends only queued deliveries,
// and there are none.
//
// No wake-up is lost: the taker is counted as parked by the same look, under mu, that finds the
// queue empty (front or take), so a put after that look leaves a token, which waits in wake for
// the taker's select. One slot is enough: the token says only "look again", and the taker keeps
// looking until it finds the queue empty, when it counts as parked again.
type inbox struct {
	st      *bufferStat     // what Stats reads of it
	wake    chan struct{}   // a token when a put found the taker parked
	closing <-chan struct{} // closed when Close begins: no more direct hand-overs
	mu      sync.Mutex
	q       runQueue[inboxItem] // running: the taker is not parked
	// out is the Consume chan while its loop runs; nil before and after, so that no hand-over
	// follows the loop's end (the chan is closed only once out is nil again).
	out chan Delivery
}

// inboxItem is a delivery, its charge, and its arrival (monoNow), which Stats and the stall
// warning read as the oldest delivery's age.
type inboxItem struct {
	d        *Delivery
	at, cost int64
}

// put hands d to a waiting Consume chan if nothing is queued (the loop takes out only what was
// received, so order holds), else queues and charges it. queued reports the latter, for the
// watcher. A delivery handed over directly was copied into the chan, so d returns to its pool.
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
	// Charged before the taker can see it, so that its take's release never runs ahead of
	// the charge and the budget's count never dips below what is queued.
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

// attach sets the application's chan for direct hand-overs (nil: none). The consumer loop
// attaches its Consume chan before it runs and detaches it before closing the chan, so that no
// put sends on a closed chan. out is read and written under mu only, so a put that saw it set
// has sent, or given up, before attach(nil) returns.
func (b *inbox) attach(out chan Delivery) {
	b.mu.Lock()
	b.out = out
	b.mu.Unlock()
}

// front peeks at the next delivery, leaving it queued until the Consume chan takes it; when
// empty, the taker counts as parked, so the next put wakes it.
func (b *inbox) front() (inboxItem, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.q.front()
}

// take removes and returns the next delivery, uncounting it from Stats; on none, the taker
// counts as parked, as with front. The caller releases its charge from the budget.
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

// clear empties the inbox, once its consumer ended, and returns what its deliveries were
// charged, for the caller to release.
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

// inboxes maps each consumer's inbound chan, upstream's key for a consumer, to its inbox.
// Keyed by the chan, not by the tag: a tag can be reused after a cancel, and the old consumer's
// finish (forget) must not remove the new one's inbox. mu is taken under the consumers' mutex
// (deliver), and takes no other lock itself.
type inboxes struct {
	mu  sync.Mutex
	all map[chan *Delivery]*inbox
	// direct holds, by tag, the ConsumeFuncs about to serve their consumer (directconsume.go).
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
	b := &inbox{
		st:      acct.buffers.add(acct.channel, tag),
		wake:    make(chan struct{}, 1),
		closing: acct.closing,
	}
	ib.all[in] = b
	return b
}

// forget removes in's inbox, once its consumer ended, and its entry in Stats.
func (acct *deliveryAcct) forget(in chan *Delivery, b *inbox) {
	ib := &acct.inboxes
	ib.mu.Lock()
	delete(ib.all, in)
	ib.mu.Unlock()
	acct.buffers.remove(b.st)
}
