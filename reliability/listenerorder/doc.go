// Package listenerorder proves, in every read mode (upstream, drainer,
// legacy, and legacy-autodrain, the legacy mode that the process-wide
// switch gives a library that never calls DrainEvents), the ordering guarantee that upstream amqp091-go gives by
// dispatching on its reader goroutine: for one channel, notifications reach
// their listeners in the order of the frames that carried them, across
// listeners, and a close reaches NotifyClose only after everything that
// arrived before it was handed over (issue #16, part 1).
//
// Applications rely on it without saying so. gocloud's rabbitpubsub reads
// NotifyReturn and NotifyPublish in one select loop: for a mandatory
// publish that cannot be routed the broker sends basic.return, then
// basic.ack, so once the ack is in, the return is already in its chan.
// The tests, each run per mode as Test<Pattern>/<mode>:
//
//   - TestReturnBeforeAckSelect: batches of publishes, a random mix of
//     routable ones and unroutable mandatory ones, with buffered
//     NotifyReturn and NotifyPublish listeners (capacity = batch size) read
//     by one select loop until every confirmation of the batch is in;
//     then every return of the batch must already be received or waiting
//     in its chan. A batch that falls short is a violation; the failure
//     counts them, and the returns that spilled into a later batch.
//   - TestReturnBeforeDeferredConfirm: an unroutable mandatory
//     PublishWithDeferredConfirmWithContext, then WaitContext, then a
//     non-blocking receive on a buffered NotifyReturn chan must find the
//     return.
//   - TestCancelBeforeDeliveriesClose: the broker cancels a consumer (its
//     queue is deleted from another channel); once the deliveries chan has
//     closed, a non-blocking receive on a buffered NotifyCancel chan must
//     hold the consumer tag.
//   - TestCloseAfterReturns: N unroutable mandatory publishes, then a
//     publish to an exchange that does not exist (the broker closes the
//     channel, 404). One select loop reading an unbuffered NotifyReturn
//     and NotifyClose must see all N returns before the close error.
//   - TestChannelOrderFakePeer (fake peer; RabbitMQ cannot be made to send
//     channel.flow): a long random interleaving of channel.flow,
//     basic.return and basic.ack on one channel, and connection.blocked /
//     unblocked, to unbuffered listeners read by one select loop. The
//     channel's notifications must be received in exactly the frame order
//     the peer sent, and so must the blocked ones.
//   - TestConnectionCloseAfterNotificationsFakePeer (fake peer): returns
//     and blocked/unblocked, then connection.close; every one of them is
//     received before the connection's and the channel's NotifyClose get
//     the error.
//   - TestRPCReplyBeforeConnectionCloseFakePeer (fake peer): an RPC's
//     reply and connection.close in one write; the caller gets the reply,
//     as upstream's reader hands it over before it reads the close.
//   - TestUnreadListenerStallsNobody (drainer only): with channel A's
//     NotifyReturn listener unread, channel B's RPCs and publish-and-confirm
//     round trips still complete promptly, and A's returns all arrive, in
//     order, once read. Upstream and legacy stall here by design, so the
//     subtests skip there.
//
// In legacy mode nothing reads unless the application calls in, so the
// tests pump DrainEvents from a goroutine of their own while they wait for
// notifications, as a legacy application must, and stop it before they
// write (a legacy publish waits for a blocked reader). The deferred
// confirmation pattern needs no pump: WaitContext reads by itself. In
// legacy-autodrain the connection's own drain loop reads, and a write cuts
// its read short.
//
// The package runs under a plain go test ./... (it only declares its own
// exclusive queues and does not disturb the shared broker), at the default
// sizes: thousands of batches and iterations per mode. -short shrinks
// them, and so does scripts/reliability short (make test runs the package
// at the default sizes in its go test ./... first);
// AMQP091_RELIABILITY=full (make reliability) grows them.
package listenerorder
