// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

// Once the application has called Close, its consumers get nothing more
// (issue #17). Close waits for the broker's close-ok, which the broker
// sends only once it has worked through everything the client wrote
// before connection.close: under a publisher that saturates the socket,
// megabytes of publishes that it routes, and delivers, while Close waits.
// Upstream hands every one of those deliveries to the application until
// the teardown, and drops whatever is still buffered then. In the drainer
// and legacy modes the consumer buffers stop handing deliveries over as
// soon as Close begins, and drop them, as upstream drops the buffered ones
// at the teardown: the application gets no delivery it could no longer
// acknowledge (an ack written after connection.close is discarded, and
// the broker requeues what was unacknowledged), and the client stops
// spending the CPU that the broker needs for the backlog Close waits on.
// Nothing else changes: RPC replies, confirmations, returns and every
// other notification keep their order and reach their listeners as
// documented; a Consume chan still closes at the teardown, as upstream's.
// Upstream mode, which has no delivery budget, is upstream's. The chan
// that says Close has begun is the read path's closeIntent.calledC
// (makeConsumers), closed by an intentional Close only, never by the
// library's own close after a protocol error or by a failure.

// isClosing reports whether Close has begun; false for a nil chan.
func isClosing(closing <-chan struct{}) bool {
	select {
	case <-closing:
		return true
	default:
		return false
	}
}

// dropAfterClose runs in a consumer's buffer once Close has begun: it
// releases what the inbox holds, then drops whatever still arrives,
// without handing anything to the application, until the consumer ends
// (cancelled, or the teardown). The buffer's deferred calls then close the
// application's chan, at the teardown as upstream's. in is nil once a
// cancel closed it.
func (subs *consumers) dropAfterClose(in chan *Delivery, box *inbox) {
	acct := subs.acct
	acct.budget.release(box.clear())
	for in != nil {
		select {
		case <-subs.closed:
			return
		case <-box.wake:
			acct.budget.release(box.clear())
		case d, ok := <-in:
			if !ok {
				return
			}
			acct.budget.release(deliveryCost(d))
		}
	}
}

// cleared records that the buffer holds nothing.
func (st *bufferStat) cleared() {
	st.queued.Store(0)
	st.bytes.Store(0)
	st.oldest.Store(0)
}
