// Package connfuzz fuzzes the whole patched connection, in each read mode,
// with the frames a broker sends it.
//
// FuzzConnection dials a fake broker (internal/fakepeer) in the upstream,
// legacy or drainer read mode, sets up what an application typically has
// (a channel in confirm mode, a consumer, one published message, listeners
// for every notification and a DrainEvents loop) and then lets the peer
// send arbitrary, mutated bytes where the broker's frames would be, whole
// or in slices, before it closes, resets or gracefully closes the
// connection. For every input it proves that:
//
//   - nothing panics;
//   - every call the application makes (Close, DrainEvents, waiting for a
//     confirmation, reading the delivery and notification channels) returns
//     within a generous bound: bad input never hangs the client, and Close
//     closes every listener;
//   - every error the connection reports for the input (NotifyClose,
//     Close, DrainEvents, DeferredConfirmation.WaitContext) is an
//     *amqp.Error or wraps one, as ErrClosedIntentionally does; a write,
//     such as an ack, may also fail with the socket's *net.OpError, as
//     upstream's writes do;
//   - no goroutine outlives the connection.
//
// The seeds, built with fakepeer's encoders, cover the well-formed traffic
// (deliveries in one and in several body frames, confirms, returns,
// cancels, flow, blocked, heartbeats, channel and connection close) and the
// classic malformations (truncated frames, a bad frame-end octet, an
// oversize frame, an unknown channel, frame type, class or method); more
// inputs, some of them found by the fuzzer, are in
// testdata/fuzz/FuzzConnection. Without -fuzz, go test runs the seeds and
// that corpus as a normal test.
//
// Four known behaviours are exempted, each pinned by a test of its own
// instead:
//
//   - a basic.ack or basic.nack with the multiple flag costs time linear
//     in its delivery tag in upstream and legacy mode (upstream's
//     confirms.Multiple), so a huge tag hangs the client: the fuzzer's tags
//     are capped (boundAckMultiple, TestAckMultipleIsLinearInTheTag);
//   - upstream's Close can return the *net.OpError of its own write when
//     the reader closes the socket at the same moment: tolerated in
//     upstream mode only (TestUpstreamCloseCanReturnTheWriteError);
//   - a connection.blocked or unblocked dispatched while the connection
//     shuts down on another goroutine panics upstream mode (upstream's
//     dispatch0): such inputs are skipped in that mode (mayCarryBlocked,
//     TestBlockedNotificationRacesShutdown). Legacy mode had the same crash
//     and, with more stray channel-0 methods than it buffers as replies, a
//     hang; both were fixed in legacy.go and their reproducers now check
//     the fix (TestBlockedNotificationRacesShutdown,
//     TestLegacyStrayChannelZeroMethods).
//
// The client dials with a 1 s heartbeat, because upstream's reader, parked
// on a stray channel-0 method, notices a closed socket only through a
// failed heartbeat write (TestUnexpectedChannelZeroMethodIsTakenAsAReply).
//
// The tests run only when the reliability suite is enabled; see package
// level.
package connfuzz
