// Package drainer is the dedicated-drainer read mode of amqp091-drainer: one
// goroutine per connection owns the socket read, so no goroutine ever
// queues behind another's blocking read, and the read never waits for user
// code.
//
// The contract, per connection:
//
//  1. Ownership. Exactly one drainer goroutine owns the socket read. It
//     starts when the connection opens, and again after each successful
//     Reconnect once the previous one has exited. Close stops it. It may
//     lend the read to a ConsumeFunc that waits with nothing queued (see
//     Pooled consumption), and takes it back about 10 ms into that
//     handler running long, and at once when anyone waits for a reply or a
//     confirm; one goroutine reads at a time, and the rest of this
//     contract holds whoever reads.
//  2. It never blocks on user code. Notifications (NotifyPublish,
//     NotifyReturn, NotifyFlow, NotifyCancel, NotifyBlocked) are queued per
//     channel (and for the connection), and delivered by a short-lived
//     goroutine, or by the dispatcher itself when every listener has room;
//     none is dropped while the listener is open (upstream drops one after
//     5 s). Replies that need a network write (close-ok, flow-ok,
//     cancel-ok) are written by the channel's dispatcher, never by the
//     drainer.
//  3. Upstream's order between listeners. The notifications of one channel
//     reach their listeners in the order their frames arrived, across
//     listeners, as upstream's reader hands each over before it reads the
//     next frame: a listener is never handed notification n+1 of its
//     channel before notification n was handed to its own listener. So a
//     basic.return is in the NotifyReturn chan before the basic.ack of the
//     same message reaches NotifyPublish or settles its
//     DeferredConfirmation; NotifyCancel holds the consumer tag before the
//     deliveries chan closes; and NotifyClose gets a channel's or the
//     connection's close, and the listener chans close, only after
//     everything before it was handed over. An unread listener therefore
//     holds back its own channel's later notifications, counted by the
//     budget, and nothing else: the drainer reads on, other channels go on,
//     and RPC replies, which are not notifications, reach their callers at
//     once. A close waits for an unread listener Options.CloseTimeout at
//     most; then what it held is dropped.
//  4. Bounded memory. What waits for users (queued frames, notifications,
//     deliveries not yet received from a Consume chan) counts against a
//     budget (Options.Budget, 64 MiB by default); over it the drainer stops
//     reading the socket, which is TCP backpressure, and resumes below half
//     of it, still sending heartbeats while paused.
//  5. Frames. It reads whatever is available into its own buffer and
//     dispatches complete frames only; a read deadline in the middle of a
//     frame keeps the partial bytes. An oversized or malformed frame closes
//     the connection with a FrameError (501) that says what was wrong.
//  6. Heartbeats in the same loop. Read deadlines double as the timer; a
//     heartbeat goes out only when nothing else was written in the
//     interval, and never by waiting for the write lock. The duty rides on
//     the wake-up of an arriving frame once half an interval has passed,
//     and a deadline forces it after 1.5 intervals (0.75 × the negotiated
//     heartbeat), so an idle connection wakes once per broker heartbeat,
//     not twice. A broker silent for 1.5 × the negotiated heartbeat is
//     declared dead.
//  7. All waiters are released together, each with the same *amqp.Error:
//     RPC callers on every channel, DrainEvents callers, DeferredConfirmation
//     waiters (nacked), consumers (their chans close) and NotifyClose
//     listeners. An RPC whose reply arrived before the end gets its reply,
//     as upstream's caller does.
//  8. Intentional close. Waiters blocked when Close is called get
//     amqp.ErrClosedIntentionally: errors.Is(err, amqp.ErrClosed) holds,
//     and it is not Recoverable, so recovery does not redial.
//  9. Bounded close. If the broker does not answer close-ok within
//     Options.CloseTimeout (5 s by default), the socket is closed, which
//     also frees a publisher blocked in a write.
//  10. Bounded calls, on request. Options.RPCTimeout (off by default)
//     bounds every synchronous method for code that cannot pass a
//     context; the ...WithContext methods take one in every mode. An
//     abandoned call closes its channel (see docs/bounded-calls.md).
//  11. Nothing more for consumers once Close has begun. The broker answers
//     connection.close only after the publishes written before it, which
//     it routes and may deliver while Close waits; those deliveries, and
//     any still buffered, are dropped, never handed to the application
//     (upstream hands them over until its teardown, and drops the rest
//     there). With auto-ack they are lost as upstream's dropped ones are;
//     unacknowledged ones are requeued by the broker. Confirmations,
//     returns and every other notification are unaffected.
//
// Consequences to know:
//
//   - Backpressure is per connection. When a consumer stops reading and the
//     budget fills, the drainer stops reading the whole socket, so replies
//     and confirms for other channels of that connection wait too (the
//     heartbeats do not). Give a publisher that must not wait on a slow
//     consumer its own connection, as RabbitMQ advises anyway.
//   - A NotifyClose listener gets the close error only if it has room for
//     it when the channel or connection closes, as upstream: make it with a
//     buffer of 1. The other listeners may be unbuffered and slow.
//   - A heartbeat is written with a write deadline of one interval, and only
//     when nobody else is writing. Over TLS, a write that hits its deadline
//     leaves the TLS connection unusable (crypto/tls), so a broker that
//     stops reading for a whole heartbeat interval on an otherwise idle TLS
//     connection ends it.
//
// Use it by dialling through this package, or by setting
// amqp.Config.ReadPath to ReadPath(opts):
//
//	conn, err := drainer.Dial("amqp://guest:guest@127.0.0.1:5672/", drainer.Options{})
//	// conn.ReadMode() == "drainer"
//
// # Receiving
//
// The drainer decodes the frames of a delivery straight from its read
// buffer and reads the body frames directly into the body of the
// delivery, sized once from the content header: the body the application
// receives is the only copy made. A steady consumer costs one allocation
// per message, its body (the *amqp.Delivery is pooled once the Consume
// chan took its copy), where upstream costs 26 and copies the body twice
// (BenchmarkDeliver in benchmarks/micro).
//
// # Pooled consumption (opt-in)
//
// ConsumeFunc (amqp.Channel.ConsumeFunc) calls a handler per delivery
// instead of filling a chan, and recycles each body through a
// size-classed pool when the handler returns, which removes the body's
// allocation too. THE BODY, AND THE *amqp.Delivery, ARE VALID ONLY INSIDE
// THE HANDLER: copy what must outlive it (bytes.Clone(d.Body), kept :=
// *d). In tests, set amqp.ConsumeFuncOptions.PoisonRecycled: every body
// is then overwritten with amqp.PoisonByte as its handler returns, and
// never reused, so a body kept too long always reads as poison (and the
// race detector reports a goroutine still reading it). Without it, such a
// body would read another message's bytes, now and then. There is no chan
// in between: the ConsumeFunc goroutine takes every delivery the drainer
// has queued for its consumer per wake-up, where a Consume chan wakes its
// reader once per delivery. While deliveries stream and it waits with
// nothing queued, it reads the socket itself (leader/follower): it decodes
// inline and runs its deliveries with no goroutine hop, and frames for
// everything else are routed as the drainer routes them.
//
// # Blocking reads (opt-in)
//
// BlockingDialer, set as amqp.Config.Dial (or compat.WithBlockingRead),
// reads the socket with blocking read(2) on the reading goroutine's own
// thread instead of through Go's network poller. A read that finds the
// socket empty then sleeps in the kernel and wakes when bytes arrive,
// where the poller parks the goroutine and wakes it through another
// thread. In the drain benchmark it cut the drainer's CPU per delivery by
// 45% with a Consume chan and 28% with ConsumeFunc (docs/benchmarking.md). The price is an OS thread per connection, idle
// or not: worth it for a few busy connections, not for thousands of idle
// ones, and capped at MaxBlockingConns per process. Heartbeats, deadlines,
// TLS, recovery and the bounded Close all hold (Close ends a blocked read
// with shutdown(2)); legacy mode, which cuts reads short for writers,
// cannot use it.
//
// # What it holds, and warnings
//
// Connection.Stats returns, from any goroutine, the bytes and frames in
// and out, the budget's limit, use and pauses, and what waits for each
// listener (by channel and kind: NotifyPublish, NotifyReturn, ...) and
// each consumer: how many, how many bytes, and how old the oldest is.
// Options.Logger (a *slog.Logger; nil is silent) gets a warning when one
// listener or consumer holds more than Options.DepthWarning of the budget
// (25 %) or has left its oldest item unread for Options.StallWarning
// (5 s), at most once per listener per Options.WarnInterval (30 s), and
// one when the drainer pauses for the budget (naming the biggest holder)
// and when it reads again. Options.DropStalledListener, off by default,
// closes a listener that has left a notification unread that long and
// drops what was queued for it, so that the connection goes on; the
// default never drops. Options.Observer (an *amqp.Observer) is called
// from the fast paths; the otelamqp and promamqp modules of this
// repository are Observers for OpenTelemetry and Prometheus.
package drainer

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Options tune drainer mode; the zero value is ready to use. See
// amqp.DrainerOptions for each field.
type Options = amqp.DrainerOptions

// ReadPath returns the read path of drainer mode, for amqp.Config.ReadPath.
func ReadPath(opts Options) amqp.ReadPath { return amqp.Drainer(opts) }

// Dial is amqp.Dial in drainer mode.
func Dial(url string, opts Options) (*amqp.Connection, error) {
	return DialConfig(url, amqp.Config{}, opts)
}

// DialConfig is amqp.DialConfig in drainer mode. Every other setting of cfg,
// recovery included, is honoured as upstream honours it.
func DialConfig(url string, cfg amqp.Config, opts Options) (*amqp.Connection, error) {
	cfg.ReadPath = ReadPath(opts)
	return amqp.DialConfig(url, cfg)
}

// ConsumeFunc is ch.ConsumeFunc: it consumes queue by calling handler for
// each delivery, on the calling goroutine, until ctx ends, handler returns
// an error, the channel closes or the broker cancels the consumer. Bodies
// come from a pool and are recycled when handler returns: d and d.Body
// must not be used after it. See amqp.Channel.ConsumeFunc for the whole
// contract.
func ConsumeFunc(ctx context.Context, ch *amqp.Channel, queue string, opts amqp.ConsumeFuncOptions, handler func(d *amqp.Delivery) error) error {
	return ch.ConsumeFunc(ctx, queue, opts, handler)
}
