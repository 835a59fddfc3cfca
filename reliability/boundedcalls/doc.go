// Package boundedcalls proves, against a fake AMQP peer (internal/fakepeer)
// and in every read mode (upstream, drainer, legacy, legacy-autodrain),
// that the context variants of the synchronous methods (issue #14) and the
// read modes' RPCTimeout bound every call, and that a call given up on
// costs its channel and nothing else: the late reply cannot reach another
// call, the connection stays up, and no goroutine is left.
//
// The tests, each run per mode as Test<Name>/<mode>:
//
//   - TestNeverAnswers: for each synchronous method with a reply (every
//     Channel ...WithContext method, ConsumeWithRPCContext, CloseWithContext,
//     and the Connection's ChannelWithContext, UpdateSecretWithContext and
//     CloseWithContext), a peer that answers everything but that one
//     request. The call, with a 200 ms deadline, returns within 1.5 s of it
//     with an *amqp.RPCError naming the channel that matches
//     context.DeadlineExceeded (and amqp.ErrClosed); the peer receives the
//     client's channel.close within 1.5 s of the return (connection.close
//     or the socket's close for the connection's own methods); after the
//     peer's close-ok a new channel opens and completes a basic.qos, the
//     abandoned channel reports IsClosed (its consumer's deliveries chan
//     is closed), and the connection is still open. The overrun past the
//     deadline is logged per call and summed up per mode.
//   - TestLateReplyDiscarded: the peer answers only after the caller left
//     and the client sent channel.close: a queue.declare-ok, a basic.get-ok
//     with a body of several frames, a basic.consume-ok followed by a
//     delivery, a channel.open-ok, or the close-ok of CloseWithContext;
//     then channel.close-ok, in a separate write or in the same one. The
//     connection stays up (no "unexpected command" close), and the
//     queue.declare of a new channel, then of one that reuses the abandoned
//     channel's id (channel-max 2 makes the allocator wrap onto it), each
//     get their own, distinguishable reply.
//   - TestBoundedCallsProperty and FuzzBoundedCalls(seed): four workers on
//     one connection, each on its own channel, make random calls
//     (queue.declare, queue.purge, queue.delete, basic.get, channel.open,
//     channel.close) with random deadlines of 1–50 ms or none, against a
//     peer that answers each after 0–60 ms or never, as the queue name the
//     client sends tells it; the peer echoes an id in its reply. Every call
//     returns by its deadline plus 1.5 s; every call without a deadline
//     succeeds; every call that succeeds gets its own reply; every
//     abandoned call leaves its channel closed, and the worker replaces it;
//     channel ids are released after close-ok and reused (channel-max 32);
//     the connection survives the run and Close returns. The test runs
//     fixed seeds; the fuzz target runs its seed corpus under go test and
//     new seeds under go test -fuzz.
//   - TestRPCTimeout (drainer, legacy, legacy-autodrain: upstream has no
//     such option): with RPCTimeout 200 ms, a plain QueueDeclare that gets
//     no reply returns after 200 ms (+1.5 s at most) with an *RPCError
//     matching amqp.ErrRPCTimeout and amqp.ErrClosed; the channel is
//     closed, the late reply discarded, and a new channel's QueueDeclare
//     gets its own reply.
//   - TestAbandonedChannelThenRecovery: with upstream's automatic recovery
//     on, the peer resets the connection while an abandoned channel's
//     stand-in still waits for its close-ok; recovery succeeds (a stand-in
//     left registered would fail every attempt), reopens no channel for
//     the abandoned one, and the recovered connection opens a new channel.
//     Plain legacy runs a drain loop here, since recovery needs the reset
//     read.
//
// Plain legacy runs without a drain loop: a legacy RPC reads the socket
// itself until its reply comes, so the next call reads the close-ok of an
// abandoned channel, and any late reply, before its own. legacy-autodrain
// is the legacy mode with the connection's own drain loop.
//
// Nothing here needs a broker, so the package runs under a plain go test
// ./..., in well under a minute with -race. -short and
// AMQP091_RELIABILITY=short run one property seed at fewer calls;
// AMQP091_RELIABILITY=full runs five seeds at 200 calls per worker.
package boundedcalls
