// Package soak is a bounded soak of drainer mode: publishers with
// confirms, consumers with manual acks and a churner that opens and closes
// channels at random, all through Toxiproxy, whose connections are reset
// (a real TCP RST, on either stream) at random intervals. Every worker is
// a user-style retry loop: on a lost connection it redials, and the
// publishers republish whatever was not positively confirmed.
//
// TestSoak runs 20 s at the short level and 5 minutes at the full level
// (make soak); -soak.duration overrides both and -soak.seed replays a
// fault schedule:
//
//	AMQP091_RELIABILITY=full go test -race -run TestSoak ./reliability/soak -soak.duration 30m -timeout 40m
//
// Every few seconds it samples the live heap (HeapAlloc after a GC), the
// heap in use and the goroutine count, and prints them as a table with the
// message and fault counts. It asserts that:
//
//   - the heap and the goroutines level off: the peak over the last third
//     of the run is within a generous factor and slack of the peak over
//     the middle third (see levelOff for why that catches a leak);
//   - publishing, consuming and channel churn all progress in the last
//     third;
//   - the goroutines return to their baseline after the teardown;
//   - no positively confirmed message is lost and no confirmation is left
//     unanswered (reliability/internal/ledger, as in package noloss): every
//     acked ID was delivered to a consumer or is still in the queue.
//
// TestChannelCloseDuringRecovery pins down why the churner does not use
// upstream's automatic recovery: in v1.16.0, closing a channel while its
// connection is down and recovery pending returns nil but leaves the
// channel registered, and every recovery attempt then fails on it
// (amqp.ErrClosed, 504) until MaxRetryCount is exhausted and the
// connection is closed for good. Probing a recovering churner also showed,
// in upstream's default read mode as in drainer mode, that a
// Connection.Close racing a stalled recovery can leave some channels never
// cleaned up, each leaking its watchChannel goroutine; and that each
// connection error raised while a recovery runs stalls it about 5 s,
// because the shutdown waits for the background delivery to the full
// NotifyClose chan of the recovery's own watcher.
//
// Its tests run under scripts/reliability only; see package
// reliability/internal/level.
package soak
