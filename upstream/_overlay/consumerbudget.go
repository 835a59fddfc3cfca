// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

// Deliveries wait in a per-consumer buffer until the application receives
// them from its Consume chan. Upstream's buffer has no bound. A read path
// with a memory budget counts each buffered delivery against it from the
// moment it is dispatched until the application takes it (or the consumer
// goes away), so that a consumer that stops reading makes the read path
// stop reading the socket instead of growing the heap.

// makeConsumers builds a channel's consumer registry, tied to the read
// path's budget when it keeps one.
func (c *Connection) makeConsumers() *consumers {
	subs := makeConsumers()
	if c != nil && c.rp != nil {
		subs.budget = c.rp.deliveryBudget()
	}
	return subs
}

// deliveryCost is what a buffered delivery is charged.
func deliveryCost(d *Delivery) int64 { return frameCost + int64(len(d.Body)) }

// bufferFor runs the buffer between the dispatcher and the application's
// chan: upstream's, or the budgeted one.
func (subs *consumers) bufferFor(in chan *Delivery, out chan Delivery) {
	if subs.budget == nil {
		subs.buffer(in, out)
		return
	}
	subs.budgetedBuffer(in, out)
}

// budgetedBuffer is upstream's buffer loop with accounting: what leaves the
// queue, handed over or dropped, is released from the budget.
func (subs *consumers) budgetedBuffer(in chan *Delivery, out chan Delivery) {
	defer close(out)
	defer subs.Done()

	inflight := in
	var queue []*Delivery
	defer func() {
		// Dropped at close, as upstream drops them.
		var cost int64
		for _, d := range queue {
			cost += deliveryCost(d)
		}
		subs.budget.release(cost)
	}()

	for delivery := range in {
		queue = append(queue, delivery)
		for len(queue) > 0 {
			select {
			case <-subs.closed:
				return
			case delivery, consuming := <-inflight:
				if consuming {
					queue = append(queue, delivery)
				} else {
					inflight = nil
				}
			case out <- *queue[0]:
				subs.budget.release(deliveryCost(queue[0]))
				queue[0] = nil // let the GC have it: see upstream's buffer
				queue = queue[1:]
			}
		}
	}
}

// deliver hands a delivery to its consumer's buffer, charged to the budget
// until the application receives it.
func (subs *consumers) deliver(tag string, d *Delivery) {
	cost := deliveryCost(d)
	subs.budget.charge(cost)
	if !subs.send(tag, d) {
		// No such consumer (cancelled with deliveries in flight): dropped,
		// as upstream drops it.
		subs.budget.release(cost)
	}
}
