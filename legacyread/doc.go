// Package legacyread is the caller-drives-read mode of amqp091-drainer, as
// py-amqp, rabbitmq-c and pika's BlockingConnection read their sockets. It
// exists as the baseline that the benchmarks compare the drainer against,
// and for programs that want no background goroutines and strictly
// caller-paced reading: nothing is read that nobody asked for, so memory is
// bounded by construction.
//
// The contract, per connection:
//
//  1. No background goroutines. Nothing reads the socket or sends
//     heartbeats on its own: an idle legacy connection has no goroutine.
//     (LegacyOptions.AutoDrain, for code that never calls DrainEvents,
//     adds exactly one: a drain loop per connection generation.)
//  2. One transport lock guards the socket. A goroutine that needs a frame
//     takes the read turn, reads under the transport lock and dispatches
//     what it read, in order. An RPC caller (QueueDeclare, Channel, Close,
//     ...) sends its request, then reads and dispatches frames until its
//     reply arrives; if the goroutine holding the turn delivers the reply
//     first, it returns without ever reading. Waiters park; they never spin.
//  3. DrainEvents(ctx) reads and dispatches at least one frame, then every
//     frame already complete in the buffer, and returns nil. When ctx ends
//     first it returns ctx.Err() and keeps the partial frame for the next
//     call. Deliveries, confirms, returns, flows and cancels reach the
//     application only while someone drains: a consumer that ranges over
//     Consume's chan needs a drain loop (see the example). A ctx's
//     deadline ends a blocked read on time (it becomes the socket's read
//     deadline); a cancellation ends it within 10 ms, because a read
//     hooks its ctx's cancellation only after waiting that long.
//     Hooking costs allocations (context.AfterFunc), and under load most
//     reads end sooner, so a drain loop that makes a context per call
//     does not pay for the hook per call; once a read has waited out the
//     10 ms, reads hook at once until frames come fast again. (It was
//     1 ms; a deadline that close keeps the Go runtime waking every
//     millisecond while frames stream: docs/receiving.md.)
//  4. Publishing takes the transport lock too, as py-amqp's does: a publish
//     waits while another goroutine sits in a blocking DrainEvents. This is
//     the legacy behaviour the benchmarks measure. With
//     LegacyOptions.AutoDrain (the library's own reader, for code that
//     never calls DrainEvents) a write cuts its read short instead, and it
//     reads again once the write is done.
//  5. Heartbeats are sent and checked only while the application calls in
//     (DrainEvents, an RPC, a confirmation wait). An idle legacy connection
//     is neither kept alive nor monitored, and a broker-side close is
//     noticed at the next call. While someone reads, a broker silent for
//     1.5 heartbeat intervals (upstream's bound) ends the connection with
//     a heartbeat timeout; silence while nobody read does not count.
//  6. Close never holds the transport lock while it waits for close-ok: it
//     interrupts a blocked reader, wakes DrainEvents callers with
//     amqp.ErrClosedIntentionally, and reads its close-ok itself. It is
//     bounded by Options.CloseTimeout. Once Close has begun, consumers get
//     nothing more: what the broker delivers while Close waits for its
//     close-ok, and what is still buffered, is dropped (issue #17; see the
//     drainer package, item 10).
//  7. DeferredConfirmation.Wait and WaitContext read frames themselves, so
//     publish-and-wait works with no other goroutine.
//  8. A read error shuts the connection down; every waiter finds out on its
//     next turn.
//
// On a transport without read deadlines (a custom io.ReadWriteCloser such
// as io.Pipe), a read cannot be cut short: there the transport lock covers
// writes only, and DrainEvents honours ctx only between reads.
//
// Deliveries are decoded as in drainer mode: straight from the read
// buffer, with the body read once into the delivery's own body, so the
// reader that holds the turn makes one copy of each body, no more.
// amqp.Channel.ConsumeFunc (pooled bodies, valid only inside the handler)
// works here too, and is this mode's cheapest way to consume: it reads the
// socket itself while it waits for a delivery and nobody else is reading
// (as rabbitmq-c's amqp_consume_message does), and runs the handler on the
// same goroutine, so a consumer needs no DrainEvents loop and no goroutine
// switch per delivery. Consume's deliveries, by contrast, arrive only
// while someone calls DrainEvents.
//
// Options.RPCTimeout bounds every synchronous method for code that cannot
// pass a context (the ...WithContext methods take one in every mode); the
// caller pumps frames meanwhile, as always here. Connection.Stats counts
// bytes, frames and what waits in consumer buffers (notifications are
// handed over inline, as upstream does, so none wait), and
// Options.Observer is called from the same fast paths as in drainer mode.
// The drainer's warnings (a Logger, stall and depth warnings) have no
// counterpart: nothing here reads ahead of the application.
package legacyread

import amqp "github.com/rabbitmq/amqp091-go"

// Options tune legacy mode; the zero value is ready to use. See
// amqp.LegacyOptions.
type Options = amqp.LegacyOptions

// ReadPath returns the read path of legacy mode, for amqp.Config.ReadPath.
func ReadPath(opts Options) amqp.ReadPath { return amqp.Legacy(opts) }

// Dial is amqp.Dial in legacy mode.
func Dial(url string, opts Options) (*amqp.Connection, error) {
	return DialConfig(url, amqp.Config{}, opts)
}

// DialConfig is amqp.DialConfig in legacy mode. Every other setting of cfg
// is honoured as upstream honours it.
func DialConfig(url string, cfg amqp.Config, opts Options) (*amqp.Connection, error) {
	cfg.ReadPath = ReadPath(opts)
	return amqp.DialConfig(url, cfg)
}
