// Package failover publishes with publisher confirms, and consumes, across
// the loss of a RabbitMQ node, losing no confirmed message.
//
// A Publisher owns one connection and one channel in confirm mode at a
// time, opened by the caller's DialFunc, and replaces them when they fail.
// Publish returns nil only once the broker confirmed the message.
//
// # Guarantees
//
//   - At least once. A message whose Publish returned nil was confirmed by
//     the broker. A message published on a connection or channel that was
//     lost, abandoned or retired before its confirmation is published again
//     on the next one, with the same MessageId, and its Publish keeps
//     waiting (bounded by its ctx). So a queue may hold a message twice:
//     consumers drop duplicates by MessageId, which Publish fills in with a
//     unique value when it is empty.
//   - Nothing settled falsely. Delivery tags restart at 1 on every
//     channel. Each channel generation has its own tag-to-message map, and
//     a generation retired (its messages moved back to the queue) settles
//     nothing afterwards, whatever confirmations of its channel still
//     arrive.
//   - Bounded. At most MaxOutstanding messages are accepted and unsettled;
//     Publish blocks at the limit, bounded by its ctx. Every wait of the
//     package ends with a ctx, a timeout of the options, or the end of the
//     connection; Close returns within CloseTimeout.
//   - Errors. Publish returns nil, an error wrapping ErrNacked (nacked on
//     its last allowed attempt) or ErrGaveUp (its last allowed attempt was
//     lost with its connection), the caller's ctx error (errors.Is(err,
//     ctx.Err()); the message may or may not have been enqueued), or after
//     Close an error for which errors.Is(err, amqp.ErrClosed) holds.
//
// # The nack storm
//
// When the node hosting a quorum queue's leader dies, a channel first used
// during the leader election (under half a second) has every later publish
// nacked, thousands over tens of seconds, until the application opens a
// new channel (measured against RabbitMQ 3.10 in a three-node cluster).
// So by default a nack retires the channel: a new channel on the same
// connection takes over and every unconfirmed message of the old one,
// the nacked one included, is published again on it; confirms resume
// 0.2–0.5 s after the kill. Reopens after a nack with no confirmation
// since the previous reopen are a storm: they back off (Backoff), capped
// at a quarter of ConfirmTimeout and at 1 s, since only a new channel sees
// that the election ended, and each storm channel carries one message (a
// probe) until the broker acks one, so that a storm spends at most one
// attempt (MaxAttempts) of one message per reopen, not one of every
// unconfirmed message; and none within MaxConfirmTimeout of the first
// reopen since a confirmation, when a nack answers for the channel rather
// than the message. KeepChannelOnNack republishes on the same channel instead.
//
// # The confirm timeout
//
// A node cut off from its cluster (the minority side of a partition) keeps
// its client connections up, answers heartbeats and accepts publishes, but
// confirms nothing until the partition heals (89 s in the measurement
// above), and a Connection.Close waits for that too in upstream mode. With
// ConfirmTimeout set, a watchdog abandons the connection when the oldest
// unconfirmed message has waited that long: it closes it with
// CloseDeadline(time.Now()), which returns at once in every read mode
// (measured under 1 ms, even against a peer that reads nothing), without
// waiting for close-ok. Then it redials and republishes. Choose
// ConfirmTimeout above the worst confirm latency of a healthy cluster
// (seconds, not milliseconds), or it abandons healthy connections; a
// broker that blocks publishers (connection.blocked, a resource alarm) also
// stalls confirms, and trips it. Consecutive abandonments with no ack
// between them double the timeout in force, up to MaxConfirmTimeout (4 ×
// ConfirmTimeout by default): a quorum queue whose leader was cut off
// confirms on no node until its peers elect another, and a fixed timeout
// would abandon the next node just before it answers.
//
// # The silent channel
//
// A channel can also stay silent on a healthy node: one opened while the
// node's peers still counted a frozen node as the queue's leader confirms
// nothing after the election, where a fresh channel on the same node is
// confirmed at once (measured on RabbitMQ 3.10: 9.4 s of silence, until
// the confirm timeout abandoned the healthy node too). So the first
// channel after a failover, like a nack storm's, is a probe channel: it
// carries one message until the broker acks one. A probe that gets no
// answer, neither ack nor nack, within an eighth of ConfirmTimeout is
// replaced on the same connection within a quarter of it
// (PublisherStats.SilentReopens), and its message is not charged the
// attempt. The new channel's channel.open tells the silences apart: a node
// that answers it within a quarter of ConfirmTimeout is alive and only its
// queue is not ready yet, so the connection is kept; one that does not is
// gone, and the publisher fails over at once. The confirm timeout keeps
// counting from the message's first publish on the connection, so reopens
// that stay silent end in an abandonment as before, but at
// MaxConfirmTimeout: a silence that follows the publisher from a failed
// node to one that answers is the queue's, which the next node would
// share (a frozen leader's election took up to 9.0 s in the cluster
// suite, and the backed-off 4 s timeout abandoned a healthy node for
// another).
//
// # Which node comes next
//
// The DialFunc decides. Make it move on at each call: round robin over the
// cluster's endpoints, starting from a random one, or a shuffle. A DialFunc
// that always tries the same node first reconnects to the abandoned,
// partitioned node, which accepts the connection and stalls again. Do not
// set amqp.Config.Recovery: the package recovers by itself and refuses
// such connections (ErrRecoveryEnabled).
//
// # Read modes
//
// All read modes of amqp091-drainer work. In plain legacy mode
// (Connection.ReadMode() == "legacy") nothing reads the socket unless
// someone calls DrainEvents, so the package runs a drain loop per
// connection, which it keeps out of the socket while it writes; the loop
// ends with the connection.
//
// # Consumer
//
// Consumer (or Consume) consumes one queue with manual acks: a handler
// returning nil acks the delivery, an error nacks it with requeue. After a
// lost connection or channel it redials, applies Qos again and consumes
// again. The broker redelivers what was not acked (Redelivered set,
// counted in ConsumerStats), so handlers must be idempotent or drop
// duplicates by MessageId. A basic.cancel from the broker (its queue
// deleted, a quorum queue's consumer timeout) is no loss: the Consumer
// counts it (ConsumerStats.Cancels, EventCancelled) and consumes again on
// the same channel after Backoff's delay for the cancels in a row. A node
// that freezes (alive to TCP, silent to AMQP) ends deliveries and
// heartbeats alike; after ProbeAfter with no delivery (half the
// heartbeat) the Consumer asks it a basic.qos, and leaves a node that does
// not answer within ProbeAfter, within about one heartbeat rather than the
// heartbeat timeout's 1.5 (the cluster suite's fault 8c: 2.02 s rather
// than 3.01 s at a heartbeat of 2 s).
//
// # Not covered
//
// Mandatory publishes that come back (basic.return) are confirmed by the
// broker and so settle with nil; the package does not report returns.
// A message the broker refuses by closing the channel (an unknown
// exchange, say) retires the channel each time, and fails with ErrGaveUp
// after MaxAttempts, delaying the messages that shared its channels.
package failover
